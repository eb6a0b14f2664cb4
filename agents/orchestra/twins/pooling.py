"""The simulators' pooling routes, as the real engines answer them: POST /v1/embeddings (OpenAI's body: `input` a
string, a list of strings, a token list or a list of token lists; `encoding_format` float or base64, which the openai
SDK asks for by default; `dimensions`) and POST /v1/rerank (Jina's and Cohere's body: `query`, `documents`, `top_n`;
answer `results` [{index, relevance_score}] best first). Vectors and scores are derived from the text, so the same
input always gives the same answer and a document sharing the query's words scores higher.

llama-server answers both only when started with --embedding / --reranking (a 501 not_supported_error otherwise);
vLLM only for a pooling model (--runner pooling); each simulator passes its flag as `enabled`."""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from typing import Any

DIMENSIONS = 16  # the simulated model's hidden size


class PoolingError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def _tokens(text: str) -> int:
    return max(1, round(len(text.split()) * 1.3))  # as the simulators count a prompt


def _inputs(value: object) -> list[str]:
    """OpenAI's four forms of `input`, each as one text (a token list is its numbers, as words); llama-server's words
    for what it refuses."""
    if value is None:
        raise PoolingError(400, '"input" or "content" must be provided', "input")
    if isinstance(value, list) and not value:
        raise PoolingError(400, '"input" must not be empty', "input")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return list(value)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return [" ".join(map(str, value))]
        if all(isinstance(v, list) and v and all(isinstance(t, int) for t in v) for v in value):
            return [" ".join(map(str, v)) for v in value]
    raise PoolingError(400, '"prompt" elements must be a string, a list of tokens, or a list of mixed strings & tokens.', "input")


def vector(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    """A unit vector from the text's words: each word adds its own direction, so shared words mean nearer vectors."""
    total = [0.0] * dimensions
    for word in text.lower().split() or [""]:
        digest = hashlib.blake2b(word.encode(), digest_size=2 * dimensions).digest()
        for i in range(dimensions):
            total[i] += (digest[2 * i] * 256 + digest[2 * i + 1]) / 32767.5 - 1.0
    norm = math.sqrt(sum(v * v for v in total)) or 1.0
    return [v / norm for v in total]


def embeddings(body: dict[str, Any], model: str, enabled: bool, refusal: str, reads_dimensions: bool) -> dict[str, Any]:
    """reads_dimensions: vLLM's (a model that is not matryoshka refuses `dimensions`); llama-server ignores it."""
    if not enabled:
        raise PoolingError(501, refusal)
    texts = _inputs(body.get("input"))
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise PoolingError(400, "The format to return the embeddings in. Can be either float or base64", "encoding_format")
    dimensions = (body.get("dimensions") if reads_dimensions else None) or DIMENSIONS
    if not isinstance(dimensions, int) or not 1 <= dimensions <= DIMENSIONS:
        raise PoolingError(400, f"dimensions must be 1 to {DIMENSIONS} for this model", "dimensions")
    data = []
    for index, text in enumerate(texts):
        values = vector(text, dimensions)
        embedding: object = base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode() if fmt == "base64" else values
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    prompt = sum(_tokens(t) for t in texts)
    return {"object": "list", "model": model, "data": data, "usage": {"prompt_tokens": prompt, "total_tokens": prompt}}


def rerank(body: dict[str, Any], model: str, enabled: bool, refusal: str, echoes_documents: bool) -> dict[str, Any]:
    """echoes_documents: vLLM's (return_documents gives each result its `document`); llama-server never does."""
    if not enabled:
        raise PoolingError(501, refusal)
    query, documents, top_n = body.get("query"), body.get("documents"), body.get("top_n")
    if not isinstance(query, str):
        raise PoolingError(400, '"query" must be provided', "query")
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise PoolingError(400, '"documents" must be a non-empty string array', "documents")
    texts: list[str] = documents
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0):
        raise PoolingError(400, "top_n must be a whole number >= 0", "top_n")
    asked = vector(query)
    scored = [(sum(a * b for a, b in zip(asked, vector(t), strict=True)), i) for i, t in enumerate(texts)]
    scored.sort(key=lambda pair: (-pair[0], pair[1]))
    results: list[dict[str, Any]] = []
    for score, index in scored[: len(scored) if top_n is None else top_n]:
        entry: dict[str, Any] = {"index": index, "relevance_score": round(score, 6)}
        if echoes_documents and body.get("return_documents"):
            entry["document"] = {"text": texts[index]}
        results.append(entry)
    prompt = sum(_tokens(query) + _tokens(t) for t in texts)  # a cross-encoder reads the query with each document
    return {"object": "list", "model": model, "results": results, "usage": {"prompt_tokens": prompt, "total_tokens": prompt}}
