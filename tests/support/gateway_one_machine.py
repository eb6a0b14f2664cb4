"""What tests/fast/cli/test_status.py, tests/fast/orchestra/test_missing_file.py share: gateway_lab."""

from __future__ import annotations

import pytest

from tests.support.waits import wait_for

# ---------------------------------------------------------------------------- a lab with a gateway and models


def _lab(with_gateway: bool = True) -> dict:
    data: dict = {
        "lab": "leftovers",
        "machines": [{"name": "box", "gpus": "none"}],
        "models": [
            {"name": "ghost", "path": "models/ghost", "engine": "sim", "machine": "box", "vram_gib": 1},
            {
                "name": "here",
                "path": "models/here",
                "engine": "sim",
                "machine": "box",
                "vram_gib": 1,
                "sim": {"placeholder_mib": 1, "load_s": 0.05, "warmup_s": 0.01},
            },
        ],  # fmt: skip
    }
    if with_gateway:
        data["gateway"] = {"machine": "box", "host": "127.0.0.1", "port": 0}
    return data


@pytest.fixture
async def gateway_lab(in_process):
    lab = await in_process(_lab())
    client = lab.client()
    await client.start()
    await client.wait_connected(10)
    url = await wait_for(lambda: _url(client), 20)
    yield lab, client, url
    await client.stop()


async def _url(client) -> str | None:
    status = await client.call("box", "gateway.status")
    return status and status["url"]
