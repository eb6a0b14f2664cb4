"""Notifications under trouble (issue 30, R12): a notification its endpoint keeps refusing waits for its own retry
without holding the rest of its route's queue, and a flapping alert is damped before the outbox. A real agent in this
event loop, its real state.db, a real command route (a shell script)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from agents.notify.flaps import FLAPS_TO_SAY
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(120)


P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}


# a command route whose endpoint refuses every notification about GPU 0 and takes the others (it writes them down)
DELIVER = """
import json, sys
n = json.load(sys.stdin)
if n.get("gpu") == 0:
    sys.exit("the endpoint refuses this one")
with open(sys.argv[1], "a") as out:
    out.write(json.dumps(n) + "\\n")
"""


def lab(tmp_path: Path, gpus: int, **notify: Any) -> dict[str, Any]:
    script = tmp_path / "deliver.py"
    script.write_text(DELIVER)
    route = {"name": "page", "kind": "command", "argv": [sys.executable, str(script), str(tmp_path / "delivered.jsonl")]}
    return {
        "lab": "notify-trouble",
        "alerts": {"temp_for_s": 0, "clear_for_s": 0},
        "machines": [{"name": "box", "gpus": {"sim": [P4] * gpus}}],
        "notify": {"retry_first": "1h", "retry_max": "1h", "routes": [route], **notify},
    }


def delivered(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "delivered.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_a_notification_its_endpoint_refuses_does_not_hold_the_ones_behind_it(in_process, tmp_path):
    running = await in_process(lab(tmp_path, gpus=2))
    client = running.client()
    await client.start()
    await client.wait_connected(10)
    try:
        await client.call("box", "sim.override", {"gpu": 0, "temp_c": 95.0})  # refused: retried in an hour
        await wait_for(lambda: running.agents["box"].store.query("SELECT 1 FROM notify_outbox WHERE attempts > 0"), timeout=20)
        await client.call("box", "sim.override", {"gpu": 1, "temp_c": 95.0})
        # before: GPU 1's firing waited behind GPU 0's (its retry an hour away; a day with the default give-up)
        got = await wait_for(lambda: delivered(tmp_path), timeout=20)
        assert [(n["gpu"], n["status"]) for n in got] == [(1, "firing")]
    finally:
        await client.stop()


async def test_a_flapping_alert_becomes_one_firing_and_one_flapping_notification(in_process, tmp_path):
    running = await in_process(lab(tmp_path, gpus=2, flap_hold="1h"))
    agent = running.agents["box"]
    client = running.client()
    await client.start()
    await client.wait_connected(10)
    view = client.state.machines["box"]

    async def seen(temp: float) -> None:  # a tick with this temperature reached the console: the rules saw it
        await client.call("box", "sim.override", {"gpu": 1, "temp_c": temp})
        await wait_for(lambda: view.gpus.get(1) is not None and view.gpus[1].temp_c == temp, timeout=20)

    try:
        for _ in range(FLAPS_TO_SAY + 2):
            await seen(95.0)
            await seen(40.0)
        fired = [a for a in (await client.call("box", "alerts.list", {"limit": 50}))["alerts"] if a["gpu"] == 1]
        assert len(fired) == FLAPS_TO_SAY + 2  # the rule did fire each time: the damping is the notifications'
        first = min(fired, key=lambda a: a["fired_at"])["id"]
        await wait_for(lambda: len(delivered(tmp_path)) >= 2, timeout=20)
        rows = agent.store.query("SELECT key, next_at, delivered_at FROM notify_outbox ORDER BY n")
        # before: a firing and a resolve per flap (5 + 5 rows)
        assert sorted(r["key"] for r in rows) == sorted([f"{first}:firing", f"{first}:flapping", f"{first}:resolved"])
        held = next(r for r in rows if r["key"].endswith(":resolved"))
        assert held["delivered_at"] is None  # held for the hold time: fired again before it, it is taken back
        said = [n for n in delivered(tmp_path)]
        assert [n["status"] for n in said] == ["firing", "firing"] and said[1]["message"].startswith("flapping: fired")
        assert {n["alert_id"] for n in said} == {first}
    finally:
        await client.stop()
