"""The jobs.* methods and their params."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from agents.jobs import recipes
from agents.jobs.job import Job
from agents.runtime.rpc import Peer
from agents.wire.catalogue.jobs import (
    JOBS_GET,
    JOBS_KILL,
    JOBS_LIST,
    JOBS_LOGS,
    JOBS_RECIPES,
    JOBS_START,
    JOBS_STOP,
    JobList,
    JobLogs,
    JobParams,
    LogsParams,
    RecipeList,
    StartParams,
    StopParams,
)
from agents.wire.catalogue.jobs import (
    JobListParams as ListParams,
)
from agents.wire.catalogue.method import NoParams
from agents.wire.sections.jobs import JobDetail, JobInfo
from agents.wire.states import JobState

if TYPE_CHECKING:
    from agents.jobs.component import JobsComponent

log = logging.getLogger("cetlab.jobs")


def damaged_job(job_id: str, recipe: object, machine: str, exc: Exception) -> JobInfo:
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
    )


def register(jobs: JobsComponent) -> None:
    """The jobs.* methods."""
    core = jobs.core
    rpc = core.rpc

    @rpc.implements(JOBS_RECIPES)
    async def list_recipes(peer: Peer, _params: NoParams) -> RecipeList:
        return RecipeList([recipes.recipe_info(r) for r in core.lab.trainers if r.machine == core.machine.name])

    @rpc.implements(JOBS_LIST)
    async def list_jobs(peer: Peer, params: ListParams) -> JobList:
        rows = core.store.query("SELECT id, recipe, record FROM jobs ORDER BY n DESC LIMIT ?", (params.limit,))
        now = time.time()
        listed: list[JobInfo] = []
        for row in rows:
            try:
                job = jobs.jobs.get(row["id"]) or Job.from_record(row["record"])
                listed.append(job.info(core.simulated, now))
            except (
                ValueError,
                TypeError,
                KeyError,
                AttributeError,
                RecursionError,
            ) as exc:  # one bad row costs its own line only
                listed.append(damaged_job(row["id"], row["recipe"], core.machine.name, exc))
        return JobList(listed)

    @rpc.implements(JOBS_GET)
    async def get_job(peer: Peer, params: JobParams) -> JobDetail:
        return jobs.get(params.id).detail(core.simulated)

    @rpc.implements(JOBS_START)
    async def start_job(peer: Peer, params: StartParams) -> JobDetail:
        job = await jobs.start_recipe(params.recipe, params.params, params.gpus, (params.queued_as, params.user))
        log.info("job %s started by %s", job.id, peer.who)
        return job.detail(core.simulated)

    @rpc.implements(JOBS_STOP)
    async def stop_job(peer: Peer, params: StopParams) -> JobInfo:
        job = await jobs.stop_everywhere(jobs.get(params.id), params.grace_s, kill=False)
        log.info("job %s stop requested by %s", job.id, peer.who)
        return job.info(core.simulated)

    @rpc.implements(JOBS_KILL)
    async def kill_job(peer: Peer, params: JobParams) -> JobInfo:
        job = await jobs.stop_everywhere(jobs.get(params.id), None, kill=True)
        log.info("job %s killed by %s", job.id, peer.who)
        return job.info(core.simulated)

    @rpc.implements(JOBS_LOGS)
    async def job_logs(peer: Peer, params: LogsParams) -> JobLogs:
        return await jobs.logs(peer, jobs.get(params.id), params)
