"""The gateway's other routes against the real pinned llama-server, on tiny GGUF models written here: a chat Llama, an
embedding Llama (mean pooling, llama-server --embedding) and a reranker (a Qwen3 with a yes/no rank head, llama-server
--reranking): a retrieval pipeline (embeddings, then rerank), a Responses API client and an Anthropic-SDK client,
each through the gateway with the real SDKs."""

from __future__ import annotations

import math

import aiohttp
import anthropic
import openai
import pytest

from agents.orchestra.engines.llamacpp import build as llamacpp_build
from agents.orchestra.engines.llamacpp.tiny_gguf import write_tiny_gguf
from agents.wire.lab.model import load_lab
from console.lab.client import FleetClient
from tests.support.gateway import gateway_key, running_lab
from tests.support.llamacpp import llama_server_or_skip
from tests.support.waits import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


SERVES = {"tiny-chat": "chat", "tiny-embed": "embedding", "tiny-rank": "rerank"}


@pytest.fixture(scope="module")
def llama_routes(tmp_path_factory):
    llama_server_or_skip()
    vocab = llamacpp_build.vocab_file()
    assert vocab is not None
    folder = tmp_path_factory.mktemp("gguf")
    models = []
    for name, serves in SERVES.items():
        path = write_tiny_gguf(folder / f"{name}.gguf", vocab, serves=serves)
        models.append(
            {
                "name": name,
                "path": str(path),
                "engine": "llamacpp",
                "machine": "box",
                "serves": serves,
                "load_timeout_s": "60s",
                "args": ["-c", "512", "-t", "1", "--parallel", "2"],
            }
        )
    lab = {
        "lab": "llama-routes",
        "machines": [{"name": "box", "gpus": "none"}],
        "models": models,
        "orchestra": {"warm": list(SERVES)},
        "gateway": {"machine": "box"},
    }
    with running_lab(tmp_path_factory, lab, "llama-routes") as demo:
        yield demo


@pytest.fixture
async def gateway(llama_routes):
    lab = load_lab(llama_routes.lab_path)
    async with FleetClient(lab, subscribe=[]) as client:
        await client.wait_connected(20)

        async def warm() -> bool:
            listed = {m["name"]: m for m in (await client.call("box", "models.list"))["models"]}
            failed = [m["error"] for m in listed.values() if m["state"] == "failed"]
            assert not failed, failed
            return all(listed[name]["state"] == "warm" for name in SERVES)

        await wait_for(warm, timeout=120, interval=0.3)
    key = gateway_key(llama_routes)
    return lab.gateway.url, key


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


async def test_a_retrieval_pipeline_embeddings_then_rerank(gateway):
    url, key = gateway
    docs = ["the cat sat on the mat", "stock prices fell today", "a cat on a mat"]
    async with openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=60) as sdk:
        answer = await sdk.embeddings.create(model="tiny-embed", input=docs)  # base64, the SDK's default
        assert answer.model == "tiny-embed" and len(answer.data) == 3 and answer.usage.prompt_tokens > 0
        vectors = [d.embedding for d in answer.data]
        # one text alone, as floats and as base64 (llama-server's vector of a text depends on its batch's company)
        alone = await sdk.embeddings.create(model="tiny-embed", input=docs[0])
        floats = await sdk.embeddings.create(model="tiny-embed", input=docs[0], encoding_format="float")
        assert floats.data[0].embedding == pytest.approx(alone.data[0].embedding, abs=1e-6)
        assert cosine(vectors[0], vectors[0]) == pytest.approx(1.0) and cosine(vectors[0], vectors[1]) < 0.9999
        with pytest.raises(openai.BadRequestError) as err:  # an embedding model answers no chat
            await sdk.chat.completions.create(model="tiny-embed", messages=[{"role": "user", "content": "hi"}])
        assert err.value.body["param"] == "model"
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        body = {"model": "tiny-rank", "query": "cat on the mat", "documents": docs, "top_n": 2}
        async with session.post(url + "/rerank", json=body) as r:
            assert r.status == 200, await r.text()
            ranked = await r.json()
    results = ranked["results"]
    assert len(results) == 2 and {x["index"] for x in results} <= {0, 1, 2} and ranked["model"] == "tiny-rank"
    assert results[0]["relevance_score"] >= results[1]["relevance_score"]
    assert all(0.0 <= x["relevance_score"] <= 1.0 for x in results)


async def test_responses_and_anthropic_messages_on_llama_server(gateway):
    url, key = gateway
    async with openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=60) as sdk:
        answer = await sdk.responses.create(model="tiny-chat", input="hello", instructions="answer", max_output_tokens=4)
        assert answer.model == "tiny-chat" and answer.usage.output_tokens == 4 and answer.output[0].type == "message"
        events = [e async for e in await sdk.responses.create(model="tiny-chat", input="hello", max_output_tokens=3, stream=True)]
        kinds = [e.type for e in events]
        assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
        assert events[-1].response.usage.output_tokens == 3
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert events[-1].response.output_text == deltas
    async with anthropic.AsyncAnthropic(base_url=url.removesuffix("/v1"), api_key=key, max_retries=0, timeout=60) as claude:
        message = await claude.messages.create(model="tiny-chat", max_tokens=3, messages=[{"role": "user", "content": "hi"}])
        assert message.usage.output_tokens == 3 and message.stop_reason == "max_tokens" and message.model == "tiny-chat"
        async with claude.messages.stream(
            model="tiny-chat", max_tokens=3, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            final = await stream.get_final_message()
        assert final.usage.output_tokens == 3 and final.stop_reason == "max_tokens"
