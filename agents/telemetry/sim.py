"""The simulated GPU backend: plausible figures, deterministic by seed, that follow what runs."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agents.wire.capability import capability_by_name, parse_capability
from agents.wire.lab.machines import SimGpu
from agents.wire.protocol import ComputeCapability, ErrorCode, GpuBackend, GpuProcess, GpuSample, RemoteError
from agents.wire.words import plural

if TYPE_CHECKING:
    from agents.runtime.rpc import Peer, Registry
    from agents.telemetry.samplers import GpuSampler

log = logging.getLogger("cetlab.sim")

GIB = 1024**3
WARMUP_TICKS = 90


@dataclass
class Claim:
    """Something running on a simulated GPU: a trainer, a model server, a scenario."""

    owner: str  # shown as the process command, e.g. "job 3 demo-lora" or "model llama-3.1-8b"
    mem_bytes: int
    util_pct: float
    pid: int = 0


@dataclass
class _GpuState:
    spec: SimGpu
    rng: random.Random
    temp_c: float = 32.0
    util_pct: float = 0.0
    claims: dict[str, Claim] = field(default_factory=dict)
    overrides: dict[str, float] = field(default_factory=dict)
    failed: str | None = None


# Background load per profile: (util at rest, util when busy, mem share when busy, period in ticks)
_PROFILES = {
    "idle": (1.0, 4.0, 0.01, 600),
    "training": (88.0, 97.0, 0.78, 900),
    "serving": (8.0, 65.0, 0.72, 45),
    "bursty": (2.0, 92.0, 0.55, 120),
}


def sim_capability(spec: SimGpu) -> ComputeCapability | None:
    """The sim spec's compute_capability, else the one of a real GPU of that name."""
    return parse_capability(spec.compute_capability) if spec.compute_capability else capability_by_name(spec.name)


