"""One training job over several machines: the first node's agent coordinates the others through torchrun's c10d rendezvous.

The coordinator (the agent of a recipe's first node) starts its own node, then asks every other
node's agent (``jobs.node_start``, with its node key, role ``node`` there) to start theirs. Each
agent runs its own torchrun under its own runner, so each node is an ordinary job there (same id)
that survives its agent and is re-adopted by it. The coordinator polls the nodes every second: a node
that fails, or whose agent does not answer for the lab's alerts.offline_for_s, fails the job on every node, naming it.
(A node's trainer outlives its agent, so a short agent restart is not a failure; a machine that is really gone
breaks the collective first, and the node that notices fails.)
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from agents.jobs.job import Job
from agents.jobs.node import RDZV_PORTS, launch_for
from agents.runtime.procfiles import descendants
from agents.runtime.waits import within
from agents.wire.catalogue.jobs import (
    JOBS_NODE_START,
    JOBS_NODE_STATUS,
    JOBS_NODE_STOP,
    NodeStartParams,
    NodeStatusParams,
    NodeStopParams,
)
from agents.wire.catalogue.method import Method, P, R, ReplyInvalid, request
from agents.wire.lab.model import Trainer
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.safe_read import READ_TIMEOUT_S, read_range
from agents.wire.sections.jobs import JobNode, NodeStatus
from agents.wire.states import JOB_ACTIVE, NODE_OFFLINE, JobState

if TYPE_CHECKING:
    from agents.jobs.component import JobsComponent
    from agents.runtime.peers import PeerClient

log = logging.getLogger("cetlab.jobs")

POLL_S = 1.0  # how often the coordinator asks its nodes how they are
START_TIMEOUT_S = 30.0
RDZV_TRIES = 3  # rendezvous ports tried when another process takes the chosen one before torchrun binds it
RDZV_LISTEN_WAIT_S = 120.0  # torchrun imports torch before it binds its store: seconds, more on a busy machine
RDZV_TAKEN = ("EADDRINUSE", "address already in use")  # how torch's TCPStore says it could not bind


def store_listens(job: Job, port: int) -> bool:
    """Whether a process of ``job`` (node 0's torchrun hosts the c10d store) listens on ``port``."""
    if job.runner_pid is None:
        return False
    for proc in descendants(job.runner_pid):
        try:
            if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in proc.net_connections("tcp")):
                return True
        except psutil.Error:
            continue
    return False


def lost_port(log_path: str, offset: int) -> bool:
    """Whether the log written since ``offset`` says torchrun could not bind its rendezvous port."""
    try:  # the trainer writes this log: a regular file only, 1 MiB at most (called in a thread, with a timeout)
        data, _size = read_range(log_path, offset, 1 << 20)
    except OSError:
        return False
    text = data.decode("utf-8", "replace")
    return any(sign in text for sign in RDZV_TAKEN)


async def _lost_port_async(log_path: str, offset: int) -> bool:
    """lost_port off the event loop; a log that takes over READ_TIMEOUT_S to read says nothing of the port."""
    try:
        return await within(asyncio.to_thread(lost_port, log_path, offset), READ_TIMEOUT_S)
    except TimeoutError:
        return False


def rdzv_port(recipe: Trainer, avoid: frozenset[int] = frozenset()) -> int:
    """The rendezvous port of a new job of ``recipe``: its rdzv_port, else the first free one of RDZV_PORTS here (not in
    ``avoid``: ports another process took before torchrun could bind them). RDZV_PORTS lie below the kernel's ephemeral
    range, so no outgoing connection lands on one between this choice and torchrun's bind."""
    if recipe.rdzv_port is not None:
        return recipe.rdzv_port
    for port in RDZV_PORTS:
        if port in avoid:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            return port
    raise RemoteError(
        ErrorCode.UNAVAILABLE,
        f"no free rendezvous port in {RDZV_PORTS.start}-{RDZV_PORTS.stop - 1} for recipe "
        f"{recipe.name}: set its rdzv_port in lab.yaml",
    )


