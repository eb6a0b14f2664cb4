"""Faults on purpose: kill -9 with a trainer and a model server running, a frozen agent, a cut socket, a lost GPU."""

from __future__ import annotations

import json
import os

import pynvml
import yaml

from agents.runtime.rpc import Peer
from agents.shell.agent import Agent
from agents.telemetry.nvml import GPU_LOST, NvmlSampler
from agents.wire.lab.model import load_lab
from agents.wire.protocol import EVENT_TICK, Role
from tests.support.agent_process import one_machine_lab
from tests.support.fake_nvml import FakeNvml, gpu
from tests.support.waits import wait_for


async def test_a_gpu_lost_mid_run_is_failed_and_the_others_keep_reporting(tmp_path):
    lab_path = one_machine_lab(tmp_path / "lab.yaml")
    data = yaml.safe_load(lab_path.read_text())
    data["machines"][0].update(gpus="nvml", sample_interval_s=0.1)
    lab_path.write_text(yaml.safe_dump(data))
    nvml = FakeNvml(gpu(), gpu("NVIDIA A100-SXM4-40GB"), gpu("NVIDIA L4"))
    agent = Agent(
        load_lab(lab_path),
        "box",
        tmp_path / "state",
        listen=("127.0.0.1", 0),
        gpu_sampler=NvmlSampler(nvml),
        components=lambda core: [],
    )
    ticks: list[dict] = []
    peer = Peer(role=Role.VIEWER, who="test", send=lambda line: ticks.append(json.loads(line)))
    await agent.start()
    try:
        agent.peers.add(peer)
        await agent.rpc.dispatch(peer, json.dumps({"id": 1, "method": "subscribe", "params": {"topics": [EVENT_TICK]}}).encode())
        await wait_for(lambda: len(ticks) >= 3, timeout=10)
        for key in ("util", "temp", "power_mw", "mem_used"):
            nvml.gpus[1][key] = pynvml.NVMLError_GpuIsLost()  # fell off the bus
        nvml.gpus[0]["util"] = 88
        await wait_for(lambda: agent.latest.gpus[1].failed == GPU_LOST, timeout=10)
        seen = agent.ticks
        nvml.gpus[2]["util"] = 55
        await wait_for(lambda: agent.ticks >= seen + 3, timeout=10)
        status = (await agent.rpc.dispatch(peer, b'{"id": 2, "method": "status"}'))["result"]
        by_index = {g["index"]: g for g in status["gpus"]}
        assert by_index[1]["failed"] == GPU_LOST and by_index[1]["util_pct"] is None
        assert by_index[0]["util_pct"] == 88.0 and by_index[2]["util_pct"] == 55.0 and by_index[2]["failed"] is None
        pushed = [g for t in ticks if t.get("event") == EVENT_TICK for g in t["data"]["changed"].get("gpus", [])]
        assert any(g["index"] == 1 and g["failed"] == GPU_LOST for g in pushed)  # consoles are told
        assert os.stat(tmp_path / "state").st_mode & 0o077 == 0
    finally:
        await agent.stop()
