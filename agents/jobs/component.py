"""JobsComponent: launches trainer recipes, supervises them, re-adopts them after an agent restart.

Beside it: job.py (the job record and its views), progress.py (taking in a trainer's progress),
methods.py (jobs.* RPC), recipes.py (params and argv), launch.py (starting a recipe's process), runner.py (the process that
outlives the agent), multinode.py and node.py (a job over several machines: its coordinator, and each node).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from agents.jobs import recipes
from agents.jobs.gpu_load import check_starved, claim_sim_gpus
from agents.jobs.job import Job
from agents.jobs.launch import launch
from agents.jobs.logs import Follower, read_from, tail
from agents.jobs.methods import register
from agents.jobs.multinode import Coordinator
from agents.jobs.node import NodeLaunch
from agents.jobs.node import register as register_nodes
from agents.jobs.port import JobView
from agents.jobs.progress import update_progress
from agents.jobs.refind import found_on_disk
from agents.runtime.core import AgentCore
from agents.runtime.hooks import Hooks
from agents.runtime.procfiles import descendants
from agents.runtime.rpc import Peer
from agents.runtime.waits import within
from agents.wire.catalogue.jobs import JobLogs, LogsParams
from agents.wire.documents import MAX_DOCUMENT_BYTES, ChildRecord, ExitRecord, load_quietly
from agents.wire.events import LogEvent, Notice
from agents.wire.protocol import ErrorCode, RemoteError, Telemetry
from agents.wire.safe_read import READ_TIMEOUT_S, read_capped_async
from agents.wire.sections.jobs import JobDetail, JobInfo
from agents.wire.states import JOB_ACTIVE, JobState

if TYPE_CHECKING:
    from agents.runtime.peer_links import PeerLinkState
    from agents.wire.lab.model import Trainer

log = logging.getLogger("cetlab.jobs")

LAST_LINES = 20  # log lines kept in the record of a finished job
SECTION_FINISHED = 20  # finished jobs shown beside the active ones
KEPT_FINISHED = 200  # finished jobs kept in memory (for the checkpoints view); older ones stay in SQLite only
SECTION_LOSS_POINTS = 60
SECTION_LAST_LINES = 3
NO_PROGRESS_RUNNING_S = 3.0  # a command without a progress file counts as running after this long
CHILD_WAIT_S = 5.0  # how long stop/kill wait for the runner to name its trainer

SCHEMA = [
    """CREATE TABLE jobs (
        n INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT UNIQUE NOT NULL,
        recipe TEXT NOT NULL,
        record TEXT NOT NULL,   -- the job as JSON (see Job)
        state TEXT NOT NULL
    )""",
    "CREATE INDEX jobs_state ON jobs(state)",
]


PREFETCH_WAIT_S = 0.5  # how long a tick waits for the progress files' reads


async def _read_progress(path: Path) -> bytes | OSError:
    try:
        return await read_capped_async(path, MAX_DOCUMENT_BYTES)
    except TimeoutError:  # (an OSError too): no news this time
        return OSError(f"not read within {READ_TIMEOUT_S:g} s")
    except OSError as exc:  # missing (no news), not a regular file, too large: the parser says which
        return exc


def _alive(pid: int | None, started: float | None) -> bool:
    """This very process (pid and start time, so a reused pid is not mistaken) exists and is not a zombie."""
    if pid is None:
        return False
    try:
        proc = psutil.Process(pid)
        if started is not None and abs(proc.create_time() - started) > 0.05:
            return False
        alive: bool = proc.status() != psutil.STATUS_ZOMBIE
        return alive
    except psutil.Error:
        return False


def _children(pid: int) -> list[psutil.Process]:
    try:
        children: list[psutil.Process] = psutil.Process(pid).children()
        return children
    except psutil.Error:
        return []


class JobsComponent(Hooks):
    name = "jobs"

    def __init__(self, core: AgentCore) -> None:
        self.core = core
        self.logs_dir = core.state_dir / "logs"
        self.jobs_dir = core.state_dir / "jobs"
        self.jobs: dict[str, Job] = {}
        self.followers: dict[tuple[int, str], tuple[Peer, Follower]] = {}
        self._reads: dict[str, asyncio.Task[bytes | OSError]] = {}  # job id -> its progress file being read off the loop
        self._read: dict[str, bytes | OSError] = {}  # job id -> what the last finished read gave, for the next tick
        # followed logs, read off the loop the same way: (peer, job id) -> the read going on / what it gave
        # with each, whether the job had ended before the read began (only such a read has its last lines)
        self._log_reads: dict[tuple[int, str], tuple[asyncio.Task[tuple[list[str], int]], bool]] = {}
        self._log_read: dict[tuple[int, str], tuple[list[str], int, bool]] = {}
        self.coordinator = Coordinator(self)
        register(self)
        register_nodes(self)

    # -- lifecycle

    async def start(self) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.core.store.migrate("jobs", SCHEMA)
        self._load()
        await self.coordinator.start()

    async def stop(self) -> None:
        """Only the watch of multi-node jobs: jobs outlive the agent on purpose, and a restarted agent re-adopts them."""
        await self.coordinator.stop()

    def _load(self) -> None:
        active = sorted(JOB_ACTIVE)
        rows = self.core.store.query(
            f"SELECT id, record FROM jobs WHERE state IN ({','.join('?' * len(active))}) OR n > (SELECT COALESCE(MAX(n), 0) FROM jobs) - ? ORDER BY n",
            (*active, KEPT_FINISHED),
        )
        for row in rows:
            try:
                job = Job.from_record(row["record"])
            except (ValueError, TypeError) as exc:  # one bad record costs its job, not the agent's start
                log.error("job %s: its record in state.db is unreadable (%s); left out", row["id"], exc)
                continue
            self.jobs[job.id] = job
        known = {row["id"] for row in self.core.store.query("SELECT id FROM jobs")}
        for job in found_on_disk(self.jobs_dir, known):  # state.db lost them (deleted, or corrupt and moved aside)
            with self.core.store.transaction() as db:
                db.execute(
                    "INSERT INTO jobs (id, recipe, record, state) VALUES (?, ?, ?, ?)",
                    (job.id, job.recipe, job.record(), job.state),
                )
            log.warning("job %s (%s) found again in its folder: state.db had no record of it", job.id, job.recipe)
            self._read_child(job)  # its record is the one at launch: catch up with what it did since
            update_progress(job)
            self._maybe_running(job, time.time())
            self.jobs[job.id] = job
        for job in list(self.jobs.values()):
            if job.active:
                job.adopted = True
                if _alive(job.runner_pid, job.runner_started):
                    log.info("re-adopted job %s (runner pid %s)", job.id, job.runner_pid)
                else:
                    self._finish(job)  # ended while the agent was away: its exit code is on disk
                self.save(job)

    @staticmethod
    def _maybe_running(job: Job, now: float) -> None:
        """starting -> running: the trainer says it runs, or says nothing for a while."""
        trainer = job.progress.state if job.progress is not None else None
        if job.state == JobState.STARTING and (
            trainer in ("running", "saving") or (job.progress is None and now - job.started_at >= NO_PROGRESS_RUNNING_S)
        ):
            job.state = JobState.RUNNING

    def save(self, job: Job) -> None:
        with self.core.store.transaction() as db:
            db.execute("UPDATE jobs SET record=?, state=? WHERE id=?", (job.record(), job.state, job.id))

    # -- launching

    def next_id(self) -> str:
        """The next job id: past every job state.db knows and every job folder (a lost state.db starts counting again)."""
        n = self.core.store.query("SELECT COALESCE(MAX(n), 0) + 1 AS n FROM jobs")[0]["n"]
        while (self.jobs_dir / f"{self.core.machine.name}-{n}").exists():
            n += 1
        return f"{self.core.machine.name}-{n}"

    async def start_recipe(
        self,
        name: str,
        given: dict[str, Any],
        gpus: list[int] | None = None,
        queued: tuple[str | None, str | None] = (None, None),
    ) -> Job:
        """Start a recipe of this machine: over all its nodes when it has nodes (this agent coordinates), else here;
        ``gpus``: a recipe by need's, as the lab queue chose them; ``queued``: its queue entry and submitter."""
        recipe = recipes.find_recipe(self.core.lab, name, self.core.machine.name)
        if recipe.nodes:
            job = await self.coordinator.start_job(recipe, given)
        else:
            latest = self.core.latest
            recipe = recipes.placed(recipe, gpus, self.core.machine.name, latest.gpus if latest is not None else [])
            job = self.start_job(name, given, recipe=recipe)
        if queued != (None, None):
            job.queued_as, job.user = queued
            self.save(job)
        return job

    def start_job(self, name: str, given: dict[str, Any], node: NodeLaunch | None = None, recipe: Trainer | None = None) -> Job:
        """Check everything, then launch; any problem is a typed error before a process exists. ``node``: one node of a
        multi-node job; ``recipe``: the recipe as placed (a recipe by need on its chosen GPUs)."""
        return launch(self, name, given, node, recipe)

    def forget(self, job: Job) -> None:
        """Drop a job whose runner has ended as if it never started (its log stays): node 0 starting again on another port."""
        self.jobs.pop(job.id, None)
        with self.core.store.transaction() as db:
            db.execute("DELETE FROM jobs WHERE id=?", (job.id,))
        for name in ("child.json", "exit.json", "progress.json"):
            (Path(job.job_dir) / name).unlink(missing_ok=True)

    # -- stopping

    async def _trainer_pid(self, job: Job) -> int | None:
        """The trainer's pid (its process group), once the runner has started it."""
        deadline = time.monotonic() + CHILD_WAIT_S
        while job.pid is None and job.active and time.monotonic() < deadline:
            self._read_child(job)
            if job.pid is None:
                await asyncio.sleep(0.05)
        return job.pid

    def _signal(self, job: Job, sig: signal.Signals) -> None:
        if job.pid is None or not _alive(job.pid, job.pid_started):
            return
        # torchrun starts its workers in sessions of their own: a kill must reach the whole tree, not the group alone
        tree = descendants(job.pid) if sig == signal.SIGKILL else []
        if sig == signal.SIGTERM and job.node_rank is not None and (workers := _children(job.pid)):
            # a node of a multi-node job: its workers stop at the step all ranks agree on and exit 0, and torchrun
            # with them (its own SIGTERM handler would exit 1); before the workers exist torchrun itself gets it
            tree = workers
        else:
            try:
                os.killpg(job.pid, sig)
            except ProcessLookupError:
                pass
        for proc in tree:
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass

    async def stop_everywhere(self, job: Job, grace_s: float | None, kill: bool) -> Job:
        """Stop or kill a job: on every node when this agent coordinates it, else here."""
        if job.nodes and job.coordinator == self.core.machine.name:
            return await self.coordinator.stop_job(job, grace_s, kill)
        return await self.stop_job(job, grace_s, kill)

    async def stop_job(self, job: Job, grace_s: float | None, kill: bool) -> Job:
        if not job.active:
            raise RemoteError(
                ErrorCode.CONFLICT,
                f"job {job.id} has already {job.state}" + (f" (exit code {job.exit_code})" if job.exit_code is not None else ""),
            )
        await self._trainer_pid(job)
        recipe = next((r for r in self.core.lab.trainers if r.name == job.recipe), None)
        grace = grace_s if grace_s is not None else (recipe.stop_grace_s if recipe else 60.0)
        job.state = JobState.STOPPING
        if kill or job.stop_requested == "kill":
            job.stop_requested, job.kill_at = "kill", time.time()
            self._signal(job, signal.SIGKILL)
        else:
            job.stop_requested = "stop"
            job.kill_at = min(job.kill_at or float("inf"), time.time() + grace)
            self._signal(job, signal.SIGTERM)
        self.save(job)
        return job

    # -- supervision, once per tick

    def _read_child(self, job: Job) -> None:
        child = load_quietly(Path(job.job_dir) / "child.json", ChildRecord)
        if child is not None:
            job.pid, job.pid_started = child.pid, child.create_time

    def _runner_ended(self, job: Job) -> bool:
        if job.popen is not None:
            return job.popen.poll() is not None  # our child: reap it
        return not _alive(job.runner_pid, job.runner_started)

    def finish_ended(self, job: Job) -> None:
        """Record the outcome of a job whose runner has ended now, not at the next tick."""
        if job.active and self._runner_ended(job):
            self._finish(job)

    def _finish(self, job: Job) -> None:
        """The runner is gone: take the exit code it recorded, or call the job lost."""
        update_progress(job)
        ended = load_quietly(Path(job.job_dir) / "exit.json", ExitRecord)
        job.ended_at = (ended.ended_at if ended is not None else None) or time.time()
        if ended is None or ended.exit_code is None:
            job.state = JobState.LOST
            job.error = "the job's runner ended without recording an exit code (killed, or the machine rebooted)"
        else:
            job.exit_code = ended.exit_code
            stopped = job.stop_requested is not None
            job.state = JobState.EXITED if job.exit_code == 0 or stopped else JobState.FAILED
            if job.state == JobState.FAILED:
                job.error = ended.error or (job.progress.error if job.progress else None) or f"exited with code {job.exit_code}"
        if job.failure is not None:  # the coordinator failed the job (another node failed): that is its outcome on every node
            job.state, job.error = JobState.FAILED, job.failure
        job.last_lines = tail(Path(job.log_path), LAST_LINES).lines
        job.starved = False
        job.popen = job.proc = None
        finished = sorted((j for j in self.jobs.values() if not j.active), key=lambda j: j.started_at)
        for old in finished[:-KEPT_FINISHED]:
            del self.jobs[old.id]
        self.core.release_gpus(f"job:{job.id}")
        log.info("job %s %s (exit code %s)", job.id, job.state, job.exit_code)
        self.core.notify(
            Notice(
                level="info" if job.state == JobState.EXITED else "error",
                message=f"job {job.id} ({job.recipe}) {job.state}"
                + (f" with exit code {job.exit_code}" if job.exit_code is not None else ""),
            )
        )

    async def prefetch(self) -> None:
        """Before a tick: the active jobs' progress files read in threads (the agent waits at most PREFETCH_WAIT_S; a
        read still going is left to finish, never started twice). A trainer controls that file: see agents/wire/safe_read.py."""
        for job in self.jobs.values():
            if job.active and job.id not in self._reads:
                self._reads[job.id] = asyncio.create_task(_read_progress(Path(job.job_dir) / "progress.json"))
        for key, (_peer, follower) in self.followers.items():
            if key not in self._log_reads and key not in self._log_read:
                followed = self.jobs.get(key[1])
                done = followed is None or not followed.active
                self._log_reads[key] = (asyncio.create_task(asyncio.to_thread(_read_follower, follower)), done)
        reads: list[asyncio.Task[Any]] = [*self._reads.values(), *(task for task, _ in self._log_reads.values())]
        if reads:
            await asyncio.wait(reads, timeout=PREFETCH_WAIT_S)
        for job_id, task in list(self._reads.items()):
            if task.done():
                del self._reads[job_id]
                self._read[job_id] = task.result()
        for key, (log_task, done) in list(self._log_reads.items()):
            if log_task.done():
                del self._log_reads[key]
                self._log_read[key] = (*log_task.result(), done)

    def on_telemetry(self, telemetry: Telemetry) -> None:
        now = time.time()
        for job in list(self.jobs.values()):
            if not job.active or job.id in self.coordinator.starting:  # node 0 of a multi-node job getting its port: not yet
                continue
            before = job.record()
            if job.pid is None:
                self._read_child(job)
            raw = self._read.pop(job.id, None)
            progressed = update_progress(job, raw) if raw is not None else False
            if self._runner_ended(job):
                self._finish(job)
            else:
                self._maybe_running(job, now)
                if (
                    job.state == JobState.STOPPING
                    and job.kill_at is not None
                    and now >= job.kill_at
                    and job.stop_requested == "stop"
                ):
                    log.warning("job %s did not stop within its grace period: SIGKILL", job.id)
                    job.stop_requested = "kill"
                    self._signal(job, signal.SIGKILL)
                claim_sim_gpus(self.core, job)
                check_starved(job, telemetry, self.core.lab.alerts, now)
            if progressed or job.record() != before:
                self.save(job)
        self._push_logs()

    # -- logs

    def _push_logs(self) -> None:
        for key, (peer, _follower) in list(self.followers.items()):
            job_id = key[1]
            if peer.closed or f"log:{job_id}" not in peer.topics:
                del self.followers[key]
                self._forget_read(key)
                continue
            if key not in self._log_read:  # its read is still going (prefetch): its lines come at a later tick
                continue
            lines, offset, ended = self._log_read.pop(key)  # ended: before the read, so it read the log's end
            job = self.jobs.get(job_id)
            if lines or ended:
                event = LogEvent(
                    job=job_id,
                    lines=lines,
                    offset=offset,
                    ended=ended and not lines,
                    state=job.state if job else None,
                    exit_code=job.exit_code if job else None,
                )
                peer.push(event.event, event.to_wire())
            if ended and not lines:
                del self.followers[key]

    def _forget_read(self, key: tuple[int, str]) -> None:
        self._log_read.pop(key, None)
        self._log_reads.pop(key, None)  # still going: it ends in its thread, and nobody reads what it gave

    async def logs(self, peer: Peer, job: Job, params: LogsParams) -> JobLogs:
        """jobs.logs: the tail (up to TAIL_MAX_BYTES of each of two files) or a range, read in a thread with a timeout: a
        big log, a slow disk or a hung mount costs this call, never the ticks."""
        path = Path(job.log_path)
        cut = False
        try:
            if params.offset is None:
                lines, offset, cut = await within(asyncio.to_thread(tail, path, params.tail_lines), READ_TIMEOUT_S)
            else:
                lines, offset = await within(asyncio.to_thread(read_from, path, params.offset), READ_TIMEOUT_S)
        except TimeoutError:
            raise RemoteError(
                ErrorCode.UNAVAILABLE, f"job {job.id}'s log took over {READ_TIMEOUT_S:.0f} s to read on {self.core.machine.name}"
            ) from None
        if params.follow:
            peer.topics.add(f"log:{job.id}")
            self._forget_read((id(peer), job.id))  # a read of the follower this one replaces is not this one's
            self.followers[(id(peer), job.id)] = (peer, Follower(path, offset))
        return JobLogs(id=job.id, path=str(path), lines=lines, offset=offset, state=job.state, cut=cut)

    # -- state

    def peer_links(self) -> list[PeerLinkState]:
        """PeerLinksPort: a multi-node coordinator's links to its other nodes (role node there)."""
        peers = self.coordinator.peers
        return peers.link_states("multi-node", "node") if peers is not None else []

    def section(self) -> list[JobInfo]:
        now = time.time()
        jobs = sorted(self.jobs.values(), key=lambda j: j.started_at, reverse=True)
        finished = [j for j in jobs if not j.active][:SECTION_FINISHED]
        keep = {j.id for j in finished}
        section = []
        for job in jobs:
            if job.active or job.id in keep:
                try:
                    section.append(self._pushed(job, now))
                except ValueError as exc:  # a record that fits no JobInfo costs its own row, not the section
                    log.error("job %s cannot be shown: %s", job.id, exc)
        return section

    def _pushed(self, job: Job, now: float) -> JobInfo:
        """A job as pushed to every console at every change: trimmed (jobs.get has the rest)."""
        info = job.info(self.core.simulated, now)
        info.loss_history = info.loss_history[-SECTION_LOSS_POINTS:]
        info.last_lines = info.last_lines[-SECTION_LAST_LINES:]
        return info

    def views(self) -> list[JobView]:
        """Every job in memory as a read-only copy, oldest first: what other components may know of jobs."""
        return [job.view() for job in sorted(self.jobs.values(), key=lambda j: j.started_at)]

    def view(self, job_id: str) -> JobView:
        return self.get(job_id).view()

    async def launch(self, recipe: str, params: dict[str, Any]) -> JobDetail:
        return (await self.start_recipe(recipe, params)).detail(self.core.simulated)

    def get(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            rows = self.core.store.query("SELECT record FROM jobs WHERE id=?", (job_id,))
            if not rows:
                raise RemoteError(ErrorCode.NOT_FOUND, f"no job {job_id!r} on {self.core.machine.name} (see `cetlab jobs`)")
            try:
                job = Job.from_record(rows[0]["record"])
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
                raise RemoteError(
                    ErrorCode.UNAVAILABLE,
                    f"job {job_id!r}: its record in state.db is damaged ({type(exc).__name__}: {str(exc)[:200]})",
                ) from None
        return job


def _read_follower(follower: Follower) -> tuple[list[str], int]:
    """A follower's new lines, in a thread (a log on a slow disk costs its own lines, never the tick)."""
    try:
        return follower.read()
    except OSError:  # the log is gone, or no regular file: nothing new this time
        return [], follower.offset