class Coordinator:
    """The multi-node side of JobsComponent: starts, stops and watches the jobs whose first node is this machine."""

    def __init__(self, jobs: JobsComponent):
        self.jobs = jobs
        self.peers: PeerClient | None = None
        self.task: asyncio.Task[None] | None = None
        self.starting: dict[str, asyncio.Task[None]] = {}  # job id -> its start: node 0 gets its port, then the others start
        self.silent_since: dict[tuple[str, str], float] = {}  # (job, machine) -> when its agent stopped answering

    async def start(self) -> None:
        core = self.jobs.core
        me = core.machine.name
        others = sorted({n.machine for r in core.lab.trainers if r.nodes and r.machine == me for n in r.nodes[1:]})
        if others:
            from agents.runtime.peers import NODE_KEY_NAME, PeerClient  # peer links only where a multi-node job starts here

            self.peers = PeerClient(core.lab, core.state_dir, machines=others, topics=[], key_name=NODE_KEY_NAME)
            await self.peers.start()
            self.task = asyncio.create_task(self._watch(), name="multinode-watch")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        for task in list(self.starting.values()):
            task.cancel()
        if self.peers is not None:
            await self.peers.stop()

    async def _request(self, machine: str, method: Method[P, R], params: P, timeout: float = 10.0) -> R:
        if self.peers is None:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"{self.jobs.core.machine.name} coordinates no multi-node recipe")
        link = self.peers.links.get(machine)
        if link is not None and not link.online.is_set():
            try:  # a link still connecting (the agent just started) gets a moment
                await within(link.online.wait(), 5.0)
            except TimeoutError:
                pass
        return await request(self.peers, machine, method, params, timeout)

    # -- start and stop

    async def start_job(self, recipe: Trainer, given: dict[str, Any]) -> Job:
        """Start node 0 here; once its torchrun holds the rendezvous port, every other node at once (in the background)."""
        core = self.jobs.core
        running = [j.id for j in self.jobs.jobs.values() if j.recipe == recipe.name and j.nodes and j.active]
        if running:  # its nodes take one job of the recipe at a time: said here, before node 0 starts
            raise RemoteError(
                ErrorCode.CONFLICT,
                f"job {running[0]} of recipe {recipe.name} still runs: one job of a multi-node recipe at a time",
                {"job": running[0]},
            )
        port = rdzv_port(recipe)
        job_id = self.jobs.next_id()
        job = self.jobs.start_job(recipe.name, given, launch_for(recipe, core.machine.name, 0, job_id, core.machine.host, port))
        job.nodes = [JobNode(machine=n.machine, gpus=list(n.gpus), state=JobState.STARTING) for n in recipe.nodes]
        self.jobs.save(job)
        task = asyncio.create_task(self._start_nodes(recipe, given, job, port), name=f"multinode-start-{job_id}")
        self.starting[job_id] = task
        task.add_done_callback(lambda _: self.starting.pop(job_id, None))
        return job

    async def _start_nodes(self, recipe: Trainer, given: dict[str, Any], job: Job, port: int) -> None:
        try:
            job, port = await self._hold_port(recipe, given, job, port)
        except RemoteError as lost:
            job.failure = lost.message
            self.jobs.finish_ended(job)  # node 0's runner has ended: the job fails with this as its error
            first = job.nodes[0]
            first.state, first.exit_code, first.error = job.state, job.exit_code, job.error
            for node in job.nodes[1:]:
                node.state, node.error = JobState.FAILED, "not started"
            self.jobs.save(job)
            log.warning("job %s failed: %s", job.id, lost.message)
            return
        if job.stop_requested is not None:  # stopped before the others started: nothing to stop there
            for node in job.nodes[1:]:
                node.state, node.error = JobState.EXITED, None
            self.jobs.save(job)
            return
        calls = [
            self._request(
                n.machine,
                JOBS_NODE_START,
                NodeStartParams(id=job.id, recipe=recipe.name, params=given, node_rank=rank, rdzv_port=port),
                timeout=START_TIMEOUT_S,
            )
            for rank, n in enumerate(recipe.nodes)
            if rank > 0
        ]
        results = await asyncio.gather(*calls, return_exceptions=True)
        refused = [(n.machine, r) for n, r in zip(recipe.nodes[1:], results) if isinstance(r, BaseException)]
        if refused:
            machine, exc = refused[0]
            reason = f"node {machine} could not start: {exc.message if isinstance(exc, RemoteError) else exc}"
            job.failure = reason
            await self._fail_all(job, reason)
            return
        self.jobs.save(job)

    async def _hold_port(self, recipe: Trainer, given: dict[str, Any], job: Job, port: int) -> tuple[Job, int]:
        """Wait until node 0's torchrun listens on the rendezvous port; when another process took the port first, start it again.

        A port can be taken between choosing it and torchrun binding it (EADDRINUSE): then that try is
        forgotten (its log keeps a line saying so) and node 0 starts again, same job id, on another port,
        so the other nodes only ever get a port node 0's store holds. Returns node 0's job and its port.
        """
        me = self.jobs.core.machine.name
        lost: set[int] = set()
        offset = 0  # where this try's output starts in the job's log (a new job id: a new log)
        for attempt in range(1, RDZV_TRIES + 1):
            deadline = time.monotonic() + RDZV_LISTEN_WAIT_S
            while (
                job.popen is not None
                and job.popen.poll() is None
                and not store_listens(job, port)
                and time.monotonic() < deadline
            ):
                await asyncio.sleep(0.2)
            if job.popen is None or job.popen.poll() is None or not await _lost_port_async(job.log_path, offset):
                return job, port  # listening, or failed for its own reasons (the tick and the watch report those)
            lost.add(port)
            if recipe.rdzv_port is not None or attempt == RDZV_TRIES:
                raise RemoteError(
                    ErrorCode.UNAVAILABLE,
                    f"node {me} could not listen on rendezvous port {port}: another process holds it "
                    f"(EADDRINUSE); "
                    + (
                        "free it or change the recipe's rdzv_port"
                        if recipe.rdzv_port is not None
                        else f"{RDZV_TRIES} ports tried"
                    ),
                )
            log.warning(
                "job %s: rendezvous port %d was taken before torchrun bound it; starting node 0 again on another port",
                job.id,
                port,
            )
            with open(job.log_path, "a", encoding="utf-8") as out:
                out.write(
                    f"cetlab: rendezvous port {port} was taken before torchrun bound it (EADDRINUSE): starting again on another port\n"
                )
            nodes = job.nodes
            self.jobs.forget(job)
            offset = Path(job.log_path).stat().st_size
            port = rdzv_port(recipe, avoid=frozenset(lost))
            job = self.jobs.start_job(recipe.name, given, launch_for(recipe, me, 0, job.id, self.jobs.core.machine.host, port))
            job.nodes = nodes
            self.jobs.save(job)
        raise AssertionError("unreachable: the last try returns or raises")

    async def stop_job(self, job: Job, grace_s: float | None, kill: bool) -> Job:
        """SIGTERM (or SIGKILL) to every node's torchrun at once; the ranks agree on the step they stop at."""
        running = [n for n in job.nodes[1:] if n.state in JOB_ACTIVE]
        remote = [
            asyncio.create_task(self._request(n.machine, JOBS_NODE_STOP, NodeStopParams(id=job.id, kill=kill, grace_s=grace_s)))
            for n in running
        ]
        if not job.active and not remote:
            raise RemoteError(ErrorCode.CONFLICT, f"job {job.id} has already {job.state}")
        if job.active:
            await self.jobs.stop_job(job, grace_s, kill)
        for node, result in zip(running, await asyncio.gather(*remote, return_exceptions=True)):
            if isinstance(result, BaseException):
                log.warning("job %s: stopping node %s: %s", job.id, node.machine, result)
        return job

    async def _fail_all(self, job: Job, reason: str) -> None:
        """Kill every node still running, each recording the reason as its error."""
        calls = [
            self._request(n.machine, JOBS_NODE_STOP, NodeStopParams(id=job.id, kill=True, reason=reason))
            for n in job.nodes[1:]
            if n.state in JOB_ACTIVE
        ]
        if job.active:
            await self.jobs.stop_job(job, None, kill=True)
        else:
            job.state, job.error = JobState.FAILED, reason
        for result in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(result, BaseException):
                log.warning("job %s: killing a node: %s", job.id, result)
        self.jobs.save(job)

    # -- watching

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            for job in [
                j
                for j in self.jobs.jobs.values()
                if j.nodes and j.coordinator == self.jobs.core.machine.name and j.id not in self.starting
            ]:
                if job.active or any(n.state in JOB_ACTIVE for n in job.nodes):
                    try:
                        await self._poll(job)
                    except Exception:  # one job's trouble must not end the watch of the others
                        log.exception("job %s: watching its nodes failed", job.id)

    async def _poll(self, job: Job) -> None:
        now = time.time()
        seen = [NodeStatus.seen(job.state, job.exit_code, job.error, job.ended_at, job.last_lines)]
        for node in job.nodes[1:]:
            seen.append(await self._status_of(job, node, now))
        changed = False
        rank_0_here = (Path(job.job_dir) / "progress.json").exists()  # c10d ranks nodes itself: rank 0 may be elsewhere
        for rank, (node, status) in enumerate(zip(job.nodes, seen)):
            entry = JobNode(
                machine=node.machine, gpus=node.gpus, state=status.state, exit_code=status.exit_code, error=status.error
            )
            if entry != node:
                job.nodes[rank], changed = entry, True
            if status.progress is not None and not rank_0_here:  # rank 0 writes progress on its node: take it from there
                changed |= status.progress != job.progress
                job.progress = status.progress
                job.loss_points = [(step, loss) for step, loss in status.loss_points if loss is not None]
        failed = sorted(
            (
                (s.ended_at or now, node.machine, s)
                for node, s in zip(job.nodes, seen)
                if s.state in (JobState.FAILED, JobState.LOST, NODE_OFFLINE)
            ),
            key=lambda f: (f[0], f[1]),
        )
        if failed and job.failure is None:
            job.failure = "; ".join(
                f"node {machine} {s.state}"
                + (f" (exit code {s.exit_code})" if s.exit_code is not None else "")
                + (f": {s.error}" if s.error else "")
                + (" | " + " | ".join(line.rstrip() for line in s.last_lines) if s.last_lines else "")
                for _, machine, s in failed
            )
            log.warning("job %s failed: %s", job.id, job.failure)
            await self._fail_all(job, job.failure)
        elif changed:
            self.jobs.save(job)

    async def _status_of(self, job: Job, node: JobNode, now: float) -> NodeStatus:
        """A node's status as its agent answers it; a node that does not answer keeps its last state until it has been
        silent for the lab's offline_for_s, then it is offline."""
        key = (job.id, node.machine)
        as_before = NodeStatus.seen(node.state, node.exit_code, node.error)
        try:
            status = await self._request(node.machine, JOBS_NODE_STATUS, NodeStatusParams(id=job.id), timeout=5.0)
        except ReplyInvalid as exc:  # a node that answers nonsense is as good as silent
            log.warning("job %s: node %s answered a status that does not fit: %s", job.id, node.machine, exc.message)
            return as_before
        except RemoteError as exc:
            if exc.code == ErrorCode.NOT_FOUND:
                return NodeStatus.seen(JobState.LOST, error=exc.message, ended_at=now)
            since = self.silent_since.setdefault(key, now)
            lost = now - since >= self.jobs.core.lab.alerts.offline_for_s and (
                node.state in JOB_ACTIVE or node.state == NODE_OFFLINE
            )
            return (
                NodeStatus.seen(NODE_OFFLINE, error=f"its agent does not answer: {exc.message}", ended_at=since)
                if lost
                else as_before
            )
        self.silent_since.pop(key, None)
        return status
