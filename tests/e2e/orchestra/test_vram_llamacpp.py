"""The GGUF estimate against the real llama-server: its log's own buffer sizes for the weights ("model buffer size"),
the KV cache ("KV buffer size") and the compute graph ("compute buffer size"), for tiny models written here with a
context, grouped-query heads and a quantized weight type, under the args that change them (-c, -np, -ctk/-ctv).

Tolerances: the weights and the KV cache are allocated tensor by tensor, so they agree to within 1% (alignment
padding); the compute buffer is a rule fitted to llama.cpp's allocator (agents/orchestra/weights/vram.py compute_bytes), so
within 25% of llama-server's own figure (wider models: within 1%; the tiniest it overestimates by a quarter MiB) (a CPU build: the graph a GPU would run; the CUDA context is not in it)."""

from __future__ import annotations

import queue
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from agents.orchestra.engines.llamacpp import build as llamacpp_build
from agents.orchestra.engines.llamacpp.tiny_gguf import write_tiny_gguf
from agents.orchestra.weights.gguf_header import read_gguf_header
from agents.orchestra.weights.vram import MIB, estimate_gguf, gguf_weights_bytes
from agents.shell.demo.lab import free_ports
from tests.support.llamacpp import llama_server_or_skip

pytestmark = pytest.mark.timeout(300)


BUFFER = re.compile(r"\b(\S+)\s+(model|KV|compute) buffer size =\s+([\d.]+) MiB")


LOAD_DEADLINE_S = 120.0


CASES = {
    "f32, -c 1024, one slot": ({"weight_type": "f32", "context": 512}, ["-c", "1024", "-np", "1"]),
    "q8_0, GQA, two slots of a q8_0 cache": (
        {"weight_type": "q8_0", "context": 2048, "heads_kv": 2, "embed": 128},  # a q8_0 cache needs 32-wide heads
        ["-c", "2048", "-np", "2", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on", "--no-repack"],
    ),
    "f16, the training context by default": ({"weight_type": "f16", "context": 1024, "heads_kv": 2}, []),
    "wider, no flash attention": ({"embed": 512, "ffn": 2048}, ["-c", "4096", "-np", "1", "-fa", "off"]),
    "wider, a long context": ({"embed": 512, "ffn": 2048, "weight_type": "q4_0"}, ["-c", "16384", "--no-repack"]),
    "an embedding model": ({"embed": 256, "ffn": 1024, "serves": "embedding"}, ["-c", "1024", "--embedding"]),
}


def buffer_sizes(binary: Path, model: Path, args: list[str]) -> dict[str, float]:
    """llama-server's buffer sizes by kind (model, KV, compute) in MiB, summed over its buffers, read from its log as it
    loads; it is stopped once it has said all three (or ended)."""
    (port,) = free_ports(1)
    # --fit off: llama-server's own dry run to fit the args to free memory would move what is compared
    # -lv 4: llama.cpp's own lines (the buffer sizes among them) are below llama-server's default verbosity
    argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", "2", "--fit", "off", "-lv", "4"]
    argv += args
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    buffers: dict[tuple[str, str], float] = {}  # (kind, buffer) -> MiB: CPU_Mapped and CPU_REPACK are both weights
    log: list[str] = []
    deadline = time.monotonic() + LOAD_DEADLINE_S
    try:
        while not {"model", "KV", "compute"} <= {kind for kind, _ in buffers}:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line is None:
                break
            log.append(line)
            for match in BUFFER.finditer(line):
                buffers[(match.group(2), match.group(1))] = float(match.group(3))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    sizes: dict[str, float] = {}
    for (kind, _), mib in buffers.items():
        sizes[kind] = sizes.get(kind, 0.0) + mib
    assert {"model", "KV", "compute"} <= sizes.keys(), "llama-server never said its buffer sizes:\n" + "".join(log[-40:])
    return sizes


@pytest.mark.parametrize("case", list(CASES))
def test_the_gguf_estimate_agrees_with_llama_servers_own_buffer_sizes(tmp_path, case):
    binary = llama_server_or_skip()
    vocab = llamacpp_build.vocab_file()
    assert vocab is not None
    shape, args = CASES[case]
    model = write_tiny_gguf(tmp_path / "tiny.gguf", vocab, **shape)  # type: ignore[arg-type]
    header = read_gguf_header(model)
    estimate = estimate_gguf(header, args)
    real = buffer_sizes(binary, model, args)
    weights, kv, compute = gguf_weights_bytes(header) / MIB, estimate.kv / MIB, estimate.compute / MIB
    said = f"{case}: estimate weights {weights:.2f} KV {kv:.2f} compute {compute:.2f} MiB; llama-server {real}"
    print(said)
    assert real["model"] == pytest.approx(weights, rel=0.01, abs=0.02), said
    assert real["KV"] == pytest.approx(kv, rel=0.01, abs=0.02), said
    assert real["compute"] == pytest.approx(compute, rel=0.25), said
