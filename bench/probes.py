"""The registry of bench/bench_attacks.py's probes: each bench/attacks_*.py module registers its own, here.

A probe is one async function (demo, viewer key, seconds, results) that attacks the agent of bench_attacks' LAB for
`seconds` from its own process and writes its figures into `results` (JSON). A new attack is that one function, in the
attacks_*.py module of its issue (or a new one: every bench/attacks_*.py is loaded), under one decorator:

    @probe("R13 a hostile thing, in a few words")
    async def r13_hostile_thing(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None: ...

The name starts with the finding's id (`--only R13` picks it); the bench runs the probes by series (SERIES), then number.
`logins=True` marks an attack at the login door: the legitimate console's fresh logins are measured meanwhile too.
What the bench's own console must do first (issue a gateway key the probe uses) is a `@before` function (demo,
client), run before every probe and done once per lab by its own check.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agents.shell.demo.lab import DemoLab
    from console.lab.client import FleetClient

Attack = Callable[["DemoLab", Path, float, dict], Awaitable[None]]
Setup = Callable[["DemoLab", "FleetClient"], Awaitable[None]]

# The finding series in the order the reviews raised them: issue 11's findings by bare number (5, 6, 7), issue 21's N,
# issue 30's R and S, issue 29's L, issue 31's K, T and E, the class review's C, issue 31's rpc helpers X. A series not listed runs after these.
SERIES = ("", "N", "R", "S", "L", "K", "T", "E", "C", "X")
_ID = re.compile(r"([A-Z]*)(\d+) ")


@dataclass(frozen=True)
class Probe:
    name: str  # "N3 gateway idle flood": the finding's id, then what the attack does
    run: Attack
    logins: bool = False  # at the login door: fresh console logins measured during it too

    def order(self) -> tuple[int, str, int]:
        series, number = _ID.match(self.name).groups()  # type: ignore[union-attr]  # checked by probe()
        return (SERIES.index(series) if series in SERIES else len(SERIES), series, int(number))


_PROBES: list[Probe] = []
_SETUPS: list[Setup] = []


def probe(name: str, *, logins: bool = False) -> Callable[[Attack], Attack]:
    """Register the decorated function as the probe `name` (its finding's id first, then what it does)."""
    if not _ID.match(name):
        raise ValueError(f"probe {name!r}: a name starts with its finding's id and a space, e.g. 'R13 what it does'")
    if any(p.name == name for p in _PROBES):
        raise ValueError(f"probe {name!r} is registered twice")

    def register(run: Attack) -> Attack:
        _PROBES.append(Probe(name, run, logins))
        return run

    return register


def before(setup: Setup) -> Setup:
    """Register what the bench's console does before every probe (once per lab: the function checks)."""
    _SETUPS.append(setup)
    return setup


def _load() -> None:
    for module in sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])):
        if module.startswith("attacks_"):
            importlib.import_module(f"bench.{module}")


def probes() -> dict[str, Probe]:
    """Every bench/attacks_*.py module's probes, by name, in the order the bench runs them."""
    _load()
    return {p.name: p for p in sorted(_PROBES, key=Probe.order)}


def setups() -> list[Setup]:
    """Every module's `@before` functions, in the order the modules load."""
    _load()
    return list(_SETUPS)
