"""Alert rules: each fires after its duration and clears with hysteresis; end to end over SSH with sim.override."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from agents.wire.protocol import EVENT_NOTICE, EVENT_TICK, RemoteError
from console.lab.client import FleetClient
from tests.support.alert_rules import LAB
from tests.support.waits import wait_for


@pytest.mark.timeout(90)
async def test_hot_gpu_alert_end_to_end(tmp_path, lab_file):
    notices = []
    with DemoLab(tmp_path / "run", source=lab_file(LAB)) as demo:
        lab = load_lab(demo.lab_path)
        client = FleetClient(lab, subscribe=[EVENT_TICK, EVENT_NOTICE], on_event=lambda m, e, d: notices.append((m, e, d)))
        async with client:
            box = client.state.machines["box"]
            await wait_for(lambda: box.online and box.sample_t is not None, timeout=30)

            def hot() -> list[dict]:  # (a nearly full disk on the test machine would be an alert too)
                return [a.model_dump() for a in box.alerts.active if a.rule == "gpu_hot"]

            assert hot() == []
            await client.call("box", "sim.override", {"gpu": 0, "temp_c": 95})
            await wait_for(hot, timeout=20)
            alert = hot()[0]
            assert (alert["rule"], alert["target"], alert["level"], alert["acked"]) == ("gpu_hot", "gpu0", "critical", False)
            await wait_for(
                lambda: any(e == EVENT_NOTICE and d.alert and d.alert.id == alert["id"] for _, e, d in notices), timeout=10
            )

            acked = await client.call("box", "alerts.ack", {"id": alert["id"]})
            assert acked["acked"] and acked["acked_by"] == "demo-console"
            await wait_for(lambda: hot()[0]["acked"], timeout=10)

            await client.call("box", "sim.override", {"gpu": 0, "temp_c": 40, "clear": True})
            await wait_for(lambda: not hot(), timeout=20)
            assert box.alerts.recent[0].id == alert["id"]
            from console.tui.app import notice_toast  # the toasts name the machine once ("m5: m5: cleared: ..." before)

            def toasts() -> list[str]:
                return [notice_toast(m, d) for m, e, d in notices if e == EVENT_NOTICE and d.alert and d.alert.id == alert["id"]]

            shown = await wait_for(lambda: len(toasts()) == 2 and toasts(), timeout=10)
            assert shown[0].startswith("box: gpu0") and shown[1].startswith("box: cleared: gpu0"), shown

            history = await client.call("box", "alerts.list", {})
            assert history["alerts"][0]["cleared_at"] >= history["alerts"][0]["fired_at"]

            with pytest.raises(RemoteError) as info:
                await client.call("box", "sim.override", {"gpu": 3, "temp_c": 90})
            assert info.value.code == "not_found"
            with pytest.raises(RemoteError) as info:
                await client.call("box", "sim.override", {"gpu": 0})
            assert info.value.code == "invalid_params"
            with pytest.raises(RemoteError) as info:
                await client.call("plain", "sim.override", {"gpu": 0, "temp_c": 90})
            assert info.value.code == "unavailable"
            with pytest.raises(RemoteError) as info:
                await client.call("box", "alerts.ack", {"id": "plain#1"})
            assert info.value.code == "not_found"
            with pytest.raises(RemoteError) as info:
                await client.call("box", "costs.get", {"by": "gpu", "since": "last week"})
            assert info.value.code == "invalid_params" and "since" in info.value.message
            assert (await client.call("box", "ping"))["t"] > 0  # and the agent keeps serving

        out = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "console.cli.main", "--lab", str(demo.lab_path), "--json", "alerts", "--all"],
            capture_output=True,
            text=True,
            timeout=40,
        )
        assert out.returncode == 0, out.stderr
        assert alert["id"] in [a["id"] for a in json.loads(out.stdout)["alerts"]]
