"""A job's load on its GPUs: what a simulated GPU shows for it, and whether its GPUs starve."""

from __future__ import annotations

import psutil

from agents.jobs.job import Job
from agents.runtime.core import AgentCore
from agents.wire.lab.model import Alerts
from agents.wire.protocol import Telemetry
from agents.wire.states import JobState

SIM_UTIL_CAP_PCT = 97.0  # a busy simulated GPU, as real ones read under a trainer


def claim_sim_gpus(core: AgentCore, job: Job) -> None:
    """Simulated GPUs show what the trainer really does on the CPU: its RSS as VRAM, its CPU as load.

    The load of each GPU is the job's CPU per GPU against the share of the machine's cores one GPU's
    process can have: torchrun's four ranks on two cores at 50% each are four busy GPUs, and a rank that
    waits (on data, on a lock) shows as a starved GPU, as it would on real hardware. On a machine busy with other work
    (a load average above its cores) that share is the cores over the load: a rank that takes all the CPU it can get
    there is busy, not starved (it waits on the CPU, not on its data)."""
    if not job.gpus or job.pid is None or not core.simulated:
        return
    try:
        if job.proc is None or job.proc.pid != job.pid:
            job.proc, job.child_procs = psutil.Process(job.pid), {}
            job.proc.cpu_percent(None)
        children = []
        for child in job.proc.children(recursive=True):  # kept: a fresh Process's first cpu_percent is always 0
            known = job.child_procs.get(child.pid)
            if known is None or known.create_time() != child.create_time():
                known = job.child_procs[child.pid] = child
                known.cpu_percent(None)
            children.append(known)
        job.child_procs = {p.pid: p for p in children}
        procs = [job.proc, *children]
        cpu_pct = sum(p.cpu_percent(None) for p in procs)
        rss = sum(p.memory_info().rss for p in procs)
    except psutil.Error:
        return
    cores = psutil.cpu_count() or 1
    contenders = max(float(len(job.gpus)), psutil.getloadavg()[0])
    fair_share_pct = min(100.0, 100.0 * cores / contenders)
    util = min(SIM_UTIL_CAP_PCT, cpu_pct / len(job.gpus) / fair_share_pct * 100)
    core.claim_gpus(job.gpus, f"job:{job.id}", f"job {job.id} {job.recipe}", rss, util, pid=job.pid)


def check_starved(job: Job, telemetry: Telemetry, alerts: Alerts, now: float) -> None:
    """A running job whose GPUs all stay under `starved_util_pct` for `starved_for_s` is starved (its data cannot keep up)."""
    utils = [g.util_pct for g in telemetry.gpus if g.index in job.gpus and g.util_pct is not None]
    if job.state != JobState.RUNNING or not utils or max(utils) >= alerts.starved_util_pct:
        job.starved_since, job.starved = None, False
        return
    job.starved_since = job.starved_since or now
    job.starved = now - job.starved_since >= alerts.starved_for_s
