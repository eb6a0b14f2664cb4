"""What tests/fast/cli/test_hostile_every_verb.py, tests/fast/tui/test_hostile_every_view.py share: ESCAPES, HOSTILE,
LONG, PLAIN, hostile_reply."""

from __future__ import annotations

import enum
import types
import typing
from datetime import date, datetime
from typing import Any

from pydantic import BaseModel, ValidationError

ESCAPES = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;pwn\x07\x1b[2J\x1b[6n\x9b31m\u202e"


HOSTILE = f"[bold red]x[/] [link=https://evil.example]l[/link] {ESCAPES}"


LONG = HOSTILE + "A" * 10_240  # a 10 kB line


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
