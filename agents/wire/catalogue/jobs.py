"""The method catalogue: every RPC method with its params model, its result model, its role and its doc: jobs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from agents.wire.catalogue.method import OP, Method, NoParams, Params, Root
from agents.wire.lab.queue import MAX_GPUS_PER_JOB
from agents.wire.protocol import (
    MAX_GPUS,
    Finite,
)
from agents.wire.schema import JobId, Name, ParamName
from agents.wire.sections.base import Section
from agents.wire.sections.jobs import JobDetail, JobInfo, NodeStatus
from agents.wire.states import JobState


class StartParams(Params):
    recipe: Name  # a trainer's name, as lab.yaml's trainers have it
    params: dict[ParamName, Any] = Field(default_factory=dict, max_length=64)
    # a recipe by need (lab.yaml need:): the GPUs of this machine the lab queue chose for it
    gpus: list[Annotated[int, Field(ge=0, lt=MAX_GPUS)]] | None = Field(default=None, max_length=MAX_GPUS_PER_JOB)
    queued_as: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}:[0-9]{1,12}$", max_length=80)] | None = None
    user: Annotated[str, Field(max_length=200)] | None = None  # who submitted it to the queue


class JobParams(Params):
    id: JobId


class StopParams(JobParams):
    grace_s: float | None = Field(default=None, ge=0, le=86400)


class LogsParams(JobParams):
    tail_lines: int = Field(default=100, ge=0, le=10000)
    offset: int | None = Field(default=None, ge=0)  # continue from here instead of the tail
    follow: bool = False  # push new lines as `log` events to this connection


class JobListParams(Params):
    limit: int = Field(default=100, ge=1, le=10000)


class NodeStartParams(Params):
    id: JobId
    recipe: Name  # a trainer's name, as lab.yaml's trainers have it
    params: dict[ParamName, Any] = Field(default_factory=dict, max_length=64)
    node_rank: int = Field(ge=1, le=1024)  # rank 0 is the coordinator's own node
    rdzv_port: int = Field(ge=1024, le=65535)


class NodeStopParams(Params):
    id: JobId
    kill: bool = False
    grace_s: float | None = Field(default=None, ge=0, le=86400)
    reason: str | None = Field(default=None, max_length=4000)  # the coordinator failed the job: why


class NodeStatusParams(Params):
    id: JobId


class RecipeParam(Section):
    """One launch parameter of a recipe, as the launch form shows it."""

    name: str
    type: Literal["int", "float", "str", "bool", "choice"] = "str"
    default: int | float | bool | str | None = None
    choices: list[str] = Field(default_factory=list)
    min: Finite = None
    max: Finite = None
    help: str = ""
    flag: str | None = None  # the command-line flag it becomes


class RecipeInfo(Section):
    name: str
    machine: str
    gpus: list[int] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list)  # a multi-node recipe's machines, in rank order (the first is machine)
    launcher: Literal["local", "torchrun"] = "local"
    nproc_per_node: int | None = None
    command: list[str] = Field(default_factory=list)
    output_dir: str
    params: list[RecipeParam] = Field(default_factory=list)


class RecipeList(Root):
    model_config = ConfigDict(defer_build=True)

    root: list[RecipeInfo]


class JobList(Root):
    model_config = ConfigDict(defer_build=True)

    root: list[JobInfo]


class JobLogs(Section):
    id: str
    path: str
    lines: list[str] = Field(default_factory=list)
    offset: int  # where the next read continues
    state: JobState
    cut: bool = False  # the tail has fewer lines than asked although older ones exist (it reads at most 8 MiB)


JOBS_RECIPES = Method("jobs.recipes", NoParams, RecipeList, doc="The recipes of this machine with their launch params.")


JOBS_LIST = Method("jobs.list", JobListParams, JobList, doc="Jobs, newest first: the active ones and recent history.")


JOBS_GET = Method("jobs.get", JobParams, JobDetail, doc="One job, with its command line and last log lines.")


JOBS_START = Method("jobs.start", StartParams, JobDetail, OP, "Launch a recipe with validated params.")


JOBS_STOP = Method("jobs.stop", StopParams, JobInfo, OP, "SIGTERM to the job's process group; SIGKILL after grace_s.")


JOBS_KILL = Method("jobs.kill", JobParams, JobInfo, OP, "SIGKILL to the job's process group now.")


JOBS_LOGS = Method("jobs.logs", LogsParams, JobLogs, doc="Log lines: the tail, or from an offset; follow pushes `log` events.")


JOBS_NODE_START = Method(
    "jobs.node_start",
    NodeStartParams,
    NodeStatus,
    OP,
    "Start this machine's node of a multi-node recipe named in this agent's own lab.yaml.",
)


JOBS_NODE_STOP = Method("jobs.node_stop", NodeStopParams, NodeStatus, OP, "Stop or kill this machine's node of a multi-node job.")


JOBS_NODE_STATUS = Method("jobs.node_status", NodeStatusParams, NodeStatus, OP, "This machine's node of a multi-node job.")