class SimSampler:
    """Same interface as NvmlSampler; every sample is labelled simulated."""

    backend: GpuBackend = "sim"
    simulated = True
    status: str | None = None

    def __init__(self, specs: list[SimGpu], seed: int = 0, background: bool = True):
        self.tick = 0
        self.background = background
        self._gpus = [_GpuState(spec, random.Random(seed * 1000 + i)) for i, spec in enumerate(specs)]
        for gpu in self._gpus:
            gpu.temp_c = 30.0 + gpu.rng.random() * 4
        for _ in range(WARMUP_TICKS):  # start near steady state, as a machine that has been up a while
            self.sample()

    # -- what runs on the GPUs (called by jobs, the orchestra and tests)

    def claim(self, index: int, key: str, claim: Claim) -> None:
        self._gpus[index].claims[key] = claim

    def release(self, key: str) -> None:
        for gpu in self._gpus:
            gpu.claims.pop(key, None)

    def override(self, index: int, **fields: float) -> None:
        """Force figures (temp_c, util_pct, mem_used_bytes, power_w) for scenarios; none clears."""
        if fields:
            self._gpus[index].overrides.update(fields)
        else:
            self._gpus[index].overrides.clear()

    def fail(self, index: int, reason: str = "GPU is lost") -> None:
        self._gpus[index].failed = reason

    # -- sampling

    def _background(self, gpu: _GpuState, index: int) -> tuple[float, float]:
        """Background (util_pct, mem share) of the demo profile at this tick."""
        if not self.background:
            return 0.0, 0.0
        rest, busy, mem_share, period = _PROFILES[gpu.spec.profile]
        phase = (self.tick + index * 17) % period / period
        if gpu.spec.profile == "training":
            dip = 30.0 if phase < 0.03 else 0.0  # periodic checkpoint save
            return busy - dip - gpu.rng.random() * (busy - rest), mem_share
        wave = 0.5 + 0.5 * math.sin(2 * math.pi * phase)
        if gpu.spec.profile == "bursty":
            wave = 1.0 if phase < 0.4 else 0.0
        util = rest + (busy - rest) * wave * (0.7 + 0.3 * gpu.rng.random())
        return util, mem_share if gpu.spec.profile != "idle" else 0.01

    def _mem_used(self, gpu: _GpuState, background_share: float = 0.0) -> int:
        total = int(gpu.spec.memory_gib * GIB)
        used = int(0.3 * GIB * min(1.0, gpu.spec.memory_gib / 8)) if gpu.claims or background_share else int(0.05 * GIB)
        used += int(background_share * total) + sum(c.mem_bytes for c in gpu.claims.values())
        return min(used, total)

    def sample(self) -> list[GpuSample]:
        self.tick += 1
        return [self._sample_one(i, gpu) for i, gpu in enumerate(self._gpus)]

    def _sample_one(self, index: int, gpu: _GpuState) -> GpuSample:
        spec = gpu.spec
        if gpu.failed:
            return GpuSample(index=index, name=spec.name, failed=gpu.failed, simulated=True)
        bg_util, bg_mem = self._background(gpu, index)
        claimed = max((c.util_pct for c in gpu.claims.values()), default=0.0)
        target = max(bg_util, claimed)
        if claimed:
            target = min(100.0, target + gpu.rng.uniform(-3.0, 3.0))
        # utilisation moves fast, temperature slowly (thermal mass)
        gpu.util_pct += (target - gpu.util_pct) * 0.6
        util = max(0.0, min(100.0, gpu.overrides.get("util_pct", gpu.util_pct)))
        idle_w = spec.idle_w if spec.idle_w is not None else 0.12 * spec.tdp_w
        power = idle_w + (spec.tdp_w - idle_w) * util / 100 * (0.85 + 0.1 * gpu.rng.random())
        power = gpu.overrides.get("power_w", power)
        temp_target = 30.0 + 52.0 * power / spec.tdp_w
        gpu.temp_c += (temp_target - gpu.temp_c) * 0.08
        temp = gpu.overrides.get("temp_c", gpu.temp_c)
        mem_used = int(gpu.overrides.get("mem_used_bytes", self._mem_used(gpu, bg_mem)))
        processes = [
            GpuProcess(pid=c.pid, user="cetlab", command=c.owner, mem_used_bytes=c.mem_bytes) for c in gpu.claims.values()
        ]
        if bg_mem and self.background:
            processes.append(
                GpuProcess(
                    pid=0,
                    user="sim",
                    command=f"background {spec.profile} load",
                    mem_used_bytes=int(bg_mem * spec.memory_gib * GIB),
                )
            )
        return GpuSample(
            index=index,
            name=spec.name,
            uuid=f"SIM-{index:02d}-{spec.name.replace(' ', '-')}",
            util_pct=round(util, 1),
            mem_used_bytes=mem_used,
            mem_total_bytes=int(spec.memory_gib * GIB),
            temp_c=round(temp, 1),
            power_w=round(power, 1),
            power_limit_w=float(spec.tdp_w),
            fan_pct=round(min(100.0, max(25.0, (temp - 30.0) * 1.6)), 0),
            sm_clock_mhz=int(300 + 1100 * min(1.0, util / 60)),
            processes=processes,
            simulated=True,
            compute_capability=sim_capability(spec),
        )

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------- driving it over the wire


def register_methods(rpc: Registry, machine: str, sampler: GpuSampler, gpu_count: Callable[[], int]) -> None:
    """`sim.override`: scenarios (a hot GPU, a full one) on simulated GPUs; machines with real ones answer `unavailable`.

    ``gpu_count``: how many GPUs the latest sample has (0 before the first)."""
    from agents.wire.catalogue.agent import (  # here: the sampler alone (an nvitop-style loop) needs none of the wire's models
        SIM_OVERRIDE,
        OverrideParams,
        SimOverride,
    )

    @rpc.implements(SIM_OVERRIDE)
    async def override(peer: Peer, params: OverrideParams) -> SimOverride:
        if not isinstance(sampler, SimSampler):
            raise RemoteError(
                ErrorCode.UNAVAILABLE, f"{machine} has real GPUs ({sampler.backend}); sim.override only drives simulated ones"
            )
        count = gpu_count()
        if params.gpu >= count:
            raise RemoteError(ErrorCode.NOT_FOUND, f"{machine} has {plural(count, 'GPU')} (0..{count - 1}), no GPU {params.gpu}")
        fields = params.model_dump(exclude={"gpu", "clear"}, exclude_none=True)
        if not fields and not params.clear:
            raise RemoteError(
                ErrorCode.INVALID_PARAMS, "give at least one of temp_c, util_pct, mem_used_bytes, power_w, or clear: true"
            )
        if params.clear:
            sampler.override(params.gpu)
        if fields:
            sampler.override(params.gpu, **fields)
        log.info("%s overrode simulated gpu%d: %s", peer.who, params.gpu, fields or "cleared")
        return SimOverride(gpu=params.gpu, overrides=fields, simulated=True)
