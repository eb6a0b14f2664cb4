"""A model's VRAM need from its files: the GGUF header reader (checked against the gguf package's own reader), the
estimate's parts for llama.cpp's args, safetensors headers with config.json, and every corrupt or hostile header
refused with the file's name. Where it fits: tests/fast/orchestra/test_vram_lab.py; against the real llama-server: test_vram_llamacpp.py."""

from __future__ import annotations

import pytest

from agents.orchestra.weights.gguf_header import read_gguf_header
from agents.orchestra.weights.vram import (
    estimate_gguf,
)
from tests.support.vram_tiny import (
    KV_WIDTH,
    LAYERS,
)


@pytest.mark.parametrize(
    ("args", "cells"),
    [
        ([], 512),  # the training context (its -c default)
        (["-c", "0"], 512),
        (["-c", "1000"], 1024),  # rounded up to 256
        (["--ctx-size=1000", "-np", "3"], 3 * 512),  # each of 3 slots: 333 rounded up to 512
        (["-c", "1000", "-np", "3", "--kv-unified"], 1024),  # one cache for all slots
        (["-c", "4096", "--parallel", "4"], 4096),
    ],
)
def test_the_kv_cache_is_the_cells_llama_server_allocates_for_its_args(tiny, args, cells):
    estimate = estimate_gguf(read_gguf_header(tiny()), args)
    assert estimate.kv == LAYERS * cells * 2 * KV_WIDTH * 2  # K and V, f16
    assert f"{cells} tokens of f16 cache" in estimate.words()
