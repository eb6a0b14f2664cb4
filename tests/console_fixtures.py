"""A deterministic LabState for snapshot tests: the demo lab as the simulator draws it, frozen."""

from __future__ import annotations

from agents.lab import load_lab
from agents.protocol import HostSample, Telemetry
from agents.telemetry.sim import SimSampler
from console.demo import bundled_lab
from console.state import LabState

FROZEN_NOW = 1_790_000_000.0  # a fixed wall clock for headers and "last seen"


def frozen_state(offline: tuple[str, ...] = ("pharaoh",), ticks: int = 40) -> LabState:
    lab = load_lab(bundled_lab())
    state = LabState(lab)
    for machine in lab.machines:
        sampler = SimSampler(machine.gpus.sim, seed=machine.gpus.seed)
        host = HostSample(cpu_pct=23.0, cpu_count=28, load_1=3.1, ram_used_bytes=96 * 1024**3, ram_total_bytes=256 * 1024**3,
                          disk_used_bytes=1200 * 1024**3, disk_total_bytes=4000 * 1024**3)
        for tick in range(ticks):
            t = FROZEN_NOW - (ticks - tick)
            telemetry = Telemetry(machine=machine.name, t=t, gpus=sampler.sample(), host=host, gpu_backend="sim", simulated=True)
            state.apply_tick(machine.name, {"t": t, "full": tick == 0, "changed": {
                "host": host.model_dump(mode="json"),
                "gpus": [g.model_dump(mode="json") for g in telemetry.gpus]}})
        state.set_hello(machine.name, {"simulated": True, "role": "operator"})
        state.machines[machine.name].last_seen = FROZEN_NOW - 1
        if machine.name in offline:
            state.set_link(machine.name, "offline", "connection refused (is the agent running?)")
            state.machines[machine.name].last_seen = FROZEN_NOW - 75
        else:
            state.set_link(machine.name, "online")
    return state
