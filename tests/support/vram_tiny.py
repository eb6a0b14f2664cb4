"""What tests/e2e/orchestra/test_vram.py, tests/fast/orchestra/test_vram.py share: EMBED,LAYERS,HEADS,HEADS_KV,FFN,
KV_WIDTH, tiny."""

from __future__ import annotations

import pytest

from agents.orchestra.engines.llamacpp.tiny_gguf import write_tiny_gguf
from tests.support.vram import (
    fake_vocab,
)

EMBED, LAYERS, HEADS, HEADS_KV, FFN = 64, 2, 4, 2, 128


KV_WIDTH = EMBED // HEADS * HEADS_KV  # n_head_kv x head_dim: one token's K (and V) in one layer


@pytest.fixture
def tiny(tmp_path):
    """write_tiny_gguf's model with grouped-query attention, in the weight type asked for."""

    def make(weight_type: str = "f32", context: int = 512):
        out = tmp_path / f"tiny-{weight_type}-{context}.gguf"
        return write_tiny_gguf(out, fake_vocab(tmp_path), heads_kv=HEADS_KV, weight_type=weight_type, context=context)

    return make
