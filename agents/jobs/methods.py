"""The jobs.* methods and their params."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from agents.jobs import recipes
from agents.jobs.job import Job
from agents.runtime.rpc import Peer
from agents.wire.catalogue.jobs import (
    JobListParams as ListParams,
)
from agents.wire.catalogue.jobs import (
    JobParams,
    LogsParams,
    StartParams,
    StopParams,
)
from agents.wire.protocol import Role
from agents.wire.sections.jobs import JobInfo
from agents.wire.states import JobState

if TYPE_CHECKING:
    from agents.jobs.component import JobsComponent

log = logging.getLogger("cetlab.jobs")


def damaged_job(job_id: str, recipe: object, machine: str, exc: Exception) -> dict[str, Any]:
    """A job whose record in state.db cannot be read, as a listing line that says so."""
    log.error("job %s: its record in state.db is unreadable (%s); listed as damaged", job_id, str(exc)[:200])
    return JobInfo(
        id=str(job_id),
        recipe=recipe if isinstance(recipe, str) else "?",
        machine=machine,
        state=JobState.LOST,
        started_at=0.0,
        output_dir="",
        log_path="",
        damaged=True,
        error=f"damaged record in state.db: {type(exc).__name__}: {str(exc)[:200]}",
    ).to_wire()


def register(jobs: JobsComponent) -> None:
    """The jobs.* methods."""
    core = jobs.core
    rpc = core.rpc

    @rpc.method("jobs.recipes", doc="The recipes of this machine with their launch params.")
    async def list_recipes(peer: Peer, _params) -> list:
        return [recipes.recipe_json(r) for r in core.lab.trainers if r.machine == core.machine.name]

    @rpc.method("jobs.list", params=ListParams, doc="Jobs, newest first: the active ones and recent history.")
    async def list_jobs(peer: Peer, params: ListParams) -> list:
        rows = core.store.query("SELECT id, recipe, record FROM jobs ORDER BY n DESC LIMIT ?", (params.limit,))
        now = time.time()
        listed = []
        for row in rows:
            try:
                job = jobs.jobs.get(row["id"]) or Job.from_record(row["record"])
                listed.append(job.to_json(core.simulated, now))
            except (
                ValueError,
                TypeError,
                KeyError,
                AttributeError,
                RecursionError,
            ) as exc:  # one bad row costs its own line only
                listed.append(damaged_job(row["id"], row["recipe"], core.machine.name, exc))
        return listed

    @rpc.method("jobs.get", params=JobParams, doc="One job, with its command line and last log lines.")
    async def get_job(peer: Peer, params: JobParams) -> dict:
        job = jobs.get(params.id)
        return job.detail(core.simulated).to_wire()

    @rpc.method("jobs.start", role=Role.OPERATOR, params=StartParams, doc="Launch a recipe with validated params.")
    async def start_job(peer: Peer, params: StartParams) -> dict:
        job = await jobs.start_recipe(params.recipe, params.params)
        log.info("job %s started by %s", job.id, peer.who)
        return job.detail(core.simulated).to_wire()

    @rpc.method(
        "jobs.stop", role=Role.OPERATOR, params=StopParams, doc="SIGTERM to the job's process group; SIGKILL after grace_s."
    )
    async def stop_job(peer: Peer, params: StopParams) -> dict:
        job = await jobs.stop_everywhere(jobs.get(params.id), params.grace_s, kill=False)
        log.info("job %s stop requested by %s", job.id, peer.who)
        return job.to_json(core.simulated)

    @rpc.method("jobs.kill", role=Role.OPERATOR, params=JobParams, doc="SIGKILL to the job's process group now.")
    async def kill_job(peer: Peer, params: JobParams) -> dict:
        job = await jobs.stop_everywhere(jobs.get(params.id), None, kill=True)
        log.info("job %s killed by %s", job.id, peer.who)
        return job.to_json(core.simulated)

    @rpc.method("jobs.logs", params=LogsParams, doc="Log lines: the tail, or from an offset; follow pushes `log` events.")
    async def job_logs(peer: Peer, params: LogsParams) -> dict:
        return jobs.logs(peer, jobs.get(params.id), params)
