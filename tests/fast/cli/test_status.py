"""`cetlab status` says where the gateway listens, whether it is up, and the models by state (or unknown, machine
off)."""

from __future__ import annotations

from console.lab.status import status_human, status_json
from tests.support.gateway_one_machine import (
    _lab,
)
from tests.support.waits import wait_for


async def test_status_says_where_the_gateway_listens_whether_it_is_up_and_the_models_by_state(gateway_lab):
    """`cetlab status` said nothing of the gateway nor of the models: a line for each, and the same in --json."""
    lab, client, url = gateway_lab
    await client.call("box", "models.warm", {"model": "here"})
    data = await wait_for(lambda: (d := status_json(client.state))["models"]["warm"] == 1 and d["gateway"]["up"] and d, 20)
    assert data["gateway"] == {"machine": "box", "listen": "127.0.0.1:0", "url": url, "up": True, "error": None}
    assert data["models"]["total"] == 2 and data["models"]["cold"] == 1 and data["models"]["unknown"] == 0
    lines = status_human(data).splitlines()
    assert lines[1:3] == [f"gateway on box: {url} (listens on 127.0.0.1:0), up", "2 models: 1 warm, 1 cold"]


async def test_status_says_the_gateway_is_down_and_the_models_unknown_when_its_machine_is_off(in_process):
    lab = await in_process(_lab(), machines=[])  # box is off
    client = lab.client()
    await client.start()
    await client.wait_connected(5)
    data = status_json(client.state)
    assert data["gateway"]["up"] is False and data["gateway"]["error"] == "box is offline"
    assert status_human(data).splitlines()[1:3] == [
        "gateway on box: http://127.0.0.1:0/v1 (listens on 127.0.0.1:0), DOWN: box is offline",
        "2 models: 2 unknown",
    ]
    one = status_human({**data, "models": {**data["models"], "total": 1, "unknown": 1}, "gateway": None})
    assert one.splitlines()[1] == "1 model: 1 unknown"
    await client.stop()
