"""Every CLI verb's human output over replies whose every string is hostile (issue 30, item 5): a clipboard write (OSC
52), a title set, a screen clear, a terminal query, markup and a 10 kB line, in each string field of each method's
reply (built from the catalogue's result models, so a new method or field is covered without a line here). Each verb
runs against a fake fleet that answers them; none prints a control character raw, and none crashes (an error reply or a
usage error is an answer; a traceback is not)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from agents.runtime.waits import within
from agents.wire.catalogue.index import CATALOGUE
from agents.wire.lab.model import parse_lab
from agents.wire.protocol import LinkStatus, RemoteError
from console.cli import main as cli
from console.cli.main import Context
from console.lab.state import LabState
from tests.support.hostile_replies import HOSTILE, LONG, hostile_reply

RAW = ("\x1b", "\x07", "\x9b", "\u202e")


LAB = """
lab: t
machines:
  - {name: box, port: 1, gpus: {sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}]}}
models:
  - {name: m1, path: /nonexistent/m1, engine: sim, machine: box, gpus: [0], vram_gib: 1}
  - {name: m2, path: /nonexistent/m2, engine: sim, machine: box, gpus: [0], vram_gib: 1}
trainers:
  - {name: t1, machine: box, gpus: [0], command: [/bin/true], output_dir: /nonexistent/runs}
notify:
  routes:
    - {name: chat, kind: command, argv: [/bin/true]}
gateway: {machine: box}
"""


class Fleet:
    """FleetClient as a verb sees it: every machine online, answering each method with its hostile reply."""

    def __init__(self, text: str) -> None:
        self.state = LabState(parse_lab(LAB))
        for name in self.state.machines:
            self.state.set_link(name, LinkStatus.ONLINE)
        self.replies = {name: hostile_reply(method.result, text) for name, method in CATALOGUE.items()}
        for name in self.state.machines:  # what the client does on connecting: every section of `status`, hostile
            self.state.apply_status(name, self.replies["status"])

    async def call(self, machine: str, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        return self.replies[method]


VALUES = {"model": "m1", "models": "m1", "recipe": "t1", "machine": "box", "id": "box-1", "job": "box-1", "run": "r1"}


VALUES |= {
    "entry": "1",
    "step": "1",
    "name": "k1",
    "out": "m1",
    "in_": "m2",
    "into": "m2",
    "gpu": "0",
    "route": "chat",
    "keep_last": "3",
}


def verbs(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(words, parser) of every verb that dials machines, nested ones (gateway keys add) included."""
    found = []
    for action in parser._actions:  # argparse keeps its subparsers here only
        if isinstance(action, argparse._SubParsersAction):
            for word, sub in action.choices.items():
                found += verbs(sub, (*prefix, word))
    if prefix and parser.get_default("func") is not None:  # `gateway` shows the gateway; `gateway keys add` adds a key
        found.append((prefix, parser))
    return found


def argv_for(words: tuple[str, ...], parser: argparse.ArgumentParser) -> list[str]:
    """The verb's words and a plain value for each argument it requires."""
    argv = list(words)
    for action in parser._actions:
        if action.option_strings and not action.required:
            continue
        value = str(action.choices and next(iter(action.choices)) or VALUES.get(action.dest, "x"))
        if action.option_strings:
            argv += [action.option_strings[0], value]
        elif action.nargs != 0 and not isinstance(action, argparse._SubParsersAction):
            argv.append(value)
    return argv


VERBS = verbs(cli.build_parser())


def test_the_verbs_are_found():
    words = {" ".join(w) for w, _ in VERBS}
    assert {
        "status",
        "jobs",
        "models",
        "costs",
        "alerts",
        "audit",
        "logs",
        "gateway",
        "gateway keys add",
        "lab doctor",
    } <= words, words


async def run_verb(words: tuple[str, ...], text: str, capfd: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """One verb over the hostile fleet: its stdout and stderr (an error said as main() says it)."""
    fleet = Fleet(text)
    try:
        args = cli.build_parser().parse_args(argv_for(words, dict(VERBS)[words]))
    except SystemExit:
        pytest.fail(f"no argv found for {' '.join(words)}: {capfd.readouterr().err}")
    ctx = Context(args, fleet.state.lab, fleet)  # type: ignore[arg-type]
    try:
        await within(args.func(ctx), 5)  # a verb that follows or waits is cut: what it printed counts
    except (RemoteError, TimeoutError, SystemExit) as exc:
        cli.say(f"cetlab: {getattr(exc, 'message', exc)}", err=True)
    out = capfd.readouterr()
    return out.out, out.err


@pytest.mark.parametrize("text", [HOSTILE, LONG], ids=["escapes", "10 kB"])
@pytest.mark.parametrize("words", [w for w, _ in VERBS], ids=lambda w: " ".join(w))
async def test_every_verbs_output_shows_agent_text_inert(words, text, capfd):
    out, err = await run_verb(words, text, capfd)
    for stream, said in (("stdout", out), ("stderr", err)):
        raw = [c for c in RAW if c in said]
        assert not raw, f"{' '.join(words)} printed {raw} raw on {stream}: {said[:500]!r}"


@pytest.mark.parametrize("words", ["status", "jobs", "models", "alerts", "audit", "costs", "checkpoints", "gateway keys list"])
async def test_the_listing_verbs_print_the_agents_text_visible(words, capfd):
    """The agent's strings are printed, as their control pictures, not dropped (a verb that printed nothing would pass
    the test above without proving a thing)."""
    out, err = await run_verb(tuple(words.split()), HOSTILE, capfd)
    assert "␛]52;c;" in out + err and "[bold red]x[/]" in out + err, (out + err)[:500]
