"""Notifications: routes in lab.yaml, payloads in each format at a real local receiver, durable delivery across
restarts and kill -9, one send per firing, secrets kept out of everything, and a stalled endpoint that never stalls the tick."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.notify.receiver import Receiver
from agents.runtime.waits import within
from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from console.lab.client import FleetClient
from tests.support.lab import REPO
from tests.support.waits import wait_for

P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}


FAST = {"retry_first": "0.2s", "retry_max": "0.5s", "flap_hold": "0.2s"}  # resolves held 0.2 s (flap damping)


def lab_with(tmp_path: Path, routes: list[dict[str, Any]], gpus: int = 1, **extra: Any) -> Path:
    data = {
        "lab": "notify-lab",
        "alerts": {"temp_for_s": 0, "clear_for_s": 0},
        "machines": [{"name": "box", "gpus": {"sim": [P4] * gpus}}],
        "notify": {**FAST, "routes": routes},
        **extra,
    }
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def by_status(received: list[dict[str, Any]], route_path: str = "") -> Counter:
    """(alert id, status) -> how many JSON notifications of that kind arrived (at paths starting with route_path)."""
    return Counter(
        (r["json"]["alert_id"], r["json"]["status"])
        for r in received
        if r["path"].startswith(route_path) and isinstance(r.get("json"), dict) and "alert_id" in r["json"]
    )


async def hot(client: FleetClient, gpu: int = 0, temp_c: float = 95.0) -> None:
    await client.call("box", "sim.override", {"gpu": gpu, "temp_c": temp_c})


async def active_ids(client: FleetClient) -> set[str]:
    return {a["id"] for a in (await client.call("box", "alerts.list", {"active": True}))["alerts"]}


# ---------------------------------------------------------------------------- formats


async def test_each_webhook_format_arrives_at_a_real_receiver_fired_and_resolved(tmp_path, monkeypatch):
    receiver = Receiver().start()
    try:
        monkeypatch.setenv("SLACK_HOOK", f"{receiver.url}/slack/T0/B0/s3cr3t-slack-token")
        monkeypatch.setenv("DISCORD_HOOK", f"{receiver.url}/discord/123/s3cr3t-discord-token")
        monkeypatch.setenv("NTFY_TOKEN", "tk_s3cr3t-ntfy")
        lab = lab_with(
            tmp_path,
            [
                {"name": "raw", "kind": "webhook", "url": f"{receiver.url}/json"},
                {"name": "slack", "kind": "webhook", "format": "slack", "url_env": "SLACK_HOOK"},
                {"name": "discord", "kind": "webhook", "format": "discord", "url_env": "DISCORD_HOOK", "send_resolved": False},
                {
                    "name": "ntfy",
                    "kind": "webhook",
                    "format": "ntfy",
                    "url": f"{receiver.url}/ntfy/lab-alerts",
                    "token_env": "NTFY_TOKEN",
                    "levels": ["critical"],
                },
            ],
        )
        with DemoLab(tmp_path / "run", source=lab) as demo:
            async with FleetClient(load_lab(demo.lab_path), subscribe=[]) as client:
                await client.wait_connected(10)
                await hot(client)
                await wait_for(lambda: len(receiver.received) >= 4, timeout=30)
                await client.call("box", "sim.override", {"gpu": 0, "clear": True})
                await wait_for(
                    lambda: len(receiver.received) >= 6, timeout=30
                )  # resolved: all but discord (send_resolved: false)
        paths = Counter(r["path"].split("/")[1] for r in receiver.received)
        assert paths == {"json": 2, "slack": 2, "discord": 1, "ntfy": 2}
        plain = [r["json"] for r in receiver.received if r["path"] == "/json"]
        assert [(p["status"], p["kind"], p["level"], p["machine"], p["alert_id"], p["gpu"], p["simulated"]) for p in plain] == [
            ("firing", "gpu_hot", "critical", "box", "box#1", 0, True),
            ("resolved", "gpu_hot", "critical", "box", "box#1", 0, True),
        ]
        assert plain[1]["cleared_at"] >= plain[1]["fired_at"]
        slack = [r["json"] for r in receiver.received if r["path"].startswith("/slack/")]
        assert set(slack[0]) == {"text"} and slack[0]["text"].startswith(
            ":rotating_light: *[CRITICAL] box (SIM): gpu0 Tesla P4 at 95 C"
        )
        assert "RESOLVED" in slack[1]["text"]
        (discord,) = [r["json"] for r in receiver.received if r["path"].startswith("/discord/")]
        assert set(discord) == {"content", "username"} and "[CRITICAL] box (SIM): gpu0" in discord["content"]
        ntfy = [r for r in receiver.received if r["path"] == "/ntfy/lab-alerts"]
        assert ntfy[0]["headers"]["X-Priority"] == "5" and ntfy[0]["headers"]["X-Title"].startswith("[CRITICAL] box (SIM)")
        assert ntfy[0]["headers"]["Authorization"] == "Bearer tk_s3cr3t-ntfy" and "alert box#1" in ntfy[0]["text"]
    finally:
        receiver.stop()


# ---------------------------------------------------------------------------- durable delivery


def agent_pid(demo: DemoLab) -> int:
    (proc,) = [p for p in demo.processes if "agents.shell.daemon" in " ".join(map(str, p.args))]
    return proc.pid


async def test_nothing_is_lost_across_a_restart_and_a_kill_9_while_the_receiver_is_down(tmp_path):
    receiver = Receiver().start()
    port = receiver.port
    receiver.stop()  # down from the start: connections refused
    lab = lab_with(tmp_path, [{"name": "hook", "kind": "webhook", "url": f"http://127.0.0.1:{port}/hook"}], gpus=2)
    demo = DemoLab(tmp_path / "run", source=lab)
    demo.start()
    try:
        demo.wait_listening()
        async with FleetClient(load_lab(demo.lab_path), subscribe=[]) as client:
            await client.wait_connected(10)
            await hot(client, gpu=0)
            await wait_for(lambda: active_ids(client), timeout=20)

            async def failing() -> bool:
                (route,) = (await client.call("box", "notify.status"))["routes"]
                return route["failures"] >= 1 and route["queued"] == 1

            await wait_for(failing, timeout=20)
        demo.stop()  # a clean restart, the receiver still down
        demo.launch()
        demo.wait_listening()
        async with FleetClient(load_lab(demo.lab_path), subscribe=[]) as client:
            await client.wait_connected(10)
            await hot(client, gpu=1)
            await wait_for(lambda: active_ids(client), timeout=20)
            os.kill(agent_pid(demo), signal.SIGKILL)  # and then a kill -9, still down
        demo.stop()
        receiver = Receiver(port).start()  # the receiver comes back; then the agent
        demo.launch()
        demo.wait_listening()
        # gpu0's alert fired before the restart (its override went with the process: it resolves now); gpu1's too
        await wait_for(
            lambda: (
                by_status(receiver.received)[("box#1", "firing")]
                and by_status(receiver.received)[("box#2", "firing")]
                and by_status(receiver.received)[("box#1", "resolved")]
                and by_status(receiver.received)[("box#2", "resolved")]
            ),
            timeout=40,
        )
        async with FleetClient(load_lab(demo.lab_path), subscribe=[]) as client:
            await client.wait_connected(10)

            async def drained() -> bool:
                (route,) = (await client.call("box", "notify.status"))["routes"]
                return route["queued"] == 0 and route["delivered"] == 4

            await wait_for(drained, timeout=20)
        assert by_status(receiver.received) == {
            ("box#1", "firing"): 1,
            ("box#1", "resolved"): 1,
            ("box#2", "firing"): 1,
            ("box#2", "resolved"): 1,
        }
    finally:
        demo.stop()
        receiver.stop()


async def test_a_flapping_alert_sends_one_notification_per_firing(tmp_path):
    receiver = Receiver().start()
    try:
        lab = lab_with(tmp_path, [{"name": "hook", "kind": "webhook", "url": f"{receiver.url}/hook", "send_resolved": False}])
        with DemoLab(tmp_path / "run", source=lab) as demo:
            async with FleetClient(load_lab(demo.lab_path)) as client:
                await client.wait_connected(10)
                view = client.state.machines["box"]

                async def seen(temp: float) -> None:  # a tick with this temperature reached the console: the rules saw it
                    await hot(client, temp_c=temp)
                    await wait_for(lambda: view.gpus.get(0) is not None and view.gpus[0].temp_c == temp, timeout=20)

                for _firing in range(3):
                    await seen(95.0)
                    for temp in (84.0, 96.0, 83.0, 97.0):  # inside the hysteresis band (clears below 80.75): the same firing
                        await seen(temp)
                    await seen(40.0)  # cleared
                    await wait_for(lambda: not view.alerts.active, timeout=20)
                fired = [a for a in (await client.call("box", "alerts.list", {"limit": 50}))["alerts"] if a["rule"] == "gpu_hot"]
                assert len(fired) == 3
                await wait_for(lambda: len(receiver.received) >= 3, timeout=20)
                await seen(40.0)  # one more tick: nothing more arrives for the three firings
        assert by_status(receiver.received) == {(a["id"], "firing"): 1 for a in fired}
    finally:
        receiver.stop()


async def test_the_rate_limit_holds_sends_back_without_dropping_them(tmp_path):
    receiver = Receiver().start()
    try:
        lab = lab_with(
            tmp_path,
            [
                {
                    "name": "hook",
                    "kind": "webhook",
                    "url": f"{receiver.url}/hook",
                    "send_resolved": False,
                    "rate_limit": {"count": 1, "per": "3s"},
                }
            ],
            gpus=3,
        )
        with DemoLab(tmp_path / "run", source=lab) as demo:
            async with FleetClient(load_lab(demo.lab_path), subscribe=[]) as client:
                await client.wait_connected(10)
                for gpu in range(3):
                    await hot(client, gpu=gpu)

                async def held() -> bool:
                    (route,) = (await client.call("box", "notify.status"))["routes"]
                    return route["rate_limited"] and route["queued"] >= 1

                await wait_for(held, timeout=20)
                assert len(receiver.received) <= 2  # one per 3 s window
                await wait_for(lambda: len(receiver.received) == 3, timeout=30)
        times = sorted(r["at"] for r in receiver.received)
        assert times[2] - times[0] >= 3.0  # three sends spread over at least two windows
    finally:
        receiver.stop()


# ---------------------------------------------------------------------------- secrets


async def read_wire(socket_path: Path, calls: list[tuple[str, dict[str, Any]]]) -> bytes:
    """Everything the agent writes to one console on its raw JSON-lines socket while these calls run."""
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    wire = b""
    try:
        for n, (method, params) in enumerate([("hello", {}), ("subscribe", {"topics": ["tick", "notice"]}), *calls], 1):
            writer.write(json.dumps({"id": n, "method": method, "params": params}).encode() + b"\n")
            await writer.drain()
            while True:
                line = await within(reader.readline(), 30)
                assert line, "the agent closed the socket"
                wire += line
                if json.loads(line).get("id") == n:
                    break
    finally:
        writer.close()
    return wire


async def test_a_secret_never_appears_in_the_audit_the_logs_the_json_output_or_the_wire(tmp_path, monkeypatch):
    secret_path, token = "/hooks/T0/B0/XOXB-s3cr3t-path", "s3cr3t-bearer-token"
    receiver = Receiver(status=404).start()  # answers 404 and echoes the path it was asked for, as many servers do
    try:
        monkeypatch.setenv("CHAT_HOOK", receiver.url + secret_path)
        url_file = tmp_path / "ntfy.url"
        url_file.write_text(f"{receiver.url}/ntfy/s3cr3t-topic\n")
        url_file.chmod(0o644)  # too open first: refused, and said so
        monkeypatch.setenv("NTFY_TOKEN", token)
        lab = lab_with(
            tmp_path,
            [
                {"name": "chat", "kind": "webhook", "format": "slack", "url_env": "CHAT_HOOK"},
                {"name": "ntfy", "kind": "webhook", "format": "ntfy", "url_file": str(url_file), "token_env": "NTFY_TOKEN"},
            ],
        )
        with DemoLab(tmp_path / "run", source=lab) as demo:
            cli = [sys.executable, "-m", "console.cli.main", "--lab", str(demo.lab_path)]
            async with FleetClient(load_lab(demo.lab_path), subscribe=[]) as client:
                await client.wait_connected(10)
                await hot(client)

                async def both_answered() -> bool:
                    routes = {r["name"]: r for r in (await client.call("box", "notify.status"))["routes"]}
                    return routes["chat"]["dropped"] >= 1 and routes["ntfy"]["problem"] is not None

                await wait_for(both_answered, timeout=30)
                routes = {r["name"]: r for r in (await client.call("box", "notify.status"))["routes"]}
                assert routes["chat"]["last_failure"]["answer"].startswith("HTTP 404")  # refused for good: not retried
                assert "<secret>" in routes["chat"]["last_failure"]["answer"]  # the echoed path, redacted
                assert "is mode 0644, readable by others: chmod 600" in routes["ntfy"]["problem"]
                url_file.chmod(0o600)
                receiver.status = 200
                answer = await client.call("box", "notify.test", {"route": "ntfy"})
                assert answer["ok"] and answer["answer"].startswith("HTTP 200")
            outputs = [
                subprocess.run([*cli, *args], capture_output=True, text=True, timeout=60, cwd=REPO)
                for args in (
                    ["--json", "alerts", "--all"],
                    ["alerts"],
                    ["--json", "alerts", "notify-test", "chat"],
                    ["alerts", "notify-test", "ntfy"],
                    ["--json", "audit"],
                )
            ]
            json_alerts = json.loads(outputs[0].stdout)
            assert {r["name"]: r["target"] for r in json_alerts["routes"]} == {"chat": "$CHAT_HOOK", "ntfy": f"file {url_file}"}
            assert json.loads(outputs[2].stdout)["tests"][0]["ok"]
            wire = await read_wire(
                demo.dir / "agents" / "box" / "agent.sock",
                [
                    ("status", {}),
                    ("notify.status", {}),
                    ("alerts.list", {"limit": 50}),
                    ("notify.test", {"route": "chat"}),
                    ("audit.list", {"limit": 100}),
                ],
            )
            assert b"notify.test" in wire and b"$CHAT_HOOK" in wire
        assert any(r["path"] == secret_path for r in receiver.received)  # the secret went where it belongs, only there
        log = (demo.dir / "agents" / "box.log").read_text()
        db = sqlite3.connect(demo.dir / "agents" / "box" / "state.db")
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        stored = "\n".join(
            str(row) for table in tables for row in db.execute(f"SELECT * FROM {table}")
        )  # the audit trail and the queue
        db.close()
        texts = {
            "log": log,
            "state.db": stored,
            "wire": wire.decode(),
            **{f"cli {i}": o.stdout + o.stderr for i, o in enumerate(outputs)},
        }
        for secret in ("XOXB-s3cr3t-path", token, "s3cr3t-topic"):
            leaks = [where for where, text in texts.items() if secret in text]
            assert leaks == [], f"{secret} appears in {leaks}"
        assert "notify.test" in stored  # the audit trail has the test, by route name
    finally:
        receiver.stop()


# ---------------------------------------------------------------------------- the tick


async def test_a_stalled_endpoint_does_not_hold_the_tick(tmp_path):
    receiver = Receiver().start()
    receiver.stall.set()  # reads each request and answers none until released
    try:
        lab = lab_with(
            tmp_path, [{"name": "hook", "kind": "webhook", "url": f"{receiver.url}/hook", "timeout_s": "120s"}], gpus=2
        )
        with DemoLab(tmp_path / "run", source=lab) as demo:
            async with FleetClient(load_lab(demo.lab_path)) as client:
                await client.wait_connected(10)
                await hot(client, gpu=0)
                await wait_for(lambda: receiver.held == 1, timeout=30)  # the agent's request hangs at the endpoint
                view = client.state.machines["box"]
                ticks: list[float] = []

                def tick_seen() -> bool:
                    if view.sample_t is not None and (not ticks or view.sample_t != ticks[-1]):
                        ticks.append(view.sample_t)
                    return len(ticks) >= 8

                await wait_for(tick_seen, timeout=60, interval=0.02)
                assert receiver.held == 1  # every one of those ticks came while the send hung
                await hot(client, gpu=1)  # and the tick still raises alerts: queued behind the hung one
                await wait_for(lambda: len(view.alerts.active) == 2, timeout=20)
                gaps = [b - a for a, b in zip(ticks, ticks[1:])]
                print(
                    f"tick gaps while the endpoint stalled: max {max(gaps):.2f} s, mean {sum(gaps) / len(gaps):.2f} s "
                    f"(interval 1 s, endpoint timeout 120 s)"
                )
                assert max(gaps) < 60  # a held tick would wait for the 120 s timeout
                receiver.stall.clear()
                await wait_for(lambda: len(by_status(receiver.received)) == 2, timeout=30)
    finally:
        receiver.stall.clear()
        receiver.stop()


# ---------------------------------------------------------------------------- a real Alertmanager

ALERTMANAGER = "/usr/bin/prometheus-alertmanager"  # Debian's prometheus-alertmanager (.ci/run installs it)


@pytest.fixture
def alertmanager(tmp_path):
    """A real Alertmanager on loopback whose one receiver is a webhook to a local Receiver; yields (url, receiver)."""
    binary = ALERTMANAGER if os.path.exists(ALERTMANAGER) else None
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail(f"{ALERTMANAGER} is missing: .ci/run installs Debian's prometheus-alertmanager")
        pytest.skip("Debian's prometheus-alertmanager is not installed (apt-get install prometheus-alertmanager; CI installs it)")
    from agents.shell.demo.lab import free_ports

    receiver = Receiver().start()
    (port,) = free_ports(1)
    config = tmp_path / "alertmanager.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "route": {
                    "receiver": "hook",
                    "group_by": ["alertname", "machine", "target"],
                    "group_wait": "0s",
                    "group_interval": "1s",
                    "repeat_interval": "1h",
                },
                "receivers": [{"name": "hook", "webhook_configs": [{"url": f"{receiver.url}/am", "send_resolved": True}]}],
            }
        )
    )
    log = open(tmp_path / "alertmanager.log", "wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield f"http://127.0.0.1:{port}", receiver
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        receiver.stop()


async def am_alerts(url: str) -> list[dict[str, Any]]:
    import aiohttp

    try:
        async with aiohttp.ClientSession() as session, session.get(f"{url}/api/v2/alerts") as response:
            return await response.json() if response.status == 200 else []
    except aiohttp.ClientError:
        return []


def am_webhooks(receiver: Receiver, alertname: str, status: str) -> list[dict[str, Any]]:
    """The alerts Alertmanager's webhook delivered with this name and status."""
    return [
        a
        for r in receiver.received
        if r["path"] == "/am"
        for a in r["json"]["alerts"]
        if a["labels"].get("alertname") == alertname and a["status"] == status
    ]


