"""What the CLI's verbs say: usage errors in words (timeouts, alert ids, names), a wait that ends, one plural rule."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from agents.shell.doctor import check_gpus
from agents.wire.lab.model import load_lab
from agents.wire.words import plural
from console.cli.lab import cmd_check
from console.cli.main import main as cli_main
from widgets.format import plural as format_plural

pytestmark = pytest.mark.timeout(180)


# ---------------------------------------------------------------------------- 8: --timeout


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_timeout_that_cannot_wait_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as info:
        cli_main(["--lab", "nowhere.yaml", "--timeout", value, "status"])
    assert info.value.code == 2
    assert "--timeout" in capsys.readouterr().err


def test_wait_timeout_of_models_must_be_positive_too(capsys):
    with pytest.raises(SystemExit) as info:
        cli_main(["--lab", "nowhere.yaml", "warm", "a", "--wait-timeout", "0"])
    assert info.value.code == 2 and "--wait-timeout" in capsys.readouterr().err


# ---------------------------------------------------------------------------- 7: alerts --ack


@pytest.mark.parametrize("alert_id", ["nosuch", "box-1", "box-12", "box#", "#3", "box#x"])
def test_an_alert_id_that_is_not_one_is_a_usage_error(alert_id, capsys):
    """An alert id is "<machine>#<n>": a job id (box-1) or a typo is refused before anything is asked, naming the form."""
    with pytest.raises(SystemExit) as info:
        cli_main(["--lab", "nowhere.yaml", "alerts", "--ack", alert_id])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"{alert_id!r} is not an alert id: alert ids are <machine>#<n>, e.g. m5#12" in err, err
    assert "no machine named" not in err


class ScriptedModels:
    """A CLI context whose models.get answers a script of states, the last one repeated (the wait's logic alone)."""

    def __init__(self, states: list[tuple[str, str | None]]):
        self.states = states
        self.args = type("Args", (), {"json": False})()
        self.lab = type("Lab", (), {"models": [type("M", (), {"name": "p", "machine": "box", "replicas": []})()], "lab": "x"})()

    async def call(self, machine, method, params, timeout=None):
        state, op = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        history = [{"t": 0.0, "event": "sleep", "from_state": "warm", "to_state": "sleeping", "detail": None}]
        return {
            "name": "p",
            "machine": "box",
            "engine": "sim",
            "since": 0.0,
            "path": "models/p",
            "gpus": [0],
            "state": state,
            "op": op,
            "history": history,
        }

    async def request(self, machine, method, params, timeout=None):
        from agents.wire.catalogue.method import validate_reply

        return validate_reply(method, await self.call(machine, method.name, params, timeout))


def test_a_wait_for_warm_ends_when_the_model_settles_asleep_and_says_why(capsys):
    from console.cli.models import SettledElsewhere, wait_settled

    ctx = ScriptedModels([("loading", "warm"), ("warm", "sleep"), ("sleeping", None)])
    with pytest.raises(SettledElsewhere) as info:
        asyncio.run(wait_settled(ctx, "p", ("warm",), timeout_s=30))
    assert "p settled sleeping, not warm: its last move was sleep (warm → sleeping)" in info.value.message


def test_a_bad_name_is_refused_in_words_not_with_the_pattern():
    """`cetlab gateway keys add 'bad name!'` printed pydantic's raw regular expression."""
    from pydantic import ValidationError

    from agents.runtime.rpc import _params_error
    from agents.wire.catalogue.gateway import KeyAddParams

    with pytest.raises(ValidationError) as info:
        KeyAddParams.model_validate({"name": "bad name!"})
    message = _params_error(info.value)
    assert (
        message
        == "name: 'bad name!' is not a name: letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64"
    )
    assert "^[" not in message


def test_the_agents_start_line_says_no_gpus_in_words_and_a_cpu_model_is_on_its_cpu():
    from agents.shell.agent import gpus_said
    from agents.wire.sections.models import ModelInfo
    from console.cli.models import model_human

    assert gpus_said("none", "no GPUs (lab.yaml says gpus: none)") == "no GPUs (lab.yaml says gpus: none)"
    assert gpus_said("nvml", "no NVIDIA GPUs: the driver reports none") == "no NVIDIA GPUs: the driver reports none"
    assert gpus_said("nvml", None) == "nvml GPUs: ok" and gpus_said("sim", "ok") == "sim GPUs: ok"
    cpu = ModelInfo(name="tiny", machine="box", engine="transformers", state="warm", since=0.0, gpus=[])
    assert model_human(cpu).startswith("tiny on box CPU: "), model_human(cpu)
    assert model_human(cpu.model_copy(update={"gpus": [0, 1]})).startswith("tiny on box GPU 0,1: ")


async def test_a_count_of_one_reads_in_the_singular_through_one_rule(tmp_path, capsys):
    """Before: "1 machines", "1 models", "1 GPUs", each place spelling its own plural; one rule now (agents/wire/words.py), used
    by the CLI, the doctor, the views and the agents' messages."""
    assert [plural(n, "machine") for n in (0, 1, 2)] == ["0 machines", "1 machine", "2 machines"]
    assert plural(1, "entry") == "1 entry" and plural(3, "entry") == "3 entries" and plural(2, "x", "xen") == "2 xen"
    lab = tmp_path / "lab.yaml"
    lab.write_text(
        "lab: one\nmachines:\n  - {name: box, gpus: {sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}]}}\n"
        "models:\n  - {name: m, path: m, engine: sim, machine: box, vram_gib: 1}\n"
    )
    assert await cmd_check(argparse.Namespace(path=str(lab), lab=None, json=False)) == 0
    assert capsys.readouterr().out.strip() == f"{lab}: lab one: 1 machine, 1 model: valid"
    assert check_gpus(load_lab(lab), "box").message == "SIMULATED: 1 GPU from lab.yaml"
    assert format_plural is plural  # the views import the same rule, not a copy of it
