"""Files that are not files (issue 21, N2 and N4): a FIFO or a symlink to /dev/zero where a trainer, an engine or a
watched folder should have a JSON document. The agent neither blocks, nor grows, nor stops listening.

Real agents over real SSH on loopback; the "trainer" is a real process that turns its progress file into a FIFO.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import psutil
import pytest

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from agents.wire.protocol import EVENT_TICK
from console.lab.client import FleetClient
from tests.support.sim_gpu_ticks import SIM_GPU, job_in_section, ticking
from tests.support.waits import wait_for

pytestmark = [pytest.mark.timeout(180)]


# Turns the progress file the agent gave it into a FIFO (nobody ever writes to it), then trains (sleeps).
FIFO_TRAINER = "import os, time; os.mkfifo(os.environ['CETLAB_PROGRESS_FILE']); time.sleep(300)"


async def test_a_trainer_whose_progress_file_becomes_a_fifo_freezes_nothing_and_a_restart_listens(tmp_path, lab_file):
    lab = {
        "lab": "fifo-lab",
        "machines": [{"name": "box", "gpus": {"sim": [SIM_GPU]}}],
        "trainers": [
            {
                "name": "piper",
                "machine": "box",
                "gpus": [0],
                "output_dir": str(tmp_path / "out" / "{job_id}"),
                "command": [sys.executable, "-c", FIFO_TRAINER],
                "stop_grace_s": "1s",
            }
        ],
    }
    with DemoLab(tmp_path / "run", source=lab_file(lab)) as demo:
        async with FleetClient(load_lab(demo.lab_path), subscribe=[EVENT_TICK]) as client:
            await client.wait_connected(30)
            job = await client.call("box", "jobs.start", {"recipe": "piper"})
            try:
                fifo = demo.dir / "agents" / "box" / "jobs" / job["id"] / "progress.json"
                await wait_for(fifo.is_fifo, timeout=30)
                shown = await wait_for(
                    lambda: (j := job_in_section(client, job["id"])) and j["progress_problem"] and j, timeout=30
                )
                assert "FIFO" in shown["progress_problem"], shown["progress_problem"]
                await ticking(client)
                for _ in range(3):  # ticks at 1 Hz, not one now and then
                    await ticking(client)
                demo.stop()  # the agent stops (within its 5 s, or it is killed); the trainer lives on
                demo.launch()
                demo.wait_listening()  # before: the restarted agent read the FIFO at adoption and never listened
                await wait_for(lambda: (j := job_in_section(client, job["id"])) and j["adopted"], timeout=30)
                await ticking(client)
            finally:
                await client.call("box", "jobs.kill", {"id": job["id"]})


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
async def test_a_watched_folder_of_fifos_and_dev_zero_links_is_listed_with_problems(tmp_path, lab_file, kind):
    run = tmp_path / "watched" / "evil"
    for step in (10, 20):
        ckpt = run / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    plant = (lambda p: p.symlink_to("/dev/zero")) if kind == "dev-zero" else os.mkfifo
    plant(run / "checkpoint-10" / "adapter_config.json")
    plant(run / "checkpoint-10" / "trainer_state.json")
    plant(run / "checkpoint-20" / "trainer_state.json")
    plant(run / "progress.json")
    lab = {
        "lab": "fifo-lab",
        "machines": [{"name": "box", "gpus": {"sim": [SIM_GPU]}}],
        "checkpoints": {"poll_s": "1s", "settle_s": "1s", "dirs": [{"machine": "box", "path": str(run)}]},
    }
    with DemoLab(tmp_path / "run", source=lab_file(lab)) as demo:
        agent = psutil.Process(demo.processes[-1].pid)
        async with FleetClient(load_lab(demo.lab_path), subscribe=[EVENT_TICK]) as client:
            await client.wait_connected(30)

            async def listed() -> dict | None:
                runs = await client.call("box", "checkpoints.runs")
                if not any(r["run"] == "evil" for r in runs):
                    return None
                listing = await client.call("box", "checkpoints.list", {"run": "evil"})
                settled = all("trainer_state.json" in (c.get("problem") or "") for c in listing["checkpoints"])
                return listing if len(listing["checkpoints"]) == 2 and settled else None

            listing = None
            for _ in range(200):
                listing = await listed()
                if listing:
                    break
                await ticking(client)
            assert listing, "the watched run was never listed"
            problems = " ".join(str(c.get("problem")) for c in listing["checkpoints"])
            await ticking(client)
            rss_mb = agent.memory_info().rss / 2**20
            print(f"\n{kind}: agent RSS {rss_mb:.0f} MB, checkpoint problems: {problems[:300]}")
            assert rss_mb < 400  # before (dev-zero): 3.1 GB in 2.2 s and growing
        started = time.monotonic()
        os.kill(agent.pid, signal.SIGTERM)
        agent.wait(timeout=30)
        print(f"stopped {time.monotonic() - started:.1f} s after SIGTERM")  # before (fifo): 25 s, a scan thread stuck in open()
        assert time.monotonic() - started < 10


async def test_an_engines_record_without_a_start_time_signals_nobody(tmp_path):
    """N13: a start without state.db reads engines.json; an entry naming a live pid with no start time (or the wrong
    one, or another command line) is not the agent's engine: its process group is left alone."""
    import subprocess

    from tests.support.agent_process import one_machine_lab, start_agent, wait_listening

    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    try:
        lab = one_machine_lab(tmp_path / "lab.yaml")
        state = tmp_path / "state"
        (state / "models").mkdir(parents=True)
        started = psutil.Process(victim.pid).create_time()
        records = {
            "ghost": {"pid": victim.pid, "port": 1234},  # no start time
            "wrong-start": {"pid": victim.pid, "port": 1234, "create_time": started - 100},
            "other-command": {"pid": victim.pid, "port": 1234, "create_time": started},
        }
        (state / "models" / "engines.json").write_text(__import__("json").dumps({"engines": records}))
        agent = start_agent(lab, state)
        try:
            port = __import__("yaml").safe_load(lab.read_text())["machines"][0]["port"]
            await asyncio.to_thread(wait_listening, "127.0.0.1", port, agent)  # the start's adoption pass is over
        finally:
            agent.terminate()
            _, err = agent.communicate(timeout=30)
        assert victim.poll() is None, err.decode()[-2000:]  # before: SIGKILLed with its process group
        assert b"without its start time: not trusted, left alone" in err
    finally:
        victim.kill()
        victim.wait()
