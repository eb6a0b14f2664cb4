"""Jobs on a real lab's GPUs: PCI numbering, torchrun's grace, a kill that reaches workers in sessions of their own."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from agents.shell.demo.lab import DemoLab
from tests.support.jobs import connect, ended, running, wait_job
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(120)


PY = sys.executable


P40 = {"name": "Tesla P40", "memory_gib": 24, "tdp_w": 250}


# writes the environment the agent gave it, then waits
ENV_DUMP = (
    "import json, os, sys, time\n"
    "keys = ('CUDA_DEVICE_ORDER', 'CUDA_VISIBLE_DEVICES', 'TORCH_ELASTIC_SHUTDOWN_TIMEOUT')\n"
    "open(sys.argv[1], 'w').write(json.dumps({k: os.environ.get(k) for k in keys}))\n"
)


# a stand-in for torchrun: its worker runs in a session of its own, out of reach of the group's signal
WORKER_IN_ITS_OWN_SESSION = (
    "import subprocess, sys, time\n"
    "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
    "open(sys.argv[1], 'w').write(str(worker.pid))\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("real-lab-jobs")
    data = {
        "lab": "real-lab-jobs",
        "machines": [{"name": "box", "gpus": {"sim": [P40, P40, P40]}}],
        "trainers": [
            {
                "name": "env",
                "machine": "box",
                "gpus": [2, 0],
                "command": [PY, "-c", ENV_DUMP, "{output_dir}/env.json"],
                "output_dir": "runs/{job_id}",
                "stop_grace_s": 45,
            },
            {
                "name": "tree",
                "machine": "box",
                "gpus": [1],
                "command": [PY, "-c", WORKER_IN_ITS_OWN_SESSION, "{output_dir}/worker.pid"],
                "output_dir": "runs/{job_id}",
            },
        ],
    }
    (root / "src.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with running(DemoLab(root / "run", source=root / "src.yaml")) as demo:
        yield demo


async def test_jobs_number_gpus_in_pci_order_and_torchrun_gets_the_recipes_grace(lab):
    client = await connect(lab)
    try:
        job = await client.call("box", "jobs.start", {"recipe": "env"})
        done = await wait_job(client, job["id"], ended)
        assert done["exit_code"] == 0, done["last_lines"]
        env = json.loads((Path(done["output_dir"]) / "env.json").read_text())
        assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,0", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "45"}
    finally:
        await client.stop()


async def test_kill_reaches_a_worker_in_a_session_of_its_own(lab):
    client = await connect(lab)
    worker = None
    try:
        job = await client.call("box", "jobs.start", {"recipe": "tree"})
        pid_file = Path(job["output_dir"]) / "worker.pid"
        await wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=30)
        worker = psutil.Process(int(pid_file.read_text()))
        assert worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE
        await client.call("box", "jobs.kill", {"id": job["id"]})
        done = await wait_job(client, job["id"], ended, timeout=30)
        assert done["exit_code"] == -signal.SIGKILL
        await wait_for(lambda: not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE, timeout=10)
    finally:
        if worker is not None and worker.is_running():
            worker.kill()
        await client.stop()