async def test_a_real_alertmanager_gets_fired_resolved_and_job_failed_alerts_with_their_labels(tmp_path, alertmanager):
    url, hook = alertmanager
    crash = [
        sys.executable,
        "-c",
        "import sys; print('loading data'); print('RuntimeError: CUDA out of memory (SIM)'); sys.exit(3)",
    ]
    lab = lab_with(
        tmp_path,
        [{"name": "oncall", "kind": "alertmanager", "url": url, "resend_every": "1s"}],
        trainers=[{"name": "crash", "machine": "box", "command": crash, "output_dir": "runs/{job_id}"}],
    )
    with DemoLab(tmp_path / "run", source=lab) as demo:
        async with FleetClient(load_lab(demo.lab_path), subscribe=[]) as client:
            await client.wait_connected(10)
            await hot(client)

            async def firing() -> dict[str, Any] | None:
                return next((a for a in await am_alerts(url) if a["labels"]["alertname"] == "gpu_hot"), None)

            alert = await wait_for(firing, timeout=30)
            assert alert["labels"] == {
                "alertname": "gpu_hot",
                "rule": "gpu_hot",
                "severity": "critical",
                "lab": "notify-lab",
                "machine": "box",
                "target": "gpu0",
                "gpu": "0",
                "source": "cetlab",
                "simulated": "true",
            }
            assert alert["status"]["state"] == "active" and alert["annotations"]["alert_id"] == "box#1"
            assert alert["annotations"]["summary"] == "gpu0 Tesla P4 at 95 C (limit 85 C)"

            async def resent() -> bool:  # re-posted while it fires: its end moves on
                again = await firing()
                return again is not None and again["endsAt"] > alert["endsAt"]

            await wait_for(resent, timeout=30)
            await wait_for(lambda: am_webhooks(hook, "gpu_hot", "firing"), timeout=30)
            await client.call("box", "sim.override", {"gpu": 0, "clear": True})
            (resolved,) = await wait_for(lambda: am_webhooks(hook, "gpu_hot", "resolved"), timeout=30)
            assert resolved["labels"]["machine"] == "box" and resolved["labels"]["gpu"] == "0"

            async def gone() -> bool:  # ended: Alertmanager lists it no more
                return await firing() is None

            await wait_for(gone, timeout=30)

            job = await client.call("box", "jobs.start", {"recipe": "crash"})
            (failed,) = await wait_for(lambda: am_webhooks(hook, "job_failed", "firing"), timeout=60)
            assert failed["labels"]["job"] == job["id"] and failed["labels"]["severity"] == "critical"
            assert "CUDA out of memory" in failed["annotations"]["last_lines"] and failed["annotations"]["exit_code"] == "3"
    assert len(am_webhooks(hook, "gpu_hot", "firing")) == 1  # one notification for the one firing


