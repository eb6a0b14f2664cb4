"""The attack bench's probe registry: every attacker's function in bench/attacks_*.py is a probe the bench runs."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

from bench import bench_attacks
from bench.probes import probe, probes

BENCH = Path(bench_attacks.__file__).resolve().parent


ATTACKER = ["demo", "viewer", "seconds", "results"]  # a probe's parameters


def test_every_attackers_function_in_the_attacks_modules_is_a_registered_probe():
    registered = {p.run for p in probes().values()}
    found = []
    for info in pkgutil.iter_modules([str(BENCH)]):
        if not info.name.startswith("attacks_"):
            continue
        module = importlib.import_module(f"bench.{info.name}")
        for name, function in inspect.getmembers(module, inspect.iscoroutinefunction):
            if function.__module__ == module.__name__ and list(inspect.signature(function).parameters) == ATTACKER:
                found.append(name)
                assert function in registered, f"bench/{info.name}.py: {name} is not registered (@probe)"
    assert len(found) == len(registered) >= 32  # the registry holds nothing else, and lost none of the bench's probes


def test_the_bench_runs_the_probes_by_series_then_number_and_knows_each_by_name():
    names = list(bench_attacks.PROBES)
    assert names[:5] == ["5 idle TCP flood", "6 history, unread", "6 subscribe topics", "6 1,000 channels", "7 refused calls"]
    ids = [name.split()[0] for name in names]
    assert ids.index("N10") < ids.index("R1") < ids.index("R5") < ids.index("R10") < ids.index("S1") < ids.index("C4")
    assert {name for name, p in bench_attacks.PROBES.items() if p.logins} == {"N10 login storm", "R10 version-line storm"}


def test_a_probe_without_its_findings_id_or_registered_twice_is_refused_saying_the_form():
    with pytest.raises(ValueError, match="starts with its finding's id"):
        probe("a flood without an id")
    with pytest.raises(ValueError, match="registered twice"):
        probe("N1 dropped streams")
