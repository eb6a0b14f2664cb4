"""`cetlab machine`'s workstation side: USER@HOST[:PORT] checked where it enters, lab.yaml edited with its comments and
order kept (and never left unloadable), the agent's host key pinned as one line per [host]:port."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.machine.files import add_machine, pin_host_key, remove_machine, unpin_host_key
from console.machine.remote import Preflight
from console.machine.ssh import MachineError, Target
from console.machine.steps import FAIL, OK, judge

LAB = """\
# our lab: hand-written
lab: mine   # the name the console shows

machines:
  - name: old   # the first box
    host: 10.0.0.5
    gpus: none
# models come next: keep this note
models: []
"""


KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ9b0Q2bU2ZCq3lIY3pV0D2s2e7wQ0yq1bO8kR1E5cS1 cetlab-agent@box"


def test_a_target_is_user_host_and_port_or_a_clear_error():
    assert Target.parse("alice@gpu1:2222") == Target("alice", "gpu1", 2222)
    assert Target.parse("gpu1") == Target(None, "gpu1", None)
    assert Target.parse("root@[::1]:22") == Target("root", "::1", 22)
    for bad, said in (("al ice@h", "not a user name"), ("a@-oProxyCommand=x", "not a host"), ("a@h:99999", "not a port")):
        with pytest.raises(MachineError, match=said):
            Target.parse(bad)


def test_adding_and_removing_a_machine_keeps_comments_and_order(tmp_path):
    lab = tmp_path / "lab.yaml"
    lab.write_text(LAB)
    assert add_machine(lab, "mine", "box", "10.0.0.9", 7022, "nvml", "bob@box")
    text = lab.read_text()
    assert text.startswith("# our lab: hand-written\nlab: mine   # the name the console shows\n")
    assert "# the first box" in text and "# models come next: keep this note" in text
    assert text.index("name: old") < text.index("name: box") < text.index("models:")
    assert "added by `cetlab machine add` (bob@box)" in text
    assert not add_machine(lab, "mine", "box", "10.0.0.9", 7022, "nvml", "bob@box")  # again: already there
    with pytest.raises(MachineError, match="already in lab.yaml at 10.0.0.9:7022"):
        add_machine(lab, "mine", "box", "10.0.0.10", 7022, "nvml", "bob@box")
    assert remove_machine(lab, "box", dry_run=False)
    assert lab.read_text() == LAB and not remove_machine(lab, "box", False)


def test_a_machine_something_is_placed_on_is_not_removed(tmp_path):
    lab = tmp_path / "lab.yaml"
    lab.write_text(LAB.replace("models: []", "models:\n  - {name: m, path: x, engine: sim, machine: old, vram_gib: 1}"))
    add_machine(lab, "mine", "box", "10.0.0.9", 7022, "none", "box")
    before = lab.read_text()
    with pytest.raises(MachineError, match="would leave a lab.yaml that does not load"):
        remove_machine(lab, "old", dry_run=False)
    assert lab.read_text() == before


def test_a_new_lab_file_is_written_and_loads(tmp_path):
    lab = tmp_path / "new" / "lab.yaml"
    assert add_machine(lab, "fresh", "box", "127.0.0.1", 7200, "none", "box")
    from agents.wire.lab.model import load_lab

    assert [m.name for m in load_lab(lab).machines] == ["box"]


def test_the_host_key_is_pinned_once_and_replaced_when_the_machine_is_new(tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("[other]:7022 ssh-ed25519 AAAA\n")
    assert pin_host_key(known, "box", 7022, KEY, dry_run=False) == "pinned"
    assert pin_host_key(known, "box", 7022, KEY, dry_run=False) == "already pinned"
    other = KEY.replace("IJ9b", "IJ9c")
    assert pin_host_key(known, "box", 7022, other, dry_run=False) == "replaced"
    lines = known.read_text().splitlines()
    assert lines == ["[other]:7022 ssh-ed25519 AAAA", f"[box]:7022 {' '.join(other.split()[:2])}"]
    with pytest.raises(MachineError, match="printed no host key"):
        pin_host_key(known, "box", 7022, "authorized ...", dry_run=False)
    assert unpin_host_key(known, "box", 7022, dry_run=False) and known.read_text() == "[other]:7022 ssh-ed25519 AAAA\n"


def preflight(**changes) -> Preflight:
    answer = {
        "os": "Linux", "os_name": "Debian 12", "arch": "x86_64", "user": "bob", "uid": 1000, "python": "/usr/bin/python3",
        "python_version": [3, 11, 2], "has_venv": True, "gpus": [{"index": 0, "name": "Tesla P40", "compute_capability": "6.1"}],
        "driver": "550.1", "nvidia_error": None, "disk_free_bytes": 50 * 1024**3, "time": 0.0, "port_free": True,
        "systemd": True, "sudo": False, "agent_running": False, "unit_active": False,
        "layout": {k: f"/h/{k}" for k in ("home", "base", "venvs", "venv", "wheelhouse", "lab", "state")},
        "venv_key": None, "wheelhouse_ready": False, "lab_sha256": None,
    }  # fmt: skip
    return Preflight.model_validate({**answer, **changes})


def test_the_preflight_says_what_fails_with_the_fix():
    good = judge(preflight(), 7022, 0.3)
    assert all(level != FAIL for level, _, _ in good)
    assert (OK, "gpu0", "Tesla P40 (6.1), driver 550.1") in good
    bad = {what: words for level, what, words in judge(
        preflight(python_version=[3, 9, 2], disk_free_bytes=10**8, port_free=False), 7022, 120.0) if level == FAIL}  # fmt: skip
    assert "install Python 3.11 or newer" in bad["python"]
    assert "free at least 2 GiB" in bad["disk"]
    assert "timedatectl set-ntp true" in bad["clock"]
    assert "--agent-port" in bad["port"]
    assert preflight(systemd=False).mode == "detached" and preflight(sudo=True).mode == "system"
    with pytest.raises(ValueError):
        preflight(gpus="lots")  # the machine's answer is validated where it enters


def test_a_wrong_preflight_python_is_named(tmp_path: Path):
    bad = {what: words for level, what, words in judge(preflight(has_venv=False), 7022, 0.0) if level == FAIL}
    assert "python3-venv" in bad["python"]


def test_the_last_machine_can_go_but_not_while_a_model_is_placed_on_it(tmp_path):
    lab = tmp_path / "lab.yaml"
    lab.write_text(
        "lab: one\nmachines:\n  - {name: only, gpus: none}\nmodels:\n  - {name: m, path: x, engine: sim, machine: only, vram_gib: 1}\n"
    )
    with pytest.raises(MachineError, match="no machine named 'only'"):
        remove_machine(lab, "only", dry_run=False)
    lab.write_text("lab: one\nmachines:\n  - {name: only, gpus: none}\n")
    assert remove_machine(lab, "only", dry_run=False)
    assert "only" not in lab.read_text()
    assert add_machine(lab, "one", "next", "127.0.0.1", 7022, "none", "next")  # and the next add fills it


def test_what_machine_add_writes_passes_lab_check(tmp_path):
    from agents.wire.lab.check import check

    lab = tmp_path / "lab.yaml"
    lab.write_text(LAB)
    add_machine(lab, "mine", "box", "10.0.0.9", 7022, "nvml", "bob@box")
    loaded, problems = check(lab)
    assert problems == [] and loaded is not None and [m.name for m in loaded.machines] == ["old", "box"]


def test_paths_a_hostile_machine_answers_stay_one_word_in_every_command():
    """The layout comes from the machine's pre-flight: whatever it holds reaches the remote shell quoted, never run."""
    import shlex

    from console.machine import remote

    evil = "/h/x; evilcmd /tmp/pwned $(id) `id` 'q"
    pre = preflight(
        systemd=False, layout={k: f"{evil}/{k}" for k in ("home", "base", "venvs", "venv", "wheelhouse", "lab", "state")}
    )
    commands = [
        remote.install_venv(pre.layout, pre.python, "k", "cetlab==0.1.0"),
        remote.receive_wheelhouse(pre.layout, "k"),
        remote.receive_file(pre.layout.lab),
        remote.keys(pre.layout, "box", "operator"),
        *remote.start_agent(pre, "box"),
        remote.stop_agent("detached", pre.uid, pre.layout, remove_unit=True),
        remote.purge(pre.layout, pre.uid),
    ]
    for command in commands:
        words = shlex.split(command)
        assert "evilcmd" not in words and "$(id)" not in words, command
        assert not any(w.startswith("/tmp/pwned") for w in words), command


