"""One training job over two agents (two nodes on loopback, one CPU process each, gloo) through torchrun's c10d rendezvous."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from agents.wire.protocol import ErrorCode, RemoteError
from console.lab.client import FleetClient
from tests.support.jobs import cli, running
from tests.support.lab import REPO, run_agent
from tests.support.multinode import (
    P4,
)
from tests.support.waits import wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


NODES = ("a", "b")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from agents.train.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def make_lab(root: Path, tiny: Path, offline_for_s: float = 30, rdzv_port: int | None = None) -> DemoLab:
    source = root / "src"
    source.mkdir(parents=True)
    shutil.copytree(REPO / "demo", source / "demo")
    train = [
        "cetlab-train",
        "--config",
        "demo/train.yaml",
        "--output-dir",
        "{output_dir}",
        "--set",
        f"base_model={tiny}",
        "--set",
        "logging_steps=1",
        "--set",
        "max_seq_len=32",
        "--set",
        "per_device_batch_size=2",
    ]
    data = {
        "lab": "multinode-test",
        "alerts": {"offline_for_s": offline_for_s},  # a node whose agent is silent this long fails the job
        "machines": [{"name": name, "gpus": {"sim": [P4]}} for name in NODES],
        "trainers": [
            {
                "name": "ddp",
                "nodes": [{"machine": "a", "gpus": [0]}, {"machine": "b", "gpus": [0]}],
                "launcher": "torchrun",
                "nproc_per_node": 1,
                "command": train,
                "output_dir": "runs/{job_id}",
                "stop_grace_s": 60,
                "params": [
                    {"name": "max_steps", "type": "int", "default": 6, "min": 1},
                    {"name": "save_steps", "type": "int", "default": 3, "min": 1},
                    {"name": "resume_from_checkpoint", "type": "str"},
                ],
            }
        ],
    }
    if rdzv_port is not None:
        data["trainers"][0]["rdzv_port"] = rdzv_port
    (source / "lab.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return DemoLab(root / "run", source=source / "lab.yaml")


@pytest.fixture
def lab(tmp_path, tiny_model, with_torchrun):
    with running(make_lab(tmp_path, tiny_model)) as demo:
        yield demo


async def connect(demo: DemoLab) -> FleetClient:
    client = FleetClient(load_lab(demo.lab_path))
    await client.start()
    await client.wait_connected(15)
    return client


async def job_on(client: FleetClient, machine: str, job_id: str) -> dict:
    return await client.call(machine, "jobs.get", {"id": job_id})


def ended(job: dict) -> bool:
    return job["state"] in ("exited", "failed", "lost")


async def all_ended(client: FleetClient, job_id: str) -> dict | None:
    """The coordinator's job once it and every node it shows have ended."""
    job = await job_on(client, "a", job_id)
    return job if ended(job) and all(n["state"] in ("exited", "failed", "lost", "offline") for n in job["nodes"]) else None


def finished_step(log_path: str) -> int | None:
    found = re.findall(r"finished at step (\d+)", Path(log_path).read_text())
    return int(found[-1]) if found else None


def worker_of(job: dict) -> psutil.Process:
    """The trainer process under a node's torchrun."""
    return next(p for p in psutil.Process(job["pid"]).children(recursive=True) if "cetlab-train" in " ".join(p.cmdline()))


async def test_two_nodes_train_to_exit_0_with_rank_0_checkpoints_and_progress(lab):
    client = await connect(lab)
    try:
        started = await client.call("a", "jobs.start", {"recipe": "ddp"})
        assert [n["machine"] for n in started["nodes"]] == ["a", "b"]
        argv = " ".join(started["argv"])
        assert "--nnodes 2" in argv and "--rdzv-backend c10d" in argv and "--rdzv-endpoint 127.0.0.1:" in argv
        # the other nodes start once node 0's torchrun holds the rendezvous port: the same job id on the second node
        node_b = await wait_for(lambda: _node_started(client, "b", started["id"]), timeout=120)
        assert node_b["node_rank"] == 1 and node_b["coordinator"] == "a"
        assert "--rdzv-conf is_host=0" in " ".join(node_b["argv"]) and "--rdzv-conf is_host=1" in argv
        done = await wait_for(lambda: all_ended(client, started["id"]), timeout=240)
        assert done["state"] == "exited" and done["exit_code"] == 0, done
        assert [(n["machine"], n["state"], n["exit_code"]) for n in done["nodes"]] == [("a", "exited", 0), ("b", "exited", 0)]
        assert done["step"] == 6 and done["loss"] is not None and done["samples_per_s"]  # progress from rank 0
        run = Path(done["output_dir"])
        assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
        assert json.loads((run / "checkpoint-6" / "trainer_state.json").read_text())["global_step"] == 6
        assert finished_step(done["log_path"]) == finished_step((await job_on(client, "b", started["id"]))["log_path"]) == 6
        # the jobs list of the coordinator holds the nodes; the CLI shape: {"machine", "gpus", "state"}
        listed = next(j for j in await client.call("a", "jobs.list", {}) if j["id"] == started["id"])
        assert [{k: n[k] for k in ("machine", "gpus", "state")} for n in listed["nodes"]] == [
            {"machine": "a", "gpus": [0], "state": "exited"},
            {"machine": "b", "gpus": [0], "state": "exited"},
        ]
        shown = cli(lab, "jobs", "--json")  # one job, not one per node
        assert [j["id"] for j in json.loads(shown.stdout)["jobs"]] == [started["id"]], shown.stderr
        assert "a+b" in cli(lab, "jobs").stdout
        assert "finished at step 6" in cli(lab, "logs", started["id"], "--node", "b").stdout
        # both agents see the run's folder (one filesystem: shared storage): one run, one row, and its name is enough
        runs = await wait_for(lambda: _runs_listed(lab, started["id"]), timeout=30)
        assert len(runs) == 1 and runs[0]["count"] == 2, runs
        listing = cli(lab, "checkpoints", started["id"])
        assert listing.returncode == 0 and listing.stdout.startswith(f"run {started['id']} on a"), listing.stdout + listing.stderr
    finally:
        await client.stop()


