"""`cetlab lab doctor` (doctor.run on every machine, one matrix), and a console newer than an agent (issue 29 items 4, 5)."""

from __future__ import annotations

import argparse
import asyncio
import json
import threading

from agents import __version__
from agents.shell import doctor_method
from agents.shell.doctor import OK, Check, run_checks
from agents.wire.catalogue.doctor import DOCTOR_RUN, DoctorParams
from agents.wire.catalogue.method import request
from agents.wire.catalogue.models import MODELS_SWAP, SwapParams
from agents.wire.lab.model import load_lab
from agents.wire.protocol import ErrorCode, Hello, RemoteError, Role
from console.cli.doctor import cmd_doctor
from console.cli.main import Context
from console.lab.status import status_human, status_json
from tests.support.lab_doctor import P40, TWO, connected


async def test_doctor_run_needs_an_operator(in_process):
    lab = await in_process()
    viewer = await connected(lab, Role.VIEWER)
    try:
        await request(viewer, "box", DOCTOR_RUN, DoctorParams())
    except RemoteError as exc:
        assert exc.code == ErrorCode.FORBIDDEN and "operator" in exc.message
    else:
        raise AssertionError("a viewer ran the doctor")


async def test_checks_past_the_deadline_are_said_and_the_agent_keeps_answering(in_process, monkeypatch):
    release = threading.Event()
    runs = []

    def steps(lab, machine, state_dir, held):
        runs.append(machine)
        return [
            ("quick", lambda: [Check("quick", OK, "done")]),
            ("torch", lambda: [release.wait(60) and Check("torch", OK, "late")]),
        ]

    monkeypatch.setattr(doctor_method, "check_steps", steps)
    lab = await in_process()
    client = await connected(lab)
    try:
        report = await request(client, "box", DOCTOR_RUN, DoctorParams(timeout_s=0.5), timeout=60)
        assert not report.complete
        assert [c.name for c in report.checks] == ["quick", "doctor: torch"]
        assert "did not finish within" in report.checks[1].message and "--within" in (report.checks[1].fix or "")
        assert await client.call("box", "ping")  # the loop was never blocked
        again = await asyncio.gather(
            *(request(client, "box", DOCTOR_RUN, DoctorParams(timeout_s=0.2), timeout=60) for _ in range(5))
        )
        assert runs == ["box"] and not any(r.complete for r in again)  # one run in flight at a time: no thread per call
    finally:
        release.set()


async def test_lab_doctor_prints_one_matrix_with_an_unreachable_machine_as_a_column(in_process, capsys):
    lab = await in_process(TWO, machines=["box"])
    client = await connected(lab)
    args = argparse.Namespace(json=False, within=60.0, machine=[])
    code = await cmd_doctor(Context(args, lab.lab, client))
    out = capsys.readouterr().out
    assert code == 1, out  # ghost was not asked
    header = next(line for line in out.splitlines() if line.startswith("check"))
    assert header.split() == ["check", "box", "ghost"]
    assert next(line for line in out.splitlines() if line.startswith("agent")).split()[1:] == [
        "cetlab",
        __version__,
        "UNREACHABLE",
    ]
    gpus = next(line for line in out.splitlines() if line.startswith("gpus "))
    assert gpus.split() == ["gpus", "ok", "-"]
    assert "ghost: not asked:" in out and "fix: ssh 127.0.0.1 cetlab-agent doctor --machine ghost" in out

    args.json = True
    await cmd_doctor(Context(args, lab.lab, client))
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and data["machines"]["ghost"]["reached"] is False
    assert data["machines"]["box"]["reached"] and any(c["name"] == "gpus" for c in data["machines"]["box"]["checks"])


