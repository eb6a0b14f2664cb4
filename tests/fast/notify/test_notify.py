"""Notifications: routes in lab.yaml, payloads in each format at a real local receiver, durable delivery across
restarts and kill -9, one send per firing, secrets kept out of everything, and a stalled endpoint that never stalls the tick."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from agents.notify.receiver import Receiver
from agents.wire.lab.model import LabError, load_lab, parse_lab
from agents.wire.lab.notify import Kind, Level
from agents.wire.sections.notify import Notification
from tests.support.lab import REPO
from tests.support.waits import wait_for

# ---------------------------------------------------------------------------- lab.yaml


def test_routes_are_validated_and_a_secret_in_clear_is_refused_without_being_echoed():
    head = "lab: t\nmachines: [{name: box}]\nnotify:\n  routes:\n"
    with pytest.raises(LabError) as bad:
        parse_lab(
            head + "    - {name: chat, kind: webhook, format: slack, url: 'https://hooks.slack.com/services/T1/B2/TOPSECRET'}\n"
            "    - {name: am, kind: alertmanager, url: 'http://admin:TOPSECRET@127.0.0.1:9093'}\n"
            "    - {name: hook, kind: webhook, url: 'https://example.com/h?token=TOPSECRET'}\n"
            "    - {name: page, kind: command, argv: 'page-me --urgent'}\n"
            "    - {name: both, kind: webhook, url: 'http://127.0.0.1:1/x', url_env: HOOK}\n"
            "    - {name: odd, kind: pager, url: 'http://127.0.0.1:1/x'}\n"
            '    - {name: ws, kind: webhook, url: "https://example.com/\\nTOPSECRET"}\n'
            "    - {name: frag, kind: webhook, url: 'https://example.com/h#TOPSECRET'}\n"
        )
    text = str(bad.value)
    assert "TOPSECRET" not in text  # the error names where, never what the secret is
    assert "lab.yaml:5: notify.routes[0]: a slack incoming-webhook URL holds its token" in text
    assert "lab.yaml:6: notify.routes[1]: url: a URL with user:password@ holds a secret" in text
    assert "lab.yaml:7: notify.routes[2]: url: a URL with a ?query" in text
    assert "lab.yaml:8: notify.routes[3].argv: expected an argv list" in text
    assert "lab.yaml:9: notify.routes[4]: give exactly one of url, url_env" in text
    assert "lab.yaml:10: notify.routes[5]" in text
    assert "lab.yaml:11: notify.routes[6]: url: a URL has no spaces or control characters" in text
    assert "lab.yaml:12: notify.routes[7]: url: a URL's #fragment is never sent" in text
    with pytest.raises(
        LabError,
        match=r"(?s)notify.routes\[1\].machines\[0\]: no machine named .m9.*notify.routes\[2\].name: duplicate route name",
    ):
        parse_lab(
            head
            + "    - {name: a, kind: webhook, url_env: HOOK}\n    - {name: b, kind: webhook, url_env: HOOK, machines: [m9]}\n"
            "    - {name: a, kind: command, argv: [/bin/true]}\n"
        )
    lab = parse_lab(
        head
        + "    - {name: am, kind: alertmanager, url: 'http://127.0.0.1:9093', levels: [critical], kinds: [gpu_hot, job_failed]}\n"
    )
    route = lab.notify.routes[0]
    assert route.takes("gpu_hot", "critical", "box") and not route.takes("gpu_hot", "warning", "box")
    assert not route.takes("disk_full", "critical", "box") and route.takes("test", "info", "box")
    from agents.wire.lab.notify import kind_of_rule

    # a model that fails to load and an API budget crossing its line go under the names people route by
    assert [kind_of_rule(r) for r in ("engine_failed", "budget_80", "budget_100", "gpu_hot", "job_stalled", "new_rule")] == [
        "model_failed",
        "budget",
        "budget",
        "gpu_hot",
        "job_stalled",
        None,
    ]


def test_the_repository_lab_routes_the_demo_to_its_receiver_from_a_private_file():
    lab = load_lab(REPO / "lab.yaml")
    (route,) = lab.notify.routes
    assert route.simulated and route.url is None and route.url_file  # the hook's URL is never in lab.yaml
    assert {"gpu_hot", "job_failed"} <= set(route.kinds)


# ---------------------------------------------------------------------------- job events


JOB = {"recipe": "cet-d", "machine": "box", "output_dir": "/runs/x", "log_path": "/logs/x"}


async def test_job_events_finished_failed_lost_and_stalled_are_sent_once_each_and_a_stopped_run_is_not(tmp_path):
    from agents.notify.component import NotifyComponent
    from agents.runtime.store import Store
    from agents.shell.agent import Agent
    from agents.wire.protocol import Telemetry
    from agents.wire.sections.jobs import JobInfo
    from agents.wire.sections.tick import Tick

    receiver = Receiver().start()
    lab = parse_lab(
        f"lab: t\nmachines: [{{name: box, gpus: {{sim: [{{name: Tesla P4, memory_gib: 8, tdp_w: 75}}]}}}}]\n"
        f"notify: {{stall_after: 60s, routes: [{{name: hook, kind: webhook, url: '{receiver.url}/hook'}}]}}\n"
    )
    agent = Agent(lab, "box", tmp_path, components=lambda core: [NotifyComponent(core)])
    notify = agent.find(NotifyComponent)
    assert notify is not None
    agent.store = Store(tmp_path / "state.db")
    await agent.start_components()
    try:
        start = notify.outbox.since

        def tick(t: float, *jobs: dict[str, Any]) -> None:
            notify.on_tick(
                Tick(
                    Telemetry(machine="box", t=t, gpus=[]),
                    [JobInfo.model_validate({**JOB, "started_at": start, **j}) for j in jobs],
                    None,
                )
            )

        finished = {
            "id": "box-1",
            "state": "exited",
            "exit_code": 0,
            "step": 2000,
            "max_steps": 2000,
            "loss": 0.4213,
            "ended_at": start + 5,
        }
        failed = {
            "id": "box-2",
            "state": "failed",
            "exit_code": 1,
            "step": 17,
            "error": "exited with code 1",
            "ended_at": start + 6,
            "last_lines": ["step 17", "Traceback (most recent call last):", "RuntimeError: CUDA error: out of memory"],
        }
        lost = {"id": "box-3", "state": "lost", "ended_at": start + 7}
        stopped = {"id": "box-4", "state": "exited", "exit_code": -15, "stop_requested": "stop", "ended_at": start + 8}
        old = {"id": "box-5", "state": "failed", "exit_code": 1, "ended_at": start - 3600}  # before notifications began
        running = {"id": "box-6", "state": "running", "step": 40}
        for t in range(0, 200, 10):  # box-6 makes no step for 200 s: stalled once (after 60 s), not at every tick
            tick(start + t, finished, failed, lost, stopped, old, running)
        await wait_for(lambda: len(receiver.received) >= 4, timeout=20)
        tick(start + 210, {**running, "step": 41})  # it moves again ...
        for t in range(220, 300, 10):
            tick(start + t, {**running, "step": 41})  # ... and stalls again at the new step: a new event
        await wait_for(lambda: len(receiver.received) >= 5, timeout=20)
        assert notify.outbox.pending_count("hook") == 0
        sent = [r["json"] for r in receiver.received]
        assert Counter((s["kind"], s["job"]) for s in sent) == {
            ("job_finished", "box-1"): 1,
            ("job_failed", "box-2"): 1,
            ("job_failed", "box-3"): 1,
            ("job_stalled", "box-6"): 2,
        }
        done = next(s for s in sent if s["kind"] == "job_finished")
        assert done["level"] == "info" and done["details"]["final_loss"] == 0.4213 and "final loss 0.4213" in done["message"]
        crash = next(s for s in sent if s["job"] == "box-2")
        assert crash["level"] == "critical" and crash["details"]["last_lines"][-1] == "RuntimeError: CUDA error: out of memory"
        assert "no new step for 1 min" in next(s for s in sent if s["kind"] == "job_stalled")["message"]
    finally:
        await notify.stop()
        agent.store.close()
        receiver.stop()


async def test_a_notification_not_accepted_within_give_up_after_is_dropped_and_counted(tmp_path):
    from agents.notify.component import NotifyComponent
    from agents.runtime.store import Store
    from agents.shell.agent import Agent

    dead = Receiver().start()
    dead.stop()
    lab = parse_lab(
        "lab: t\nmachines: [{name: box, gpus: {sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}]}}]\n"
        f"notify: {{retry_first: 0.1s, retry_max: 0.2s, give_up_after: 1s, routes: [{{name: hook, kind: webhook, "
        f"url: 'http://127.0.0.1:{dead.port}/hook'}}]}}\n",
        path=tmp_path / "lab.yaml",
    )
    agent = Agent(lab, "box", tmp_path, components=lambda core: [NotifyComponent(core)])
    notify = agent.find(NotifyComponent)
    assert notify is not None
    agent.store = Store(tmp_path / "state.db")
    await agent.start_components()
    try:
        answer = await notify.test("hook")
        assert not answer.ok and "Connect" in answer.answer
        hot_gpu = Notification(
            status="firing",
            kind=Kind.GPU_HOT,
            rule="gpu_hot",
            level=Level.CRITICAL,
            lab="t",
            machine="box",
            target="gpu0",
            message="gpu0 at 95 C",
            at=0.0,
            alert_id="box#1",
        )
        notify._queue(Kind.GPU_HOT, "box#1:firing", hot_gpu)

        def dropped() -> bool:
            (route,) = notify.status().routes
            return route.dropped == 1 and route.queued == 0

        await wait_for(dropped, timeout=20)
        (route,) = notify.status().routes
        assert route.failures >= 2 and route.last_failure is not None and route.last_failure.answer.startswith("given up after")
    finally:
        await notify.stop()
        agent.store.close()


def test_notify_test_without_a_route_is_a_usage_error_before_any_machine_is_dialled(tmp_path, capsys):
    from console.cli.main import main

    lab = tmp_path / "lab.yaml"
    lab.write_text(
        "lab: t\nmachines: [{name: box, port: 1}]\nnotify:\n  routes:\n    - {name: a, kind: command, argv: [/bin/true]}\n"
    )
    for argv in (["alerts", "notify-test"], ["alerts", "--ack", "box#1", "notify-test", "a"]):
        with pytest.raises(SystemExit) as done:
            main(["--lab", str(lab), *argv])
        assert done.value.code == 2
    assert "notify-test needs ROUTE" in capsys.readouterr().err


def test_a_secret_url_is_redacted_in_every_form_an_answer_may_echo(tmp_path, monkeypatch):
    """An endpoint's error may echo the whole hook URL, its path, its last segment alone (Slack's token) or a
    user-as-token: each is replaced."""
    from agents.notify.secrets import endpoint, redact
    from agents.wire.lab.model import parse_lab

    monkeypatch.setenv("HOOK", "https://hooks.example.com/services/T0AAAA/B0BBBB/XXsecrettokenXX")
    monkeypatch.setenv("USERHOOK", "https://tok3nAsUser@example.com/push")
    lab = parse_lab(
        "lab: t\nmachines: [{name: box}]\nnotify:\n  routes:\n"
        "    - {name: chat, kind: webhook, format: slack, url_env: HOOK}\n"
        "    - {name: user, kind: webhook, url_env: USERHOOK}\n"
    )
    chat, user = (endpoint(route, tmp_path) for route in lab.notify.routes)
    answer = redact("HTTP 404: no_team for XXsecrettokenXX (/services/T0AAAA/B0BBBB/XXsecrettokenXX)", chat.secrets)
    assert "XXsecrettokenXX" not in answer and "<secret>" in answer
    assert "tok3nAsUser" not in redact("401: bad credentials for user tok3nAsUser", user.secrets)


def test_alerts_lists_a_troubled_route_before_those_that_deliver():
    """:alerts has a few lines for its routes (8): with two routes on four machines the last were cut at 80x24, a
    failing one among them. The troubled ones come first."""
    from agents.wire.sections.notify import Delivery, RouteStatus
    from console.lab.notify import troubled_first

    ok = Delivery(at=2.0, ok=True, answer="HTTP 200")
    failed = Delivery(at=3.0, ok=False, answer="HTTP 500")

    def route(name, **kw):
        return RouteStatus(name=name, kind="webhook", target="$HOOK", **kw)

    routes = [
        ("a", route("chat", last_delivery=ok)),
        ("b", route("chat", last_delivery=ok, last_failure=failed)),
        ("a", route("pager", problem="$PAGER is not set")),
        ("c", route("chat", queued=2)),
        ("d", route("chat")),
    ]
    order = [(m, r.name) for m, r in troubled_first(routes)]
    assert order == [("b", "chat"), ("a", "pager"), ("c", "chat"), ("a", "chat"), ("d", "chat")]
