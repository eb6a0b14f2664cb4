"""A model's VRAM need from its files: the GGUF header reader (checked against the gguf package's own reader), the
estimate's parts for llama.cpp's args, safetensors headers with config.json, and every corrupt or hostile header
refused with the file's name. Where it fits: tests/fast/orchestra/test_vram_lab.py; against the real llama-server: test_vram_llamacpp.py."""

from __future__ import annotations

import json
import os
import struct

import gguf
import pytest

from agents.orchestra.weights.gguf_header import GGML_TYPES, GgufError, read_gguf_header
from agents.orchestra.weights.safetensors_header import safetensors_weights
from agents.orchestra.weights.vram import (
    CUDA_CONTEXT_BYTES,
    VLLM_OVERHEAD_BYTES,
    estimate_files,
    estimate_gguf,
    gguf_weights_bytes,
    vram_need,
)
from agents.wire.lab.model import Model
from agents.wire.vram_fit import GIB, gpu_ranges, where_fits
from tests.support.vram import (
    N_VOCAB,
    gguf_bytes,
    gguf_string,
    kv_u32,
    safetensors_model,
    tensor_info,
)
from tests.support.vram_tiny import (
    EMBED,
    FFN,
    HEADS,
    KV_WIDTH,
    LAYERS,
)


def test_the_type_table_is_the_one_of_llama_cpps_own_reader():
    assert GGML_TYPES == {t.value: sizes for t, sizes in gguf.GGML_QUANT_SIZES.items()}


@pytest.mark.parametrize("weight_type", ["f32", "f16", "q8_0", "q4_0"])
def test_the_weights_are_each_tensors_bytes_by_its_type_as_the_gguf_package_reads_them(tiny, weight_type):
    path = tiny(weight_type)
    header = read_gguf_header(path)
    theirs = gguf.GGUFReader(str(path))
    assert {t.name: t.n_bytes for t in header.tensors} == {t.name: int(t.n_bytes) for t in theirs.tensors}
    assert {t.name: t.ggml_type for t in header.tensors} == {t.name: int(t.tensor_type) for t in theirs.tensors}
    assert header.array_lengths["tokenizer.ggml.tokens"] == N_VOCAB
    assert header.data_offset == theirs.data_offset
    expected_type = {"f32": 0, "f16": 1, "q8_0": 8, "q4_0": 2}[weight_type]
    assert header.tensors[0].ggml_type == expected_type  # token_embd: a matrix in the asked type
    if weight_type != "f32":
        assert gguf_weights_bytes(header) < gguf_weights_bytes(read_gguf_header(tiny("f32")))