def test_removing_the_last_machine_under_a_model_names_no_stand_in(tmp_path):
    """The last machine's removal is judged with a stand-in machine; the refusal says no machine is left, never the
    stand-in's name (a new user read "machines: stand-in" as a machine of theirs)."""
    lab = tmp_path / "lab.yaml"
    lab.write_text(
        "lab: one\nmachines:\n  - {name: only, gpus: none}\nmodels:\n  - {name: m, path: x, engine: sim, machine: only, vram_gib: 1}\n"
    )
    with pytest.raises(MachineError) as refused:
        remove_machine(lab, "only", dry_run=True)
    assert "stand-in" not in str(refused.value) and "no machine is left" in str(refused.value)


async def test_the_last_machine_is_removed_with_nothing_left_to_push_to(tmp_path, monkeypatch):
    """Removing a lab's last machine (one never added from this workstation: no ssh step) ends done: lab.yaml keeps
    `machines: []` for the next add and nothing is pushed (before: the push loaded that lab.yaml and the verb exited 2
    after everything had been undone)."""
    from console.machine.steps import remove

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # this workstation's records of added machines
    lab = tmp_path / "lab.yaml"
    lab.write_text("lab: one\nconsole: {known_hosts: known_hosts}\nmachines:\n  - {name: only, gpus: none, port: 7999}\n")
    (tmp_path / "known_hosts").write_text(
        "[127.0.0.1]:7999 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"
    )
    steps = await remove(lab, "only", purge=False, dry_run=False, say=lambda line: None)
    assert "only" not in lab.read_text() and not any("push" in s.name for s in steps)
    assert (tmp_path / "known_hosts").read_text().strip() == ""  # its pinned key went with it
