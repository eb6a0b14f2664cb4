"""`machine add` and `machine remove` with --dry-run say what they would do, commands as a shell reads them."""

from __future__ import annotations

import shlex
import sys
import time

import pytest

from console.machine import remote
from console.machine import steps as machine_steps
from console.machine.files import Record, load_record, records_dir, save_record
from console.machine.ssh import Ssh, Target

# ---------------------------------------------------------------------------- machine add --dry-run


def _preflight(home: str, systemd: bool, sudo: bool) -> remote.Preflight:
    base = f"{home}/.local/share/cetlab"
    return remote.Preflight.model_validate(
        {
            "os": "Linux", "os_name": "Debian GNU/Linux 12", "arch": "x86_64", "user": "ada", "uid": 1000,
            "python": "/usr/bin/python3.11", "python_version": list(sys.version_info[:3]), "has_venv": True, "gpus": [],
            "driver": None, "nvidia_error": "no nvidia-smi on PATH (no NVIDIA driver)", "disk_free_bytes": 50 * 2**30,
            "time": time.time(), "port_free": True, "systemd": systemd, "sudo": sudo, "agent_running": False,
            "unit_active": False, "venv_key": None, "wheelhouse_ready": False, "lab_sha256": None,
            "layout": {
                "home": home, "base": base, "venvs": base + "/venvs", "venv": base + "/venv",
                "wheelhouse": f"{home}/.cache/cetlab/wheelhouse", "lab": base + "/lab.yaml",
                "state": f"{home}/.local/state/cetlab/agent-box",
            },
        }
    )  # fmt: skip


PAST = ("built:", "copied to", "installed cetlab", "enabled and started", "started detached", "restarted", "purged")


@pytest.mark.parametrize(("systemd", "sudo"), [(False, False), (True, False), (True, True)])
async def test_a_dry_run_says_what_it_would_do_and_prints_commands_as_a_shell_reads_them(tmp_path, monkeypatch, systemd, sudo):
    """`machine add --dry-run` said "installed ...", "started detached" for steps it did not do, and printed each
    command inside an ssh line with the command quoted again (`'"'"'`): now "would ...", and each command as the
    machine's shell reads it (the ssh to reach that shell said once), its input as `< FILE`."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    home = "/home/ada lovelace"  # a space: the one quoting a path needs, and no more
    pre = _preflight(home, systemd, sudo)
    monkeypatch.setattr(machine_steps, "preflight", lambda ssh, name, port, key: (pre, 0.1))
    monkeypatch.setattr(Ssh, "resolved_host", lambda self: "10.0.0.9")
    lab = tmp_path / "lab.yaml"
    lab.write_text("lab: mine\nmachines: []\n")
    said: list[str] = []
    options = machine_steps.AddOptions(lab, "box", Target("ada", "gpu1", 2222), dry_run=True)
    await machine_steps.add(options, said.append)
    text = "\n".join(said)
    assert not any(word in text for word in PAST), text
    assert "would install cetlab" in text and "would copy it to" in text and "would add box" in text, text
    assert ("would start it detached" if not systemd else "would enable and start a systemd") in text, text
    assert "each `would run on ada@gpu1:2222:` is a command for a shell there (ssh -p 2222 ada@gpu1)" in text
    remote_lines = [line.split(": ", 1)[1] for line in said if line.startswith("    would run on ada@gpu1:2222: ")]
    assert len(remote_lines) >= 3, text
    for line in remote_lines:
        assert "'\"'\"'" not in line, line  # no command quoted inside another's quotes
        shlex.split(line)  # a shell reads it as it is
    (authorize,) = [line for line in remote_lines if " authorize " in line]
    assert authorize.endswith(f" - < {tmp_path}/config/cetlab/id_ed25519.pub"), authorize  # its input, from the file
    (copy,) = [line.split(": ", 1)[1] for line in said if line.startswith("    would run here: tar ")]
    assert "'\"'\"'" not in copy and shlex.split(copy.split(" | ", 1)[1])[:4] == ["ssh", "-p", "2222", "ada@gpu1"], copy
    assert lab.read_text() == "lab: mine\nmachines: []\n"  # nothing changed here
    if not systemd:  # the launcher runs as printed: one python -c line, its strings in double quotes
        (launch,) = [line for line in remote_lines if " -c " in line]
        code = shlex.split(launch.split(" && ", 1)[1])[2]
        compile(code, "launcher", "exec")
        assert "'" not in code and f'"{home}/.local/state/cetlab/agent-box/agent.log"' in code


async def test_a_dry_run_of_remove_says_what_it_would_do_and_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    lab = tmp_path / "lab.yaml"
    lab.write_text("lab: mine\nmachines:\n  - {name: box, host: 10.0.0.9, gpus: none}\n")
    pre = _preflight("/home/ada", systemd=True, sudo=False)
    record = Record(machine="box", target="ada@gpu1:2222", ssh_config=None, host="10.0.0.9", port=7022, mode="user",
                    uid=1000, layout=pre.layout)  # fmt: skip
    save_record(records_dir("mine"), record)
    said: list[str] = []
    await machine_steps.remove(lab, "box", purge=True, dry_run=True, say=said.append)
    text = "\n".join(said)
    assert not any(word in text for word in (*PAST, "disabled", "stopped (", "taken out")), text
    assert "would disable and remove its unit" in text and "would purge: /home/ada/.local/state/cetlab/agent-box" in text
    assert f"would take box out of {lab}" in text and "box" in lab.read_text() and load_record(records_dir("mine"), "box")
    assert "    would run on ada@gpu1:2222: rm -rf /home/ada/.local/state/cetlab/agent-box && " in text
