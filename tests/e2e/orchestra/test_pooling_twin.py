"""sim-llamacpp's /v1/embeddings and /v1/rerank mean what the pinned llama-server's mean: one request matrix against
both, each started with --embedding or --reranking on a tiny GGUF written here (a mean-pooled Llama, a Qwen3 with a
rank head), comparing what each answer means (status, error type, how many vectors and in which order, their
encoding, how many results, best first, the usage fields), never the numbers themselves."""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import Any

import pytest

from agents.orchestra.engine import free_port
from agents.orchestra.engines.llamacpp import build as llamacpp_build
from agents.orchestra.engines.llamacpp.tiny_gguf import write_tiny_gguf
from tests.support.llamacpp import llama_server_or_skip
from tests.support.llamacpp_twin import post, start

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


EMBED, RERANK, CHAT = "/v1/embeddings", "/v1/rerank", "/v1/chat/completions"


DOCS = ["the cat sat on the mat", "stock prices fell", "a cat and a mat"]


MATRIX: list[tuple[str, str, str, Any]] = [
    ("one text", "embedding", EMBED, {"input": "hello there"}),
    ("texts", "embedding", EMBED, {"input": DOCS}),
    ("token lists", "embedding", EMBED, {"input": [[1, 2, 3], [4, 5]]}),
    ("base64", "embedding", EMBED, {"input": DOCS, "encoding_format": "base64"}),
    ("bad encoding", "embedding", EMBED, {"input": "a", "encoding_format": "hex"}),
    ("dimensions ignored", "embedding", EMBED, {"input": "a", "dimensions": 4}),
    ("no input", "embedding", EMBED, {}),
    ("empty input", "embedding", EMBED, {"input": []}),
    ("rerank on an embedding server", "embedding", RERANK, {"query": "a", "documents": ["b"]}),
    ("ranked", "rerank", RERANK, {"query": "cat on the mat", "documents": DOCS}),
    ("top_n", "rerank", RERANK, {"query": "cat", "documents": DOCS, "top_n": 2}),
    ("top_n 0", "rerank", RERANK, {"query": "cat", "documents": DOCS, "top_n": 0}),
    ("return_documents ignored", "rerank", RERANK, {"query": "cat", "documents": DOCS, "return_documents": True}),
    ("no query", "rerank", RERANK, {"documents": DOCS}),
    ("no documents", "rerank", RERANK, {"query": "a", "documents": []}),
    ("document objects", "rerank", RERANK, {"query": "a", "documents": [{"text": "b"}]}),
    ("embeddings on a rerank server", "rerank", EMBED, {"input": "a"}),
]


def vectors_meaning(data: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    out = []
    for entry in data:
        vector = entry["embedding"]
        if isinstance(vector, str):
            kind, size = "base64", len(base64.b64decode(vector)) // 4
        else:
            kind, size = "floats", len(vector)
        out.append((entry["index"], entry["object"], kind, size > 1))
    return out


def meaning(status: int, raw: bytes, body: dict[str, Any]) -> dict[str, Any]:
    data = json.loads(raw)
    if status != 200:
        return {"status": status, "type": data["error"]["type"]}
    seen: dict[str, Any] = {"status": 200, "object": data.get("object"), "usage": sorted(data["usage"])}
    if "data" in data:
        seen["vectors"] = vectors_meaning(data["data"])
    else:
        results = data["results"]
        scores = [r["relevance_score"] for r in results]
        seen["results"] = (len(results), scores == sorted(scores, reverse=True), sorted({k for r in results for k in r}))
        seen["indices within"] = all(0 <= r["index"] < len(body["documents"]) for r in results)
    return seen


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    binary = llama_server_or_skip()
    vocab = llamacpp_build.vocab_file()
    assert vocab is not None
    folder = tmp_path_factory.mktemp("gguf")
    servers: dict[str, tuple[str, str]] = {}
    procs = []
    for serves, flag in (("embedding", "--embedding"), ("rerank", "--reranking")):
        model = write_tiny_gguf(folder / f"{serves}.gguf", vocab, serves=serves)
        common = ["-m", str(model), "--alias", "tiny", "-c", "512", flag]
        real_port, sim_port = free_port(), free_port()
        procs.append(start([str(binary), *common, "--port", str(real_port), "-t", "1"], real_port))
        sim = [sys.executable, "-m", "agents.orchestra.engines.llamacpp.twin", *common, "--port", str(sim_port)]
        procs.append(start([*sim, "--sim-load-s", "0", "--sim-warmup-s", "0", "--sim-parent-pid", str(os.getpid())], sim_port))
        servers[serves] = (f"http://127.0.0.1:{real_port}", f"http://127.0.0.1:{sim_port}")
    yield servers
    for proc in procs:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("name, serves, route, body", MATRIX, ids=[m[0] for m in MATRIX])
def test_sim_llamacpp_pools_as_llama_server_does(pair, name, serves, route, body):
    real, sim = pair[serves]
    expected = meaning(*post(real, route, body), body)
    got = meaning(*post(sim, route, body), body)
    assert got == expected, f"{name}: the real llama-server answered {expected}, sim-llamacpp {got}"
