"""`cetlab machine remove --purge` leaves no empty cetlab folder behind and spares what else is there."""

from __future__ import annotations

import subprocess
from pathlib import Path

from console.machine import remote


def test_a_purge_leaves_no_empty_cetlab_folder_behind_and_spares_what_else_is_there(tmp_path):
    """--purge took the agent's state folder but left ~/.local/state/cetlab (and ~/.cache/cetlab) empty behind; the
    folders go when nothing else is in them, and a folder with something else in it stays with it."""
    home = tmp_path / "home"
    layout = remote.Layout(
        home=str(home),
        base=f"{home}/.local/share/cetlab",
        venvs=f"{home}/.local/share/cetlab/venvs",
        venv=f"{home}/.local/share/cetlab/venv",
        wheelhouse=f"{home}/.cache/cetlab/wheelhouse",
        lab=f"{home}/.local/share/cetlab/lab.yaml",
        state=f"{home}/.local/state/cetlab/agent-box",
    )
    for folder in (layout.state + "/runs", layout.venvs + "/k1", layout.wheelhouse + "/k1"):
        Path(folder).mkdir(parents=True)
        (Path(folder) / "file").write_text("x")
    mine = home / ".local" / "state" / "other-tool"
    mine.mkdir(parents=True)
    subprocess.run(["sh", "-c", remote.purge(layout, uid=1000)], check=True)
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == [
        ".cache",
        ".local",
        ".local/share",
        ".local/state",
        ".local/state/other-tool",
    ]

    # a second agent's state beside it (another name on the same machine): its folder is kept, with it
    Path(layout.state).mkdir(parents=True)
    (home / ".local" / "state" / "cetlab" / "agent-b").mkdir()
    subprocess.run(["sh", "-c", remote.purge(layout, uid=1000)], check=True)
    assert [p.name for p in (home / ".local" / "state" / "cetlab").iterdir()] == ["agent-b"]