# ---------------------------------------------------------------------------- the demo


def demo_m5_only(tmp_path: Path) -> Path:
    """The bundled demo lab cut down to m5 and its LoRA recipe (the rest would only load the machine), notify as shipped."""
    import shutil

    data = yaml.safe_load((REPO / "lab.yaml").read_text())
    data["machines"] = [m for m in data["machines"] if m["name"] == "m5"]
    data["alerts"] = {**data["alerts"], "temp_for_s": 0}  # docs/alerts.md's scenario waits 30 s: the test does not
    for key in ("models", "providers", "trainers"):
        data[key] = [t for t in data.get(key, []) if key == "trainers" and t["name"] == "demo-lora"]
    data.pop("gateway")
    data["notify"].pop("watch_offline")  # pharaoh is cut
    data["orchestra"], data["checkpoints"] = {}, {}
    source = tmp_path / "source"
    shutil.copytree(REPO / "demo", source / "demo")
    (source / "lab.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return source / "lab.yaml"


async def test_the_demo_hot_gpu_scenario_and_a_failed_run_each_reach_the_demo_receiver(tmp_path):
    from agents.runtime.demo import NOTIFICATIONS_FILE

    with DemoLab(tmp_path / "run", source=demo_m5_only(tmp_path)) as demo:
        url_file = demo.dir / "console" / "team-chat.url"
        hook_url = url_file.read_text().strip()  # with a token in its path, as a real hook's
        assert url_file.stat().st_mode & 0o777 == 0o600 and hook_url not in demo.lab_path.read_text()
        received = demo.dir / NOTIFICATIONS_FILE

        def arrived() -> list[dict[str, Any]]:
            return [json.loads(line) for line in received.read_text().splitlines()] if received.exists() else []

        cli = [sys.executable, "-m", "console.cli.main", "--lab", str(demo.lab_path)]
        hot_gpu = subprocess.run(
            [*cli, "sim-override", "m5", "--gpu", "0", "--temp-c", "95"], capture_output=True, text=True, timeout=60, cwd=REPO
        )
        assert hot_gpu.returncode == 0, hot_gpu.stderr
        (first,) = await wait_for(arrived, timeout=30)
        assert first["json"]["text"].startswith(":rotating_light: *[CRITICAL] m5 (SIM): gpu0 Tesla V100 at 95 C")
        fail = subprocess.run(
            [*cli, "train", "demo-lora", "--set", "resume_from_checkpoint=/no/such/checkpoint-1"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert fail.returncode == 0, fail.stderr
        await wait_for(lambda: len(arrived()) == 2, timeout=120)
        failed = arrived()[1]["json"]["text"]
        assert "[CRITICAL] m5 (SIM): job m5-1 (demo-lora) failed" in failed and "checkpoint folder not found" in failed
        shown = subprocess.run([*cli, "alerts"], capture_output=True, text=True, timeout=60, cwd=REPO).stdout
        assert "team-chat SIM (webhook slack → file console/team-chat.url) from m5 · last delivered" in shown
        assert len(arrived()) == 2  # one each
        assert hook_url not in shown and hook_url.rsplit("/", 1)[1] not in (demo.dir / "agents" / "m5.log").read_text()


# ---------------------------------------------------------------------------- the console


async def test_the_alerts_view_shows_each_routes_last_delivery_and_failures(tmp_path):
    from console.tui.app import CetlabApp
    from console.tui.screens.alerts import AlertsScreen

    receiver = Receiver().start()
    dead = Receiver().start()
    dead.stop()  # nobody listens there
    try:
        lab = lab_with(
            tmp_path,
            [
                {"name": "chat", "kind": "webhook", "url": f"{receiver.url}/hook"},
                {"name": "pager", "kind": "webhook", "url": f"http://127.0.0.1:{dead.port}/hook"},
            ],
        )
        with DemoLab(tmp_path / "run", source=lab) as demo:
            app = CetlabApp(load_lab(demo.lab_path))
            async with app.run_test(size=(160, 50)) as pilot:
                box = app.state.machines["box"]
                await wait_for(lambda: box.online and box.sample_t is not None, timeout=30)
                await app.client.call("box", "sim.override", {"gpu": 0, "temp_c": 97})
                await pilot.press("colon", *"alerts", "enter")
                await wait_for(lambda: isinstance(app.screen, AlertsScreen), timeout=10)
                routes = app.screen.query_one("#alerts-routes")

                def shown() -> str:
                    return str(routes.render())

                await wait_for(
                    lambda: (
                        "chat (webhook json" in shown()
                        and "last delivered" in shown()
                        and "pager (webhook json" in shown()
                        and "FAILING" in shown()
                    ),
                    timeout=30,
                )
                pager = next(line for line in shown().splitlines() if line.startswith("pager"))
                assert "1 queued" in pager and "failed attempts" in pager and "nothing delivered yet" in pager
    finally:
        receiver.stop()


async def test_the_watcher_sends_machine_offline_when_another_agent_is_gone_and_resolved_when_it_is_back(tmp_path):
    from tests.support.lab import run_agent

    receiver = Receiver().start()
    lab = lab_with(tmp_path, [{"name": "hook", "kind": "webhook", "url": f"{receiver.url}/hook", "kinds": ["machine_offline"]}])
    data = yaml.safe_load(lab.read_text())
    data["machines"].append({"name": "other", "gpus": {"sim": [P4]}})
    data["alerts"]["offline_for_s"] = "1s"
    data["notify"]["watch_offline"] = "box"
    lab.write_text(yaml.safe_dump(data, sort_keys=False))
    back = None
    try:
        with DemoLab(tmp_path / "run", source=lab) as demo:
            (other,) = [p for p in demo.processes if "other" in p.args]
            other.kill()  # kill -9
            other.wait(timeout=10)

            def sent(status: str) -> list[dict[str, Any]]:
                return [
                    r["json"]
                    for r in receiver.received
                    if r["json"]["kind"] == "machine_offline" and r["json"]["status"] == status
                ]

            (down,) = await wait_for(lambda: sent("firing"), timeout=30)
            assert down["machine"] == "other" and down["alert_id"] == "other#offline" and down["details"] == {"watched_by": "box"}
            back = run_agent(demo.lab_path, "other", demo.dir / "agents" / "other")
            (up,) = await wait_for(lambda: sent("resolved"), timeout=30)
            assert up["machine"] == "other" and up["fired_at"] == down["fired_at"] and "answers again" in up["message"]
            assert len(sent("firing")) == 1
    finally:
        if back is not None:
            back.terminate()
            back.wait(timeout=10)
        receiver.stop()


@pytest.mark.slow
async def test_a_real_training_run_that_finishes_sends_its_final_loss_and_checkpoint(tmp_path):
    from agents.runtime.demo import NOTIFICATIONS_FILE

    with DemoLab(tmp_path / "run", source=demo_m5_only(tmp_path)) as demo:
        received = demo.dir / NOTIFICATIONS_FILE
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "console.cli.main",
                "--lab",
                str(demo.lab_path),
                "train",
                "demo-lora",
                "--set",
                "max_steps=30",
                "--set",
                "save_steps=10",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert run.returncode == 0, run.stderr
        (line,) = await wait_for(lambda: received.exists() and received.read_text().splitlines(), timeout=240)
        text = json.loads(line)["json"]["text"]
        assert text.startswith(":information_source: *[INFO] m5 (SIM): job m5-1 (demo-lora) finished at step 30, final loss ")
        assert ("best checkpoint:" in text or "last checkpoint: " in text) and "/checkpoint-" in text