def test_no_vllm_warning_where_no_model_needs_vllm(lab_file, tmp_path):
    """A P40 cannot run vLLM: said in its support line, but no WARN unless a model lab.yaml places there needs it."""
    lab = load_lab(lab_file({"lab": "t", "machines": [{"name": "box", "gpus": {"sim": [P40]}}]}))
    checks = run_checks(lab, "box", tmp_path / "state")
    assert "vLLM no" in next(c.message for c in checks if c.name == "gpu 0 support")
    assert not [c for c in checks if c.name == "gpu 0 vLLM"]


# ---------------------------------------------------------------------------- a console newer than its agent


def make_older(agent, lacks: list[str], said_methods: bool = True) -> None:
    """An agent of an older cetlab: its registry lacks these methods, and its hello says the catalogue it knows without
    them (without said_methods, its hello says no catalogue at all, as before the field, and an older version)."""
    from agents.wire.catalogue.index import CATALOGUE

    for name in lacks:
        agent.rpc.specs.pop(name)
        agent.rpc._handlers.pop(name)
    hello = agent.rpc._handlers["hello"]
    known = None if not said_methods else [m for m in CATALOGUE if m not in lacks]
    version = __version__ if said_methods else "0.0.9"

    async def old_hello(peer, params) -> Hello:
        return (await hello(peer, params)).model_copy(update={"methods": known, "agent_version": version})

    agent.rpc._handlers["hello"] = old_hello


async def test_an_older_agent_says_what_it_cannot_do_and_the_rest_works(in_process):
    lab = await in_process()
    make_older(lab.agents["box"], ["models.swap", "models.pin", "doctor.run"])
    client = await connected(lab)
    view = client.state.machines["box"]
    assert view.agent_version == __version__
    assert view.lacking() == {
        "`cetlab swap`": ["models.swap"],
        "`cetlab pin`": ["models.pin"],
        "`cetlab lab doctor`": ["doctor.run"],
    }
    try:
        await request(client, "box", MODELS_SWAP, SwapParams(out="a", **{"in": "b"}))
    except RemoteError as exc:
        assert exc.code == ErrorCode.METHOD_NOT_FOUND
        assert exc.message == f"box runs cetlab {__version__}, which has no `cetlab swap` (models.swap): run `cetlab lab upgrade`"
    else:
        raise AssertionError("a method the agent lacks was called")
    assert await client.call("box", "ping")  # the rest keeps working
    data = status_json(client.state)
    box = data["machines"][0]
    assert box["agent_version"] == __version__ and box["lacks"]["`cetlab swap`"] == ["models.swap"]
    text = status_human(data)
    assert f"cetlab {__version__}" in text.splitlines()[1]
    assert "no `cetlab swap`, `cetlab pin`, `cetlab lab doctor` there (the rest works): run `cetlab lab upgrade`" in text
    from console.tui.screens.fleet import card_note

    assert "older than this console" in (card_note(view) or "")  # the fleet card says it too


async def test_an_agent_that_lists_no_methods_still_answers_a_missing_one_with_its_version(in_process):
    lab = await in_process()
    make_older(lab.agents["box"], ["doctor.run"], said_methods=False)
    client = await connected(lab)
    assert client.state.machines["box"].lacking() == {}  # unknown: nothing is said before it is asked
    try:
        await request(client, "box", DOCTOR_RUN, DoctorParams())
    except RemoteError as exc:
        assert exc.message == "box runs cetlab 0.0.9, which has no `cetlab lab doctor` (doctor.run): run `cetlab lab upgrade`"
    else:
        raise AssertionError("doctor.run answered on an agent without it")


def test_a_full_agent_lacks_nothing(lab_file):
    from agents.runtime.view import MachineView

    lab = load_lab(lab_file())
    view = MachineView(lab.machine("box"))
    assert view.lacking() == {}  # no hello yet: nothing said


async def test_a_machine_without_the_gateway_lacks_nothing(in_process):
    lab = await in_process()
    client = await connected(lab)
    assert client.state.machines["box"].lacking() == {}  # gateway.* are not served here, and known
    assert "older than this console" not in status_human(status_json(client.state))
