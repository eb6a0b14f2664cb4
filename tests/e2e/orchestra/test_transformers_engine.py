"""The real engine: the tiny Llama through `transformers serve` on CPU, cold to warm and back."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest

from agents.wire.lab.model import load_lab
from agents.wire.protocol import ErrorCode, RemoteError
from console.lab.client import FleetClient
from tests.support.pool import post, settle


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_transformers_serve_tiny_model_cold_to_warm_and_back(run_pool):
    demo = run_pool(
        {
            "lab": "tiny-lab",
            "machines": [{"name": "cpu-box", "gpus": "none"}],
            "models": [
                {
                    "name": "tiny",
                    "path": "tiny-llama",
                    "engine": "transformers",
                    "machine": "cpu-box",
                    "make_tiny_if_missing": True,
                    "load_timeout_s": "180s",
                }
            ],
        }
    )
    lab = load_lab(demo.lab_path)
    async with FleetClient(lab) as client:
        await client.wait_connected(10)
        assert (await client.call("cpu-box", "models.warm", {"model": "tiny"}))["state"] == "loading"
        tiny = await settle(client, "tiny", ("warm", "failed"), timeout=200, machine="cpu-box")
        assert tiny["state"] == "warm", tiny["error"]
        assert tiny["simulated"] is False and tiny["warmup_s"] > 0
        status, answer = await asyncio.to_thread(
            post,
            tiny["endpoint"],
            "/v1/completions",
            {"model": tiny["served_name"], "prompt": "Capital of France:", "max_tokens": 4},
        )
        assert status == 200 and answer["usage"]["completion_tokens"] >= 1
        with pytest.raises(RemoteError) as exc:
            await client.call("cpu-box", "models.sleep", {"model": "tiny"})
        assert exc.value.code == ErrorCode.UNAVAILABLE and "no sleep mode" in exc.value.message
        endpoint = tiny["endpoint"]
        tiny = await client.call("cpu-box", "models.cold", {"model": "tiny"}, timeout=30)
        assert tiny["state"] in ("cold", "cached") and tiny["endpoint"] is None
        with pytest.raises(OSError):  # the server is gone with its process group
            urllib.request.urlopen(endpoint.removesuffix("/v1") + "/health", timeout=2)