async def test_stop_saves_the_same_step_on_both_nodes_and_exits_0(lab):
    client = await connect(lab)
    try:
        job = await client.call("a", "jobs.start", {"recipe": "ddp", "params": {"max_steps": 100000, "save_steps": 100000}})
        await wait_for(lambda: _step_at_least(client, job["id"], 2), timeout=240)
        await client.call("a", "jobs.stop", {"id": job["id"]})
        done = await wait_for(lambda: all_ended(client, job["id"]), timeout=120)
        assert done["state"] == "exited" and done["exit_code"] == 0, done
        assert [(n["state"], n["exit_code"]) for n in done["nodes"]] == [("exited", 0), ("exited", 0)]
        node_b = await job_on(client, "b", job["id"])
        step = finished_step(done["log_path"])
        assert step is not None and step == finished_step(node_b["log_path"]), node_b["last_lines"]
        assert (Path(done["output_dir"]) / f"checkpoint-{step}").is_dir()
    finally:
        await client.stop()


async def _step_at_least(client: FleetClient, job_id: str, step: int) -> bool:
    job = await job_on(client, "a", job_id)
    return (job["step"] or 0) >= step


async def test_a_dead_trainer_on_one_node_fails_the_job_on_both_naming_the_node(lab):
    client = await connect(lab)
    try:
        job = await client.call("a", "jobs.start", {"recipe": "ddp", "params": {"max_steps": 100000, "save_steps": 100000}})
        await wait_for(lambda: _step_at_least(client, job["id"], 2), timeout=240)
        worker_of(await job_on(client, "b", job["id"])).kill()  # kill -9 of node b's trainer
        done = await wait_for(lambda: all_ended(client, job["id"]), timeout=10)
        assert done["state"] == "failed" and "node b failed" in done["error"], done
        node_b = await job_on(client, "b", job["id"])
        assert node_b["state"] == "failed" and [n["state"] for n in done["nodes"]] == ["failed", "failed"]
    finally:
        await client.stop()


async def test_an_agent_restart_mid_run_re_adopts_its_node(tmp_path, tiny_model, with_torchrun):
    with running(make_lab(tmp_path, tiny_model, offline_for_s=600)) as lab:
        await _restart_mid_run(lab)


async def _restart_mid_run(lab: DemoLab) -> None:
    client = await connect(lab)
    try:
        job = await client.call("a", "jobs.start", {"recipe": "ddp", "params": {"max_steps": 100000, "save_steps": 100000}})
        await wait_for(lambda: _step_at_least(client, job["id"], 2), timeout=240)
        before = await job_on(client, "b", job["id"])
        agent_b = lab.agent_process("b")
        agent_b.kill()  # kill -9: no chance to clean up
        agent_b.wait()
        await wait_for(lambda: not client.state.machines["b"].online, timeout=20)
        lab.replace_agent("b", run_agent(lab.lab_path, "b", lab.dir / "agents" / "b"))
        await wait_for(lambda: client.state.machines["b"].online, timeout=40)
        adopted = await job_on(client, "b", job["id"])
        assert adopted["adopted"] and adopted["state"] == "running" and adopted["pid"] == before["pid"]
        step = (await job_on(client, "a", job["id"]))["step"]
        await wait_for(lambda: _step_at_least(client, job["id"], step + 2), timeout=60)  # training went on
        coordinated = await job_on(client, "a", job["id"])
        assert [n["state"] for n in coordinated["nodes"]] == ["running", "running"], coordinated["nodes"]
        await client.call("a", "jobs.stop", {"id": job["id"]})
        done = await wait_for(lambda: all_ended(client, job["id"]), timeout=120)
        assert done["state"] == "exited" and [n["state"] for n in done["nodes"]] == ["exited", "exited"], done
    finally:
        await client.stop()