def test_a_quantized_kv_cache_takes_its_types_bytes(tiny):
    header = read_gguf_header(tiny())
    q8 = estimate_gguf(header, ["-c", "1024", "-ctk", "q8_0", "--cache-type-v", "q8_0"])
    assert q8.kv == LAYERS * 1024 * 2 * (KV_WIDTH // 32 * 34)
    mixed = estimate_gguf(header, ["-c", "1024", "-ctk", "q4_0"])
    assert mixed.kv == LAYERS * 1024 * (KV_WIDTH // 32 * 18 + KV_WIDTH * 2)
    assert "K q4_0, V f16" in mixed.words()


def test_offloading_fewer_layers_counts_only_what_is_on_the_gpu(tiny):
    header = read_gguf_header(tiny())
    sizes = {t.name: t.n_bytes for t in header.tensors}
    layer1 = sum(n for name, n in sizes.items() if name.startswith("blk.1."))
    full = estimate_gguf(header, ["-ngl", "99"])
    assert full.weights == sum(sizes.values()) - sizes["token_embd.weight"]  # the input embedding stays in RAM
    one = estimate_gguf(header, ["-ngl", "1"])
    assert one.weights == layer1  # the last layer; the output layer only when every layer is offloaded
    assert one.kv == full.kv // LAYERS
    none = estimate_gguf(header, ["--n-gpu-layers", "0"])
    assert none.weights == 0 and none.kv == 0
    assert "1 of 2 layers" in one.words()


def test_the_compute_buffer_is_the_mask_and_the_largest_phase_and_every_gpu_adds_its_context(tiny):
    header = read_gguf_header(tiny())
    mask, feed_forward = 2 * 512 * 512, 4 * 512 * (3 * FFN + 4 * EMBED)  # f16 over 512 cells; gate, up, product
    one = estimate_gguf(header, [])
    assert one.compute == mask + feed_forward
    assert estimate_gguf(header, ["-c", "4096"]).compute == 8 * mask + feed_forward  # the mask spans the context
    assert estimate_gguf(header, ["-ub", "128"]).compute == (mask + feed_forward) // 4
    no_flash = estimate_gguf(header, ["-fa", "off"]).compute
    assert no_flash == 4 * 512 * 512 + 4 * 512 * (512 * HEADS + 7 * EMBED)  # f32 mask and every head's scores
    two = estimate_gguf(header, [], n_gpus=2)
    assert two.overhead == 2 * CUDA_CONTEXT_BYTES and two.compute == 2 * one.compute and two.weights == one.weights
    assert one.total == one.weights + one.kv + one.compute + one.overhead


def test_vram_gib_in_lab_yaml_wins_and_a_missing_file_is_unknown_and_said(tiny, tmp_path):
    path = tiny()
    typed = Model(name="a", path=str(path), engine="llamacpp", machine="box", gpus=[0], vram_gib=3)
    assert vram_need(typed, path).bytes == 3 * GIB and vram_need(typed, path).source == "lab.yaml"
    left_out = Model(name="b", path=str(path), engine="llamacpp", machine="box", gpus=[0], args=["-c", "1024"])
    need = vram_need(left_out, path)
    expected = estimate_gguf(read_gguf_header(path), ["-c", "1024"])
    assert (need.bytes, need.source) == (expected.total, "estimated from GGUF header")
    assert need.detail == expected.words()
    missing = vram_need(left_out, tmp_path / "gone.gguf")
    assert missing.bytes is None and missing.source == "unknown" and "missing" in missing.detail
    assert not missing.unreadable  # the doctor's engine check says a path is missing; this is no second warning
    other = tmp_path / "weights"
    other.mkdir()
    (other / "model.bin").write_bytes(b"\0" * 64)
    assert "no GGUF file, nor safetensors" in vram_need(left_out, other).detail


def test_the_estimate_is_cached_by_the_files_size_and_mtime(tiny):
    path = tiny()
    first = estimate_files(path, [], 1)
    assert estimate_files(path, [], 1) is first
    quantized = tiny("q8_0")
    os.replace(quantized, path)  # another file under the same name: another size and mtime
    again = estimate_files(path, [], 1)
    assert again is not first and again.bytes is not None and first.bytes is not None and again.bytes < first.bytes


def test_a_safetensors_folder_is_its_headers_weights_plus_one_sequence_of_kv_cache(tmp_path):
    folder, weights = safetensors_model(tmp_path / "llama", layers=2, hidden=64, heads=4, kv_heads=2)
    shards = sorted(folder.glob("*.safetensors"))
    assert sum(safetensors_weights(s) for s in shards) == weights
    need = estimate_files(folder, [], 1)
    kv = 2 * 2 * 2 * 16 * 4096 * 2  # K and V, layers, kv heads, head_dim, max_position_embeddings, bf16
    assert (need.bytes, need.source) == (weights + kv + VLLM_OVERHEAD_BYTES, "estimated from safetensors header")
    shorter = estimate_files(folder, ["--max-model-len", "1024", "--kv-cache-dtype", "fp8"], 2)
    assert shorter.bytes == weights + kv // 4 // 2 + 2 * VLLM_OVERHEAD_BYTES
    assert "one sequence of 1024 tokens" in shorter.detail


# ---------------------------------------------------------------------------- refused cleanly

STR = 8


def hostile_ggufs(tiny_bytes: bytes) -> dict[str, tuple[bytes, str]]:
    huge = 1 << 62
    return {
        "empty": (b"", "past the end"),
        "not a gguf": (b"GGML" + b"\0" * 60, "does not start with GGUF"),
        "version": (gguf_bytes(version=99), "version 99"),
        "tensor count": (b"GGUF" + struct.pack("<IQQ", 3, huge, 0), "tensor count"),
        "kv count": (b"GGUF" + struct.pack("<IQQ", 3, 0, huge), "key-value count"),
        "key length": (gguf_bytes(kv=[struct.pack("<Q", huge)]), "the length of a key"),
        "string length": (gguf_bytes(kv=[gguf_string(b"general.name") + struct.pack("<IQ", STR, huge)]), "general.name"),
        "string past the end": (gguf_bytes(kv=[gguf_string(b"general.name") + struct.pack("<IQ", STR, 1 << 20)]), "past the end"),
        "array count": (gguf_bytes(kv=[gguf_string(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, STR, huge)]), "length of"),
        "array item": (
            gguf_bytes(kv=[gguf_string(b"tokenizer.ggml.tokens") + struct.pack("<IIQQ", 9, STR, 2, huge)]),
            "tokenizer.ggml.tokens[0]",
        ),
        "value type": (gguf_bytes(kv=[gguf_string(b"x") + struct.pack("<I", 77)]), "unknown value type 77"),
        "not utf-8": (gguf_bytes(kv=[gguf_string(b"\xff\xfe") + struct.pack("<II", 4, 1)]), "not UTF-8"),
        "alignment": (gguf_bytes(kv=[kv_u32(b"general.alignment", 3)]), "power of two"),
        "dims": (gguf_bytes(1, kv=[], tensors=[tensor_info(b"w", [1] * 9)]), "9 dimensions"),
        "ggml type": (gguf_bytes(1, kv=[], tensors=[tensor_info(b"w", [32], ggml_type=200)]), "ggml type 200"),
        "block": (gguf_bytes(1, kv=[], tensors=[tensor_info(b"w", [33], ggml_type=8)]), "multiple of 32"),
        "huge tensor": (gguf_bytes(1, kv=[], tensors=[tensor_info(b"w", [1 << 40, 1 << 40])]), "larger than the file"),
        "tensor past the data": (gguf_bytes(1, kv=[], tensors=[tensor_info(b"w", [64])]) + b"\0" * 64, "runs past the end"),
        "truncated header": (tiny_bytes[:200], "past the end"),
        "truncated data": (tiny_bytes[: len(tiny_bytes) // 2], "truncated"),
    }


def test_a_corrupt_truncated_or_hostile_gguf_is_a_clear_error_naming_the_file(tiny, tmp_path):
    for name, (content, said) in hostile_ggufs(tiny().read_bytes()).items():
        path = tmp_path / f"{name.replace(' ', '-')}.gguf"
        path.write_bytes(content)
        with pytest.raises(GgufError) as caught:
            read_gguf_header(path)
        assert str(path) in str(caught.value) and said in str(caught.value), (name, str(caught.value))
        need = estimate_files(path, [], 1)  # what the agent and the doctor see: unknown, and why
        assert need.bytes is None and need.unreadable and str(path) in need.detail, name


def test_a_fifo_is_never_opened_for_reading(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    need = estimate_files(fifo, [], 1)
    assert need.bytes is None and need.unreadable and "not a regular file" in need.detail


def test_a_corrupt_or_hostile_safetensors_header_is_a_clear_error_naming_the_shard(tmp_path):
    good = {"w": {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 8]}}
    cases = {
        "short": (b"\0" * 7, "shorter than"),
        "huge header": (struct.pack("<Q", 1 << 60) + b"{}", "header in a"),
        "not json": (struct.pack("<Q", 5) + b"{nope" + b"\0" * 8, "not JSON"),
        "a list": (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        "offsets": (b"", "not within"),
        "shape": (b"", "its offsets say"),
    }
    bad_offsets = json.dumps({"w": {**good["w"], "data_offsets": [0, 1 << 40]}}).encode()
    bad_shape = json.dumps({"w": {**good["w"], "shape": [4, 4]}}).encode()
    cases["offsets"] = (struct.pack("<Q", len(bad_offsets)) + bad_offsets + b"\0" * 8, "not within")
    cases["shape"] = (struct.pack("<Q", len(bad_shape)) + bad_shape + b"\0" * 8, "its offsets say")
    for name, (content, said) in cases.items():
        folder = tmp_path / name.replace(" ", "-")
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"num_hidden_layers": 1, "num_attention_heads": 1, "hidden_size": 8}))
        (folder / "model.safetensors").write_bytes(content)
        need = estimate_files(folder, [], 1)
        assert need.bytes is None and need.unreadable, name
        assert str(folder / "model.safetensors") in need.detail and said in need.detail, (name, need.detail)


# ---------------------------------------------------------------------------- where it fits


def test_where_a_need_fits_one_gpu_a_split_or_nowhere():
    lab = {"m5": {0: 8 * GIB, 1: 24 * GIB, 2: 24 * GIB, 3: 24 * GIB, 4: 24 * GIB}, "irina": {0: 48 * GIB}, "cpu": {}}
    assert where_fits(20 * GIB, lab) == "fits on irina GPU 0, m5 GPU 1-4"
    assert where_fits(60 * GIB, lab) == "needs 60.0 GiB: no single GPU; split over m5 GPU 1-3"
    assert where_fits(90 * GIB, lab) == "needs 90.0 GiB: no single GPU; split over m5 GPU 1-4"
    assert where_fits(200 * GIB, lab).startswith("needs 200.0 GiB: more than any machine's GPUs together")
    assert where_fits(None, lab) == ""
    assert "no machine has reported its GPUs" in where_fits(GIB, {"cpu": {}})
    assert gpu_ranges([6, 1, 2, 3, 4, 9, 10]) == "1-4,6,9,10"


def test_a_vocabulary_longer_than_a_read_is_walked_over_to_the_keys_after_it(tmp_path):
    path = tmp_path / "vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    tokens = [f"token-{i:07d}" * (1 + i % 3) for i in range(200_000)]  # ~4 MB: past several 1 MiB reads
    writer.add_array("tokenizer.ggml.tokens", tokens)
    writer.add_uint32("llama.block_count", 7)
    writer.add_string("general.name", "after the vocabulary")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = read_gguf_header(path)
    assert header.array_lengths["tokenizer.ggml.tokens"] == len(tokens)
    assert header.kv["llama.block_count"] == 7 and header.kv["general.name"] == "after the vocabulary"
