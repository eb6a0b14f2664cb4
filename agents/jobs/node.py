"""The node side of a multi-node job: what makes this machine's torchrun one node of it, and the jobs.node_* methods
its coordinator (the agent of the recipe's first node, agents/jobs/multinode.py) calls here."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agents.jobs.job import Job
from agents.jobs.logs import tail
from agents.runtime.rpc import Peer
from agents.wire.catalogue.jobs import (
    JOBS_NODE_START,
    JOBS_NODE_STATUS,
    JOBS_NODE_STOP,
    NodeStartParams,
    NodeStatusParams,
    NodeStopParams,
)
from agents.wire.lab.model import Trainer
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.jobs import NODE_LAST_LINES, NODE_LOSS_POINTS, NodeStatus
from agents.wire.states import JobState

if TYPE_CHECKING:
    from agents.jobs.component import JobsComponent

log = logging.getLogger("cetlab.jobs")

# Where a coordinator puts a rendezvous when its recipe names no rdzv_port (c10d's default port and the 99 after it): the
# other nodes accept no other port, so a node key cannot point a node's torchrun at any port of the first node's host
RDZV_PORTS = range(29400, 29500)


@dataclass(frozen=True)
class NodeLaunch:
    """What makes one node's torchrun part of the job: its rank and the rendezvous on the first node."""

    recipe: Trainer  # the recipe with this node's machine and GPUs
    job_id: str
    rank: int
    nnodes: int
    endpoint: str  # host:port of the first node's c10d store
    coordinator: str
    nccl_socket_ifname: str | None

    def torchrun_args(self) -> list[str]:
        # c10d ignores --node-rank (it ranks nodes itself); is_host says which torchrun hosts the store
        return [
            "--nnodes",
            str(self.nnodes),
            "--node-rank",
            str(self.rank),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            self.endpoint,
            "--rdzv-id",
            self.job_id,
            "--rdzv-conf",
            f"is_host={int(self.rank == 0)}",
            "--max-restarts",
            "0",
        ]

    def env(self) -> dict[str, str]:
        return (
            {"NCCL_SOCKET_IFNAME": self.nccl_socket_ifname, "GLOO_SOCKET_IFNAME": self.nccl_socket_ifname}
            if self.nccl_socket_ifname
            else {}
        )


def launch_for(recipe: Trainer, machine: str, rank: int, job_id: str, rdzv_host: str, port: int) -> NodeLaunch:
    """The launch of ``machine``'s node; everything but the job id and the port comes from this agent's own lab.yaml."""
    if rank >= len(recipe.nodes) or recipe.nodes[rank].machine != machine:
        raise RemoteError(ErrorCode.INVALID_PARAMS, f"{machine} is not node {rank} of recipe {recipe.name}")
    node = recipe.nodes[rank]
    return NodeLaunch(
        recipe.model_copy(update={"machine": machine, "gpus": list(node.gpus)}),
        job_id,
        rank,
        len(recipe.nodes),
        f"{rdzv_host}:{port}",
        recipe.nodes[0].machine,
        node.nccl_socket_ifname,
    )


def check_node_start(recipe: Trainer, params: NodeStartParams, active: list[Job]) -> None:
    """A node start is one of a job its coordinator started: an id of the coordinator's form (``<first node>-<n>``, so never
    another machine's run folder), the port the coordinator announces (the recipe's rdzv_port, else one of RDZV_PORTS), and
    one job of the recipe at a time (``active``: this agent's active node jobs)."""
    coordinator = recipe.nodes[0].machine
    if not re.fullmatch(rf"{re.escape(coordinator)}-[1-9][0-9]{{0,8}}", params.id):
        raise RemoteError(
            ErrorCode.INVALID_PARAMS,
            f"job id {params.id!r} is not one of {coordinator}'s ({coordinator}-<n>), the coordinator of recipe {recipe.name}",
        )
    if recipe.rdzv_port is not None and params.rdzv_port != recipe.rdzv_port:
        raise RemoteError(
            ErrorCode.INVALID_PARAMS, f"rdzv_port {params.rdzv_port} is not recipe {recipe.name}'s ({recipe.rdzv_port})"
        )
    if recipe.rdzv_port is None and params.rdzv_port not in RDZV_PORTS:
        raise RemoteError(
            ErrorCode.INVALID_PARAMS,
            f"rdzv_port {params.rdzv_port} is not one a coordinator picks "
            f"({RDZV_PORTS.start}-{RDZV_PORTS.stop - 1}; recipe {recipe.name} sets no rdzv_port)",
        )
    running = [job.id for job in active if job.recipe == recipe.name]
    if running:
        raise RemoteError(
            ErrorCode.CONFLICT,
            f"node of job {running[0]} of recipe {recipe.name} is still running here: one job of a multi-node recipe at a time",
            {"job": running[0]},
        )


def node_status(job: Job) -> NodeStatus:
    """A node as its coordinator needs it: state, outcome, last lines, and progress (c10d may rank any node 0)."""
    lines = tail(Path(job.log_path), NODE_LAST_LINES).lines if job.active else job.last_lines
    status = NodeStatus.seen(job.state, job.exit_code, job.error, job.ended_at, lines)
    status.progress, status.loss_points = job.progress, list(job.loss_points[-NODE_LOSS_POINTS:])
    return status


def register(jobs: JobsComponent) -> None:
    """jobs.node_*: what the coordinator of a multi-node job may ask of this agent (the `node` role allows these only)."""
    core = jobs.core
    rpc = core.rpc

    def node_job(job_id: str) -> Job:
        job = jobs.get(job_id)
        if job.coordinator is None or job.node_rank in (None, 0):
            raise RemoteError(ErrorCode.NOT_FOUND, f"job {job_id} is not a node of a multi-node job on {core.machine.name}")
        return job

    @rpc.implements(JOBS_NODE_START)
    async def node_start(peer: Peer, params: NodeStartParams) -> NodeStatus:
        recipe = next((r for r in core.lab.trainers if r.name == params.recipe and r.nodes), None)
        if recipe is None:
            raise RemoteError(
                ErrorCode.NOT_FOUND, f"no multi-node recipe named {params.recipe!r} in {core.machine.name}'s lab.yaml"
            )
        if params.id in jobs.jobs or core.store.query("SELECT 1 FROM jobs WHERE id=?", (params.id,)):
            raise RemoteError(ErrorCode.CONFLICT, f"{core.machine.name} already has a job {params.id}")
        first = core.lab.machine(recipe.nodes[0].machine)
        launch = launch_for(recipe, core.machine.name, params.node_rank, params.id, first.host, params.rdzv_port)
        check_node_start(recipe, params, [j for j in jobs.jobs.values() if j.active and j.node_rank])
        job = jobs.start_job(recipe.name, params.params, launch)
        log.info("job %s: node %d started for %s", job.id, params.node_rank, peer.who)
        return node_status(job)

    @rpc.implements(JOBS_NODE_STOP)
    async def node_stop(peer: Peer, params: NodeStopParams) -> NodeStatus:
        job = node_job(params.id)
        if params.reason:
            job.failure = params.reason
            if not job.active and job.state != JobState.FAILED:
                job.state, job.error = JobState.FAILED, params.reason
                jobs.save(job)
        if job.active:
            await jobs.stop_job(job, params.grace_s, params.kill)
        return node_status(job)

    @rpc.implements(JOBS_NODE_STATUS)
    async def node_status_method(peer: Peer, params: NodeStatusParams) -> NodeStatus:
        return node_status(node_job(params.id))
