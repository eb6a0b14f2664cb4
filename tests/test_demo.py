"""The demo lab's set-up: a complete client-side lab.yaml, keys, known_hosts; --scale emulation."""

from __future__ import annotations

import stat

from agents.wire.lab.model import load_lab
from console.demo import DemoLab


def test_prepare_writes_a_complete_lab(tmp_path):
    demo = DemoLab(tmp_path / "d")
    lab = load_lab(demo.prepare())
    assert [m.name for m in lab.machines] == ["m5", "irina", "workstation", "pharaoh"]
    assert all(m.host == "127.0.0.1" for m in lab.machines)
    assert len({m.port for m in lab.machines}) == 4
    key = lab.resolve(lab.console.key)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    known = lab.resolve(lab.console.known_hosts).read_text().splitlines()
    assert [line.split()[0] for line in known] == [f"[127.0.0.1]:{m.port}" for m in lab.machines]
    assert (tmp_path / "d" / "demo" / "train.jsonl").exists()  # the demo recipe's assets travel with it


def test_scale_emulates_machines_of_eight_gpus(tmp_path):
    lab = load_lab(DemoLab(tmp_path / "s", scale=3).prepare())
    assert [m.name for m in lab.machines] == ["node000", "node001", "node002"]
    assert all(len(m.gpus.sim) == 8 for m in lab.machines)
    assert not lab.models and not lab.trainers  # they name the demo lab's machines


def test_scale_256_writes_a_lab_file_that_loads(tmp_path):
    """The issue's benchmark lab: 256 machines (once refused for its 256 YAML aliases of one shared GPU list)."""
    path = DemoLab(tmp_path / "big", scale=256).prepare()
    assert "*" not in path.read_text()  # a plain file, one GPU list per machine
    lab = load_lab(path)
    assert len(lab.machines) == 256 and sum(len(m.gpus.sim) for m in lab.machines) == 2048
