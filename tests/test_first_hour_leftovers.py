"""The first hour, what was left (issue 32): the words of a dry run, `cetlab status` on the gateway and the models, one
plural rule, a purge that leaves nothing, a missing model file said as such, a re-added gateway key from zero."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from agents.gateway.keys import KeyStore
from agents.gateway.metering import Meter
from agents.gateway.metering import Record as Request
from agents.runtime.store import Store
from agents.shell.doctor import check_gpus
from agents.wire.catalogue.gateway import KeyAddParams
from agents.wire.lab.model import load_lab
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.words import plural
from console.cli.lab import cmd_check
from console.lab.status import status_human, status_json
from console.machine import remote
from console.machine import steps as machine_steps
from console.machine.files import Record, load_record, records_dir, save_record
from console.machine.ssh import Ssh, Target
from tests.conftest import wait_for
from widgets.format import plural as format_plural


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


def _used(keys: KeyStore, meter: Meter, token: str, tokens: int) -> None:
    key = keys.lookup(token)
    assert key is not None
    keys.admit(key)
    keys.charge(key, tokens)
    keys.spend(key, 0.5)
    meter.record(Request(key=key.name, model="m", tier="provider", target="p", status=200, stream=False,
                        prompt_tokens=tokens, completion_tokens=0, cost=0.5))  # fmt: skip
    meter.flush()


def test_a_gateway_key_revoked_and_added_again_starts_from_zero_also_after_a_restart(tmp_path):
    """A revoked key's name can be given again (before: refused, "revoke it or pick another name" though it was), and
    the new key does not inherit the old one's requests, tokens today or spend, not even from the request log that a
    restart reads them back from (it is kept by name)."""
    store = Store(tmp_path / "a.db")
    meter = Meter(store, None)
    keys = KeyStore(store, meter.today, meter.month)
    params = KeyAddParams.model_validate({"name": "team", "budget": "5/day"})
    old = keys.add(params)
    _used(keys, meter, old, 100)
    keys.revoke("team")
    new = keys.add(params)
    assert keys.lookup(old) is None  # the old token stays refused
    (row,) = keys.listing()
    assert (row.name, row.revoked_at, row.requests, row.tokens_today, row.spent) == ("team", None, 0, 0, 0.0)
    _used(keys, meter, new, 7)

    again = KeyStore(Store(tmp_path / "a.db"), meter.today, meter.month)  # the agent restarted
    again.seed_usage(meter.key_tokens_today)
    again.seed_money(meter.key_cost)
    (row,) = again.listing()
    assert (row.tokens_today, row.spent) == (7, 0.5)  # its own use only, read back from the log
    live = again.lookup(new)
    assert live is not None and again.lookup(old) is None


# ---------------------------------------------------------------------------- a lab with a gateway and models


def _lab(with_gateway: bool = True) -> dict:
    data: dict = {
        "lab": "leftovers",
        "machines": [{"name": "box", "gpus": "none"}],
        "models": [
            {"name": "ghost", "path": "models/ghost", "engine": "sim", "machine": "box", "vram_gib": 1},
            {
                "name": "here",
                "path": "models/here",
                "engine": "sim",
                "machine": "box",
                "vram_gib": 1,
                "sim": {"placeholder_mib": 1, "load_s": 0.05, "warmup_s": 0.01},
            },
        ],  # fmt: skip
    }
    if with_gateway:
        data["gateway"] = {"machine": "box", "host": "127.0.0.1", "port": 0}
    return data


@pytest.fixture
async def gateway_lab(in_process):
    lab = await in_process(_lab())
    client = lab.client()
    await client.start()
    await client.wait_connected(10)
    url = await wait_for(lambda: _url(client), 20)
    yield lab, client, url
    await client.stop()


async def _url(client) -> str | None:
    status = await client.call("box", "gateway.status")
    return status and status["url"]


async def test_a_model_whose_file_is_missing_is_refused_saying_so_where_and_the_fix(gateway_lab):
    """Warmed, or asked through the gateway, a model whose path is missing answered `no_room` (the gateway) or a bare
    not_found: now its own code, the path, the machine and the doctor's fix."""
    lab, client, url = gateway_lab
    with pytest.raises(RemoteError) as refused:
        await client.call("box", "models.warm", {"model": "ghost"})
    path = lab.lab.resolve(next(m for m in lab.lab.models if m.name == "ghost").path)
    assert refused.value.code == ErrorCode.MODEL_FILE_MISSING
    assert f"model ghost on box: {path} does not exist: `mkdir -p {path}`" in refused.value.message
    key = (await client.call("box", "gateway.keys.add", {"name": "t"}))["key"]
    body = {"model": "ghost", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
            status, error = r.status, (await r.json(content_type=None))["error"]
            retry_after = r.headers.get("Retry-After")
    assert (status, error["code"], retry_after) == (503, "model_file_missing", None), error
    assert f"{path} does not exist: `mkdir -p {path}`" in error["message"]


async def test_status_says_where_the_gateway_listens_whether_it_is_up_and_the_models_by_state(gateway_lab):
    """`cetlab status` said nothing of the gateway nor of the models: a line for each, and the same in --json."""
    lab, client, url = gateway_lab
    await client.call("box", "models.warm", {"model": "here"})
    data = await wait_for(lambda: (d := status_json(client.state))["models"]["warm"] == 1 and d["gateway"]["up"] and d, 20)
    assert data["gateway"] == {"machine": "box", "listen": "127.0.0.1:0", "url": url, "up": True, "error": None}
    assert data["models"]["total"] == 2 and data["models"]["cold"] == 1 and data["models"]["unknown"] == 0
    lines = status_human(data).splitlines()
    assert lines[1:3] == [f"gateway on box: {url} (listens on 127.0.0.1:0), up", "2 models: 1 warm, 1 cold"]


async def test_status_says_the_gateway_is_down_and_the_models_unknown_when_its_machine_is_off(in_process):
    lab = await in_process(_lab(), machines=[])  # box is off
    client = lab.client()
    await client.start()
    await client.wait_connected(5)
    data = status_json(client.state)
    assert data["gateway"]["up"] is False and data["gateway"]["error"] == "box is offline"
    assert status_human(data).splitlines()[1:3] == [
        "gateway on box: http://127.0.0.1:0/v1 (listens on 127.0.0.1:0), DOWN: box is offline",
        "2 models: 2 unknown",
    ]
    one = status_human({**data, "models": {**data["models"], "total": 1, "unknown": 1}, "gateway": None})
    assert one.splitlines()[1] == "1 model: 1 unknown"
    await client.stop()


async def test_a_count_of_one_reads_in_the_singular_through_one_rule(tmp_path, capsys):
    """Before: "1 machines", "1 models", "1 GPUs", each place spelling its own plural; one rule now (agents/wire/words.py), used
    by the CLI, the doctor, the views and the agents' messages."""
    assert [plural(n, "machine") for n in (0, 1, 2)] == ["0 machines", "1 machine", "2 machines"]
    assert plural(1, "entry") == "1 entry" and plural(3, "entry") == "3 entries" and plural(2, "x", "xen") == "2 xen"
    lab = tmp_path / "lab.yaml"
    lab.write_text(
        "lab: one\nmachines:\n  - {name: box, gpus: {sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}]}}\n"
        "models:\n  - {name: m, path: m, engine: sim, machine: box, vram_gib: 1}\n"
    )
    assert await cmd_check(argparse.Namespace(path=str(lab), lab=None, json=False)) == 0
    assert capsys.readouterr().out.strip() == f"{lab}: lab one: 1 machine, 1 model: valid"
    assert check_gpus(load_lab(lab), "box").message == "SIMULATED: 1 GPU from lab.yaml"
    assert format_plural is plural  # the views import the same rule, not a copy of it


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


# ---------------------------------------------------------------------------- the suite on a GPU workstation


def test_the_suite_runs_the_cached_cpu_llama_server_though_a_cuda_build_is_found_first(tmp_path, monkeypatch):
    """find_llama_server takes the cache's CUDA build first (what an operator wants); on a GPU workstation that had the
    tests' engines on a real GPU and judged the test labs' simulated GPUs against its archs. The suite pins the CPU
    build (tests/conftest.py), and keeps an operator's own CETLAB_LLAMA_SERVER."""
    from agents.orchestra.engines.llamacpp import build as llamacpp_build
    from tests.conftest import pin_llama_server

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(llamacpp_build.BINARY_ENV, raising=False)
    for cuda in (False, True):
        binary = llamacpp_build.build_dir(cuda) / "bin" / "llama-server"
        binary.parent.mkdir(parents=True)
        binary.write_bytes(b"\x7fELF")
        (binary.parent.parent / llamacpp_build.STAMP_NAME).write_text(json.dumps({"cuda": cuda}))
    assert llamacpp_build.find_llama_server() == llamacpp_build.build_dir(True) / "bin" / "llama-server"
    environ: dict[str, str] = {}
    pin_llama_server(environ)
    monkeypatch.setenv(llamacpp_build.BINARY_ENV, environ[llamacpp_build.BINARY_ENV])
    assert llamacpp_build.find_llama_server() == llamacpp_build.build_dir(False) / "bin" / "llama-server"
    mine = {llamacpp_build.BINARY_ENV: "/opt/llama/llama-server"}
    pin_llama_server(mine)
    assert mine == {llamacpp_build.BINARY_ENV: "/opt/llama/llama-server"}


def test_the_gpu_workstation_stand_in_answers_nvml_as_a_driver_with_one_gpu():
    """CETLAB_TEST_AS_GPU_WORKSTATION's pynvml and nvidia-smi (tests/gpu_workstation/) give the agents' NVML sampler and
    machine add's pre-flight one GPU, in the forms the real ones answer, to this process and the processes it starts."""
    stand_ins = Path(__file__).parent / "gpu_workstation"
    probe = (
        "from agents.telemetry.nvml import NvmlSampler\n"
        "s = NvmlSampler(); (g,) = s.sample(); s.close()\n"
        "print(s.status, g.name, g.compute_capability, g.mem_total_bytes, g.failed)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(stand_ins), str(Path(__file__).parents[1])])}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.split() == ["None", "NVIDIA", "GeForce", "RTX", "3050", "8.6", str(8 * 2**30), "None"], done.stderr
    smi = subprocess.run(
        [str(stand_ins / "nvidia-smi"), "--query-gpu=index,name,compute_cap,memory.total,driver_version",
         "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert smi.stdout.strip() == "0, NVIDIA GeForce RTX 3050, 8.6, 8192, 550.54.15"