async def test_the_node_role_may_call_the_node_methods_only(lab):
    from agents.wire.protocol import Role

    assert Role.NODE.allows(Role.OPERATOR, "jobs.node_start") and Role.NODE.allows(Role.VIEWER, "hello")
    for method in ("jobs.start", "jobs.list", "models.warm", "jobs.stop"):
        assert not Role.NODE.allows(Role.VIEWER, method)
    client = await connect(lab)
    try:  # a node start names a recipe of the callee's own lab.yaml, and a rank that is the callee's
        with pytest.raises(RemoteError) as info:
            await client.call("b", "jobs.node_start", {"id": "a-99", "recipe": "ddp", "node_rank": 2, "rdzv_port": 29999})
        assert info.value.code == ErrorCode.INVALID_PARAMS and "not node 2" in info.value.message
        with pytest.raises(RemoteError) as info:
            await client.call("b", "jobs.node_start", {"id": "a-99", "recipe": "nope", "node_rank": 1, "rdzv_port": 29999})
        assert info.value.code == ErrorCode.NOT_FOUND
    finally:
        await client.stop()


def test_recipes_over_nodes_are_checked_at_load(lab_file):
    from agents.wire.lab.model import LabError

    def lab(**trainer) -> dict:
        return {
            "lab": "t",
            "machines": [{"name": n, "gpus": {"sim": [P4]}} for n in ("a", "b")],
            "trainers": [{"name": "ddp", "command": ["x"], "output_dir": "o", "launcher": "torchrun", **trainer}],
        }

    good = load_lab(
        lab_file(lab(nodes=[{"machine": "a", "gpus": [0]}, {"machine": "b", "gpus": [0], "nccl_socket_ifname": "eth1"}]))
    )
    assert good.trainers[0].machine == "a" and good.trainers[0].gpus == [0]  # the first node coordinates
    refused = {
        "no machine named 'c'": lab(nodes=[{"machine": "a", "gpus": [0]}, {"machine": "c", "gpus": [0]}]),
        "no GPU 3": lab(nodes=[{"machine": "a", "gpus": [0]}, {"machine": "b", "gpus": [3]}]),
        "is a node twice": lab(nodes=[{"machine": "a", "gpus": [0]}, {"machine": "a", "gpus": [0]}]),
        "two machines or more": lab(nodes=[{"machine": "a", "gpus": [0]}]),
        "needs launcher: torchrun": lab(nodes=[{"machine": "a", "gpus": [0]}, {"machine": "b", "gpus": [0]}], launcher="local"),
        "needs the recipe's nproc_per_node": lab(nodes=[{"machine": "a", "gpus": [0]}, {"machine": "b"}]),
        "rdzv_port needs nodes": lab(machine="a", gpus=[0], rdzv_port=29400),
        "leave them out": lab(machine="b", nodes=[{"machine": "a", "gpus": [0]}, {"machine": "b", "gpus": [0]}]),
    }
    for message, data in refused.items():
        with pytest.raises(LabError, match=re.escape(message)):
            load_lab(lab_file(data))


def test_the_demo_authorizes_the_coordinator_key_with_the_node_role_only(tmp_path):
    from agents.runtime.keys import AUTHORIZED_KEYS_NAME
    from agents.runtime.peers import NODE_KEY_NAME, PEER_KNOWN_HOSTS_NAME

    demo = DemoLab(tmp_path / "demo")
    demo.prepare()
    node_key = (demo.dir / "agents" / "m5" / f"{NODE_KEY_NAME}.pub").read_text().split()[1]
    irina = (demo.dir / "agents" / "irina" / AUTHORIZED_KEYS_NAME).read_text().splitlines()
    assert [line.split()[0] for line in irina if node_key in line] == ["node"]
    assert not any(node_key in line for line in (demo.dir / "agents" / "m5" / AUTHORIZED_KEYS_NAME).read_text().splitlines())
    assert (demo.dir / "agents" / "m5" / PEER_KNOWN_HOSTS_NAME).exists()
    assert next(t for t in load_lab(demo.lab_path).trainers if t.name == "ddp-2node").nodes[1].machine == "irina"


# listens on the port, then leaves it to a forked child that is no process of the job's (the parent prints its pid and exits)
SQUAT = (
    "import os, socket, sys, time\ns = socket.socket(); s.bind(('', int(sys.argv[1]))); s.listen()\n"
    "pid = os.fork()\nif pid:\n    print(pid, flush=True); os._exit(0)\ntime.sleep(600)\n"
)


