"""The CLI against replies a patched agent could send: alerts that do not validate are said (not "no alerts"), a
sim-override's numbers are checked before they go out, an agent's text never reaches the terminal as control codes, and
`costs --json` prints the agent's numbers as it sent them."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import pytest

from agents.wire.lab.model import parse_lab
from agents.wire.protocol import ErrorCode, LinkStatus, RemoteError
from console.cli import main as cli
from console.cli.costs import cmd_alerts
from console.cli.main import Context
from console.lab.state import LabState

HOSTILE = "\x1b]0;pwned\x07\x1b[2J[bold red]EVIL[/]\x9b31m\x7f"


class Machines:
    """FleetClient as a verb sees it: the lab's state and `call`, each machine answering what a (patched) agent would."""

    def __init__(self, lab_text: str, answers: dict[str, dict[str, Any]]) -> None:
        self.state = LabState(parse_lab(lab_text))
        for name in self.state.machines:
            self.state.set_link(name, LinkStatus.ONLINE)
        self.answers = answers

    async def call(self, machine: str, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        answer = self.answers[machine][method]
        if isinstance(answer, RemoteError):
            raise answer
        return answer


def alert(machine: str, n: int, **changes: Any) -> dict[str, Any]:
    return {
        "id": f"{machine}#{n}",
        "n": n,
        "machine": machine,
        "rule": "gpu_hot",
        "target": "gpu0",
        "level": "warning",
        "message": "gpu0 at 90 C",
        "fired_at": time.time() - 60,
        **changes,
    }


def route(machine: str) -> dict[str, Any]:
    return {"machine": machine, "routes": [{"name": "chat", "kind": "command", "target": "/bin/true", "delivered": 3}]}


LAB = "lab: t\nmachines: [{name: good, port: 1}, {name: bad, port: 2}]\nnotify:\n  routes:\n    - {name: chat, kind: command, argv: [/bin/true]}\n"


async def alerts(capsys, answers: dict[str, dict[str, Any]], *argv: str) -> tuple[int, str]:
    parser = cli.build_parser()
    args = parser.parse_args([*argv, "alerts", "--all"])
    machines = Machines(LAB, answers)
    code = await cmd_alerts(Context(args, machines.state.lab, machines))  # type: ignore[arg-type]
    return code, capsys.readouterr().out


async def test_alerts_says_which_machine_answered_badly(capsys):
    answers = {
        "good": {"alerts.list": {"machine": "good", "alerts": [alert("good", 1)]}, "notify.status": route("good")},
        "bad": {
            "alerts.list": {"machine": "bad", "alerts": [alert("bad", 2, level="dancing")]},
            "notify.status": {"machine": "bad", "routes": [{"name": "chat"}]},
        },
    }
    code, out = await alerts(capsys, answers)
    assert code == 0  # a partial answer, as `cetlab jobs` gives it
    assert "good#1" in out and "bad: alerts not read:" in out and "alerts.list" in out, out
    assert "chat (command → /bin/true) from good" in out and "bad: route status not read:" in out and "notify.status" in out
    code, out = await alerts(capsys, answers, "--json")
    data = json.loads(out)
    assert [a["id"] for a in data["alerts"]] == ["good#1"] and [r["machine"] for r in data["routes"]] == ["good"]
    assert list(data["offline"]) == ["bad"] and "alerts.list" in data["offline"]["bad"]
    assert list(data["routes_offline"]) == ["bad"] and "notify.status" in data["routes_offline"]["bad"]


async def test_alerts_with_no_machine_answering_fails(capsys):
    gone = RemoteError(ErrorCode.DISCONNECTED, "gone")
    broken = {"machine": "good", "alerts": [alert("good", 1, fired_at="soon")]}
    answers: dict[str, dict[str, Any]] = {
        "good": {"alerts.list": broken, "notify.status": gone},
        "bad": {"alerts.list": gone, "notify.status": gone},
    }
    code, out = await alerts(capsys, answers)
    assert code == 1 and "no alerts from the machines that answered" in out and "good: alerts not read:" in out, out


def test_an_agents_error_message_reaches_the_terminal_visible(capsys, monkeypatch):
    async def refused(args: argparse.Namespace) -> int:
        raise RemoteError(ErrorCode.INVALID_PARAMS, f"no job {HOSTILE}")

    monkeypatch.setattr(cli, "run", refused)
    assert cli.main(["--lab", "nowhere.yaml", "status"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cetlab: no job ") and "[bold red]EVIL[/]" in err
    assert not any(c in err for c in "\x1b\x07\x9b\x7f"), repr(err)
    assert "␛]0;pwned␇␛[2J" in err


def test_costs_json_keeps_the_int_0_of_the_agents_sums():
    """`cloud_tokens` and the gateway's API spend are money; a sum over nothing is the agent's int 0, and `--json` printed it
    so before the wire was typed (a float where the agent sent one)."""
    from agents.wire.catalogue.costs import COSTS_GET
    from agents.wire.catalogue.method import validate_reply
    from console.lab.costs import lab_costs

    hub = validate_reply(
        COSTS_GET,
        {
            "machine": "hub",
            "currency": "EUR",
            "timezone": "UTC",
            "simulated": True,
            "now": {"power_w": 300.0, "per_hour": 0.09},
            "today": {"kwh": 1.5, "cost": 0.45},
            "month": {"kwh": 10.0, "cost": 3.0},
            "since": {"day": "2026-11-01", "cost": 3.0},
            "by": [{"machine": "hub", "tokens": 0, "cloud_tokens": 0}, {"machine": "hub", "tokens": 9, "cloud_tokens": 0.5}],
            "api": {
                "today": 0.25,
                "month": 0,
                "since": 0,
                "providers": [{"provider": "openai", "today": 0.25, "month": 0, "since": 0}],
            },
        },
    )
    data = lab_costs("EUR", {"hub": hub}, "machine").to_json()
    assert [type(row["cloud_tokens"]) for row in data["by"]] == [int, float]
    (provider,) = data["api_providers"]
    assert type(provider["month"]) is int and type(provider["since"]) is int and provider["today"] == 0.25
    assert type(data["api_month"]) is int and type(data["api_since"]) is int


def test_agent_text_logged_on_the_way_reaches_the_terminal_with_its_controls_visible(capfd):
    """Hardening IV, R8: an unanswered error reply's message is logged (agents.runtime.link); the CLI's logging shows
    it as `visible` does, whichever logger and arguments carry it (before: OSC 52, a title, a screen clear on stderr)."""
    import logging

    from widgets.terminal import VisibleFormatter

    root = logging.getLogger()
    try:
        with pytest.raises(SystemExit):
            cli.main(["--help"])  # the CLI sets its logging up before it reads its arguments
        capfd.readouterr()
        logging.getLogger("cetlab.link").warning("%s: %s", "box", HOSTILE + "\x1b]52;c;cm0gLXJmIH4=\x07")
        logging.getLogger("cetlab.client").error(HOSTILE)
        err = capfd.readouterr().err
        assert "box: " in err and "[bold red]EVIL[/]" in err  # said, as text
        assert not any(c in err for c in "\x1b\x07\x9b\x7f"), repr(err)
        assert "␛]52;c;" in err
    finally:
        for handler in [h for h in root.handlers if isinstance(h.formatter, VisibleFormatter)]:
            root.removeHandler(handler)
