"""The alert rules as a table, as the gateway's ROUTES are: each rule one function from what a tick shows of one
target (a GPU, a job, a model, a provider, the host) to its observations. AlertEngine.observe runs every table in
order; a new rule is one function and one entry here, and no rule can be skipped by another's early return."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agents.wire.lab.model import Alerts
from agents.wire.protocol import GpuSample, HostSample
from agents.wire.sections.costs import ProviderSpend
from agents.wire.sections.gateway import GatewaySection
from agents.wire.sections.jobs import JobInfo
from agents.wire.sections.models import ModelInfo
from agents.wire.states import JOB_ACTIVE, JobState, ModelState
from agents.wire.words import plural

if TYPE_CHECKING:
    from agents.alerts.component import AlertEngine

BUDGET_ALERTS = ((80.0, "warning"), (100.0, "critical"))  # a provider's month spend against its monthly budget (gateway)


@dataclass(frozen=True)
class Observation:
    """One rule looking at one target in one tick."""

    rule: str
    target: str  # "gpu0", "job 3", "model llama-3.1-8b", "disk"
    over: bool  # past the threshold
    clear: bool  # back inside the threshold by the hysteresis margin
    for_s: float  # how long `over` must hold before the alert fires
    level: str
    message: str
    value: float | None = None
    threshold: float | None = None
    gpu: int | None = None
    job: str | None = None
    model: str | None = None


@dataclass(frozen=True)
class View:
    """What every rule of one tick reads: the settings with their hysteresis bands, the GPUs that answered, the gateway."""

    settings: Alerts
    gpus: dict[int, GpuSample]
    gateway: GatewaySection | None

    @property
    def low(self) -> float:  # back under a limit by the hysteresis margin
        return 1 - self.settings.hysteresis_pct / 100

    @property
    def high(self) -> float:  # back over a floor by the hysteresis margin
        return 1 + self.settings.hysteresis_pct / 100


# ---------------------------------------------------------------- per GPU


def gpu_hot(engine: AlertEngine, view: View, g: GpuSample) -> Iterator[Observation]:
    s = view.settings
    if g.temp_c is not None:
        yield Observation(
            "gpu_hot",
            f"gpu{g.index}",
            g.temp_c > s.temp_c,
            g.temp_c < s.temp_c * view.low,
            s.temp_for_s,
            "critical",
            f"gpu{g.index} {g.name} at {g.temp_c:.0f} C (limit {s.temp_c:.0f} C)",
            g.temp_c,
            s.temp_c,
            gpu=g.index,
        )


def vram_full(engine: AlertEngine, view: View, g: GpuSample) -> Iterator[Observation]:
    s = view.settings
    if g.mem_used_bytes is not None and g.mem_total_bytes:
        pct = g.mem_used_bytes / g.mem_total_bytes * 100
        yield Observation(
            "vram_full",
            f"gpu{g.index}",
            pct > s.vram_pct,
            pct < s.vram_pct * view.low,
            s.vram_for_s,
            "warning",
            f"gpu{g.index} {g.name} VRAM {pct:.0f}% used (limit {s.vram_pct:.0f}%)",
            round(pct, 1),
            s.vram_pct,
            gpu=g.index,
        )


# ---------------------------------------------------------------- per job


def _job_name(job: JobInfo) -> str:
    return f"job {job.id} {job.recipe}"


def diverged(engine: AlertEngine, view: View, job: JobInfo) -> Iterator[Observation]:
    if job.diverged_at_step is not None:  # shown while the job is in the section, running or not
        yield Observation(
            "diverged",
            f"job {job.id}",
            True,
            False,
            0.0,
            "critical",
            f"{_job_name(job)}: loss: NaN, diverged at step {job.diverged_at_step}",
            job.diverged_at_step,
            job=job.id,
        )


def gpu_starved(engine: AlertEngine, view: View, job: JobInfo) -> Iterator[Observation]:
    s = view.settings
    if job.state != JobState.RUNNING:
        return
    for index in job.gpus:
        util = view.gpus[index].util_pct if index in view.gpus else None
        if util is not None:
            yield Observation(
                "gpu_starved",
                f"gpu{index}",
                util < s.starved_util_pct,
                util > s.starved_util_pct * view.high,
                s.starved_for_s,
                "warning",
                f"{_job_name(job)}: gpu{index} at {util:.0f}% utilisation (under {s.starved_util_pct:.0f}%): "
                "the GPU waits for data; check dataloader workers and I/O",
                util,
                s.starved_util_pct,
                gpu=index,
                job=job.id,
            )


def no_improvement(engine: AlertEngine, view: View, job: JobInfo) -> Iterator[Observation]:
    s = view.settings
    if job.state not in JOB_ACTIVE or (stalled := engine.steps_without_improvement(job.id, job)) is None:
        return
    steps, best = stalled
    yield Observation(
        "no_improvement",
        f"job {job.id}",
        steps >= s.no_improvement_steps,
        steps < s.no_improvement_steps,
        0.0,
        "warning",
        f"{_job_name(job)}: no loss improvement for {plural(steps, 'step')} (best {best.loss:.4g} at step {best.step})",
        steps,
        s.no_improvement_steps,
        job=job.id,
    )


def checkpoint_slow(engine: AlertEngine, view: View, job: JobInfo) -> Iterator[Observation]:
    s = view.settings
    saves = [(c.save_s, c) for c in job.checkpoints if c.save_s is not None]
    if job.state not in JOB_ACTIVE or not saves:
        return
    save_s, last = max(saves, key=lambda sc: (sc[1].at or 0, sc[1].step))
    yield Observation(
        "checkpoint_slow",
        f"job {job.id}",
        save_s > s.checkpoint_save_s,
        save_s < s.checkpoint_save_s * view.low,
        0.0,
        "warning",
        f"{_job_name(job)}: checkpoint save at step {last.step} took {save_s:.0f} s "
        f"(limit {s.checkpoint_save_s:.0f} s): save less often or to a faster disk",
        save_s,
        s.checkpoint_save_s,
        job=job.id,
    )


# ---------------------------------------------------------------- per model, per provider, the host


def engine_failed(engine: AlertEngine, view: View, model: ModelInfo) -> Iterator[Observation]:
    failed = model.state == ModelState.FAILED
    reason = model.error.message if model.error is not None else ""
    yield Observation(
        "engine_failed",
        f"model {model.name}",
        failed,
        not failed,
        0.0,
        "critical",
        f"model {model.name}: engine failed" + (f": {reason}" if reason else ""),
        model=model.name,
    )


def budget_spent(engine: AlertEngine, view: View, provider: ProviderSpend) -> Iterator[Observation]:
    spent_pct = provider.budget_pct
    if spent_pct is None or not provider.monthly_budget:
        return
    currency = view.gateway.currency if view.gateway is not None else ""
    for threshold, level in BUDGET_ALERTS:
        yield Observation(
            f"budget_{threshold:g}",
            f"provider {provider.name}",
            spent_pct >= threshold,
            spent_pct < threshold,
            0.0,
            level,
            f"{provider.name}: {spent_pct:.0f}% of its monthly budget spent ({provider.spend_month:.2f} of "
            f"{provider.monthly_budget:.2f} {currency})",
            round(spent_pct, 1),
            threshold,
        )


def disk_full(engine: AlertEngine, view: View, host: HostSample) -> Iterator[Observation]:
    s = view.settings
    if host.disk_total_bytes and host.disk_used_bytes is not None:
        free = (1 - host.disk_used_bytes / host.disk_total_bytes) * 100
        yield Observation(
            "disk_full",
            "disk",
            free < s.disk_free_pct,
            free > s.disk_free_pct * view.high,
            s.disk_for_s,
            "critical",
            f"disk {host.disk_path} {free:.1f}% free (under {s.disk_free_pct:.0f}%)",
            round(free, 2),
            s.disk_free_pct,
        )


# the tables, in the order observe runs them (and so the order their alerts fire within one tick)
GPU_RULES = (gpu_hot, vram_full)
JOB_RULES = (diverged, gpu_starved, no_improvement, checkpoint_slow)
MODEL_RULES = (engine_failed,)
PROVIDER_RULES = (budget_spent,)
HOST_RULES = (disk_full,)
