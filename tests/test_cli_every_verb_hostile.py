"""Every CLI verb's human output over replies whose every string is hostile (issue 30, item 5): a clipboard write (OSC
52), a title set, a screen clear, a terminal query, markup and a 10 kB line, in each string field of each method's
reply (built from the catalogue's result models, so a new method or field is covered without a line here). Each verb
runs against a fake fleet that answers them; none prints a control character raw, and none crashes (an error reply or a
usage error is an answer; a traceback is not)."""

from __future__ import annotations

import argparse
import enum
import types
import typing
from datetime import date, datetime
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from agents.runtime.waits import within
from agents.wire.catalogue.index import CATALOGUE
from agents.wire.lab.model import parse_lab
from agents.wire.protocol import LinkStatus, RemoteError
from console.cli import main as cli
from console.cli.main import Context
from console.lab.state import LabState

ESCAPES = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;pwn\x07\x1b[2J\x1b[6n\x9b31m\u202e"
HOSTILE = f"[bold red]x[/] [link=https://evil.example]l[/link] {ESCAPES}"
LONG = HOSTILE + "A" * 10_240  # a 10 kB line
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


def _fill(ann: Any, text: str, depth: int = 0) -> Any:
    """A value of type `ann` whose every string is `text`."""
    origin = typing.get_origin(ann)
    if origin is typing.Annotated:
        return _fill(typing.get_args(ann)[0], text, depth)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(ann) if a is not type(None)]
        return _fill(options[0], text, depth) if options else None
    if origin is typing.Literal:
        return typing.get_args(ann)[0]
    if origin in (list, set, frozenset, tuple):
        args = [a for a in typing.get_args(ann) if a is not Ellipsis] or [str]
        return (
            [_fill(a, text, depth + 1) for a in args] if origin is tuple and len(args) > 1 else [_fill(args[0], text, depth + 1)]
        )
    if origin is dict:
        key, value = typing.get_args(ann) or (str, str)
        return {_fill(key, text, depth + 1): _fill(value, text, depth + 1)}
    if ann is str or ann is Any:
        return text
    if ann is bool:
        return True
    if ann is int:
        return 0  # a node_rank of 0: the job itself, not a node of it
    if ann is float:
        return 1.0
    if ann is datetime:
        return datetime.now().isoformat()
    if ann is date:
        return date.today().isoformat()
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        return next(iter(ann)).value
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        if "root" in ann.model_fields and len(ann.model_fields) == 1:
            return _fill(ann.model_fields["root"].annotation, text, depth)
        if depth > 6:
            return {}
        # a reply from box names box as its machine (a view files a row under the machine it names)
        return {
            info.alias or name: "box" if name == "machine" else _fill(info.annotation, text, depth + 1)
            for name, info in ann.model_fields.items()
        }
    return None


def _set(data: Any, loc: tuple[Any, ...], value: Any) -> None:
    for part in loc[:-1]:
        data = data[part]
    data[loc[-1]] = value


PLAIN = ["box", 1, True, "http://127.0.0.1:1/v1", "unix:/run/e.sock", "sm_80", date.today().isoformat(), None]


def hostile_reply(model: type[BaseModel], text: str) -> Any:
    """The model's data with `text` in every string field its validators let through (a field that refuses it, a day,
    an engine's name or an address, gets the first plain value it takes; one that takes none is left out), validated."""
    data = _fill(model, text)
    tried: dict[tuple[Any, ...], int] = {}
    for _ in range(500):
        try:
            model.model_validate(data)
            return data
        except ValidationError as exc:
            loc = tuple(exc.errors()[0]["loc"])
            if not loc:
                raise
            n = tried[loc] = tried.get(loc, -1) + 1
            try:
                if n < len(PLAIN):
                    _set(data, loc, PLAIN[n])
                else:
                    _drop(data, loc)
            except (KeyError, IndexError, TypeError):
                _drop(data, loc[:-1])
    raise AssertionError(f"no hostile reply for {model.__name__}")


def _drop(data: Any, loc: tuple[Any, ...]) -> None:
    for part in loc[:-1]:
        data = data[part]
    if isinstance(data, dict):
        data.pop(loc[-1], None)
    elif isinstance(data, list) and isinstance(loc[-1], int) and loc[-1] < len(data):
        del data[loc[-1]]


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
VALUES |= {"step": "1", "name": "k1", "out": "m1", "in_": "m2", "into": "m2", "gpu": "0", "route": "chat", "keep_last": "3"}


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
