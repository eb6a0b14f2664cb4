"""What tests/e2e/orchestra/test_checkpoints_port.py, tests/fast/orchestra/test_checkpoints_port.py share: MACHINE,
small_core."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.runtime.store import Store
from agents.wire.lab.model import parse_lab
from tests.support.small_core import SmallCore

MACHINE = "machines: [{name: box, gpus: {sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}]}}]\n"


def small_core(tmp_path: Path, extra: str = "", parts: tuple[Any, ...] = ()) -> SmallCore:
    lab = parse_lab("lab: t\n" + MACHINE + extra)
    return SmallCore(
        lab=lab, machine=lab.machine("box"), state_dir=tmp_path, store=Store(tmp_path / "state.db"), parts=list(parts)
    )
