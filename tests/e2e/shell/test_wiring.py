"""Wiring between the merged parts: the start plan, the pool's VRAM, store notices, gateway costs."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from types import SimpleNamespace

import pytest
import yaml

from agents.orchestra.component import OrchestraComponent
from agents.orchestra.engine import GIB, Engine
from agents.orchestra.slot import SLEEP_RESIDUAL_BYTES, Slot
from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import Model, load_lab
from agents.wire.protocol import GpuProcess, GpuSample, Telemetry
from agents.wire.states import ModelState
from console.lab.client import FleetClient
from tests.support.agent_exits import _ran_once, wait_exit
from tests.support.agent_process import connected, one_machine_lab, start_agent, wait_listening
from tests.support.pool import pool_lab, settle, sim_model
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(120)


async def test_one_model_failing_in_the_start_plan_leaves_the_rest_of_the_plan_running(run_pool):
    # a's engine dies while loading (its supervisor cancels the bring-up); b, later in the plan, still comes up and sleeps
    demo = run_pool(
        pool_lab(
            [sim_model("a", [0], 6, load_s=30, fail_after_s=0.2), sim_model("b", [1], 4)],
            orchestra={"warm": ["a"], "sleeping": ["b"]},
        )
    )
    async with FleetClient(load_lab(demo.lab_path)) as client:
        await client.wait_connected(10)
        a = await settle(client, "a", ("failed",))
        assert "exited" in a["error"]["message"] and a["error"]["oom"], a["error"]
        b = await settle(client, "b", ("sleeping",))
        assert b["error"] is None


async def test_pool_vram_follows_nvml_per_process_memory_and_a_sleeping_residual_is_measured(tmp_path):
    # NVML's per-process figures for the engine's own process (a real child standing in for vLLM), on two GPUs
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
    try:
        model = Model(name="big", path=str(tmp_path), engine="vllm", machine="box", gpus=[0, 1], vram_gib=20)
        engine = Engine(model, tmp_path, "box", [0, 1], tmp_path / "big.log")
        engine.proc = proc
        lab = load_lab(one_machine_lab(tmp_path / "lab.yaml"))
        pool = OrchestraComponent(
            SimpleNamespace(lab=lab, machine=lab.machine("box"))
        )  # on_telemetry and info read no more of the core
        slot = Slot(model=model, path=tmp_path, gpus=[0, 1], state=ModelState.WARM, engine=engine)
        pool.slots["big"] = slot

        def sample(held: dict[int, int], simulated: bool = False) -> Telemetry:
            gpus = [
                GpuSample(
                    index=i,
                    name="H100",
                    mem_used_bytes=b + GIB,
                    mem_total_bytes=80 * GIB,
                    processes=[GpuProcess(pid=proc.pid, mem_used_bytes=b), GpuProcess(pid=1, mem_used_bytes=GIB)],
                )
                for i, b in held.items()
            ]
            return Telemetry(machine="box", t=time.time(), gpus=gpus, simulated=simulated)

        assert slot.held_bytes(0) == 10 * GIB  # the estimate: 20 GiB over two GPUs
        pool.on_telemetry(sample({0: 14 * GIB, 1: 13 * GIB}))
        assert slot.held_bytes(0) == 14 * GIB and slot.held_bytes(1) == 13 * GIB
        info = pool.info(slot)
        assert info.vram_bytes == 27 * GIB and info.vram_measured
        # asleep: the constant residual until the next sample, then what the sample says
        slot.state, slot.measured = ModelState.SLEEPING, None
        assert slot.held_bytes(0) == SLEEP_RESIDUAL_BYTES
        pool.on_telemetry(sample({0: 3 * GIB, 1: 3 * GIB}))
        assert slot.held_bytes(0) == 3 * GIB and pool.info(slot).vram_bytes == 6 * GIB
        # simulated GPUs keep the estimate
        pool.on_telemetry(sample({0: 3 * GIB, 1: 3 * GIB}, simulated=True))
        assert slot.held_bytes(0) == SLEEP_RESIDUAL_BYTES and not pool.info(slot).vram_measured
    finally:
        proc.kill()
        await proc.wait()


async def test_a_corrupt_state_db_is_a_critical_alert_consoles_see(small_demo):
    small_demo.stop()
    state = small_demo.dir / "agents" / "box"
    await _ran_once(small_demo.lab_path, state)
    db = state / "state.db"
    data = db.read_bytes()
    db.write_bytes(data[:100] + os.urandom(4096) + data[4196:])
    proc = start_agent(small_demo.lab_path, state)
    try:
        wait_listening("127.0.0.1", yaml.safe_load(small_demo.lab_path.read_text())["machines"][0]["port"], proc)
        client = await connected(small_demo.lab_path)
        try:

            def state_lost() -> list[dict]:
                return [a for a in client.state.machines["box"].alerts.active if a.rule == "state_lost"]

            await wait_for(lambda: bool(state_lost()), timeout=30)
            alert = state_lost()[0]
            assert alert.level == "critical" and "corrupt" in alert.message and "moved aside" in alert.message
            listed = await client.call("box", "alerts.list", {"active": True})
            assert any(a["rule"] == "state_lost" for a in listed["alerts"])
        finally:
            await client.stop()
    finally:
        proc.terminate()
        assert wait_exit(proc, 30) == 0


async def test_kill_9_of_the_agent_while_a_model_loads_is_said_after_the_restart(tmp_path):
    demo = DemoLab(
        tmp_path / "run",
        source=one_machine_lab(
            tmp_path / "lab.yaml",
            models=[
                {
                    "name": "slow",
                    "path": str(tmp_path / "models" / "slow"),
                    "engine": "sim",
                    "machine": "box",
                    "gpus": [0],
                    "vram_gib": 2,
                    "sim": {"load_s": 60, "warmup_s": 0.1, "placeholder_mib": 1},
                }
            ],
        ),
    )
    demo.start()
    demo.wait_listening()
    demo.stop()  # keys and state in place; the agent runs as a process of this test, to be killed
    lab_path, state = demo.lab_path, demo.dir / "agents" / "box"
    port = yaml.safe_load(lab_path.read_text())["machines"][0]["port"]
    proc = start_agent(lab_path, state)
    try:
        wait_listening("127.0.0.1", port, proc)
        client = await connected(lab_path)
        try:
            await client.call("box", "models.warm", {"model": "slow"})
            await wait_for(
                lambda: (
                    (m := client.state.machines["box"].models) is not None
                    and any(x.name == "slow" and x.progress is not None and x.progress.phase == "loading" for x in m.models)
                ),
                timeout=30,
            )
        finally:
            await client.stop()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the agent, not its engine (the engine has a session of its own)
        proc.wait()
    proc = start_agent(lab_path, state)
    try:
        wait_listening("127.0.0.1", port, proc)
        client = await connected(lab_path)
        try:
            slow = await client.call("box", "models.get", {"model": "slow"})
            assert slow["state"] == "failed" and "restarted while loading" in slow["error"]["message"], slow
        finally:
            await client.stop()
    finally:
        proc.terminate()
        assert wait_exit(proc, 30) == 0