@pytest.fixture
def port_thief(tmp_path, monkeypatch):
    """A torchrun whose first rendezvous host finds its port taken in between, as the documented run did (EADDRINUSE).

    The first node-0 torchrun starts a process that listens on the port it was given, then runs the real
    torchrun, which fails to bind its c10d store. Yields the file that names the thief's pid once it struck.
    """
    marker = tmp_path / "thief.pid"
    bin_dir = tmp_path / "thief-bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(f"""#!{sys.executable}
import os, subprocess, sys
from pathlib import Path
args, marker = sys.argv[1:], Path({str(marker)!r})
if "is_host=1" in args and not marker.exists():
    port = args[args.index("--rdzv-endpoint") + 1].rsplit(":", 1)[1]
    thief = subprocess.Popen([sys.executable, "-c", {SQUAT!r}, port], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    marker.write_text(thief.stdout.readline().decode().strip())
    thief.wait()
os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", *args])
""")
    (bin_dir / "torchrun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    try:
        yield marker
    finally:
        if marker.exists():
            try:
                psutil.Process(int(marker.read_text())).kill()
            except psutil.Error:
                pass


async def test_a_rendezvous_port_taken_before_torchrun_binds_it_starts_node_0_again_on_another(tmp_path, tiny_model, port_thief):
    with running(make_lab(tmp_path, tiny_model)) as lab:
        client = await connect(lab)
        try:
            job = await client.call("a", "jobs.start", {"recipe": "ddp", "params": {"max_steps": 2, "save_steps": 2}})
            done = await wait_for(lambda: all_ended(client, job["id"]), timeout=240)
            assert port_thief.exists()  # the first port was lost to another process
            assert done["state"] == "exited" and done["exit_code"] == 0, done
            assert [n["state"] for n in done["nodes"]] == ["exited", "exited"]
            log = Path(done["log_path"]).read_text()
            assert "was taken before torchrun bound it (EADDRINUSE): starting again on another port" in log
            listed = [j["id"] for j in await client.call("a", "jobs.list", {})]
            assert listed.count(job["id"]) == 1  # the lost try is no job of its own
        finally:
            await client.stop()


async def test_a_fixed_rendezvous_port_in_use_fails_the_job_in_one_line(tmp_path, tiny_model, with_torchrun):
    import socket

    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        with running(make_lab(tmp_path, tiny_model, rdzv_port=port)) as lab:
            client = await connect(lab)
            try:
                job = await client.call("a", "jobs.start", {"recipe": "ddp"})
                failed = await wait_for(lambda: _ended_on_a(client, job["id"]), timeout=180)
                error = failed["error"]
                assert (
                    failed["state"] == "failed"
                    and f"could not listen on rendezvous port {port}" in error
                    and "EADDRINUSE" in error
                ), failed
                assert "\n" not in error and "Traceback" not in error and "change the recipe's rdzv_port" in error
                assert [n["state"] for n in failed["nodes"]] == ["failed", "failed"]
                with pytest.raises(RemoteError):  # node b never started
                    await job_on(client, "b", job["id"])
            finally:
                await client.stop()


def _runs_listed(demo: DemoLab, run: str) -> list[dict] | None:
    """The rows of `cetlab checkpoints --json` for this run, once both agents have found its folder."""
    shown = json.loads(cli(demo, "checkpoints", "--json").stdout)
    return [r for r in shown["runs"] if r["run"] == run] or None


async def _node_started(client: FleetClient, machine: str, job_id: str) -> dict | None:
    try:
        return await job_on(client, machine, job_id)
    except RemoteError as exc:
        if exc.code != ErrorCode.NOT_FOUND:
            raise
        return None


async def _ended_on_a(client: FleetClient, job_id: str) -> dict | None:
    job = await job_on(client, "a", job_id)
    return job if ended(job) else None


def test_one_row_per_run_keeps_a_multi_node_run_once_and_other_runs_apart():
    from console.lab.runs import RunKey, one_row_per_run

    rows = [
        ("irina", "m5-4", "m5-4", 3),
        ("m5", "m5-4", "m5-4", 3),
        ("m5", "exp1", None, 2),
        ("irina", "exp1", None, 1),
        ("irina", "m5-5", "m5-5", 2),
        ("m5", "m5-5", "m5-5", 0),
    ]
    kept = one_row_per_run(rows, lambda r: RunKey(*r))
    # the coordinator's row on a tie, the node with the checkpoints otherwise (no shared storage: rank 0's folder); hand runs apart
    assert kept == [("m5", "m5-4", "m5-4", 3), ("m5", "exp1", None, 2), ("irina", "exp1", None, 1), ("irina", "m5-5", "m5-5", 2)]
