"""The typed sections of a tick: one model per section, produced by the agent's components, parsed by consoles: queue.

The lab queue as its keeper's agent pushes it (agents/scheduler/): every entry not yet ended, and the last ones that
did, each with why it waits in words a person reads."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from agents.wire.protocol import Finite, FiniteFloat
from agents.wire.schema import JobId, ModelName, Name, ParamName
from agents.wire.sections.base import Section
from agents.wire.states import JobState

QUEUE_SHOWN = 200  # entries in the tick's section (waiting first); `queue.list` pages the rest
REASON_CHARS = 600
USER_CHARS = 200


class EntryState(StrEnum):
    """A queued job: queued -> starting -> running -> ended, or held / cancelled on the way."""

    QUEUED = "queued"  # waiting for what it needs
    HELD = "held"  # kept out of the running by `cetlab hold` until `cetlab release`
    STARTING = "starting"  # its machine was asked to start it
    RUNNING = "running"  # its job runs (or is stopping)
    ENDED = "ended"  # its job ended (exited, failed or lost: `job_state` says which)
    CANCELLED = "cancelled"  # taken out of the queue before it ran


ENTRY_WAITING = frozenset({EntryState.QUEUED, EntryState.HELD})
ENTRY_PLACED = frozenset({EntryState.STARTING, EntryState.RUNNING})  # it has (or is getting) its GPUs
ENTRY_DONE = frozenset({EntryState.ENDED, EntryState.CANCELLED})


class QueueEntry(Section):
    """One job in the lab queue."""

    id: int = Field(ge=1)
    recipe: Name
    user: str = Field(max_length=USER_CHARS)  # who submitted it (the console key's comment, or the socket's user)
    priority: int = 0
    state: EntryState
    submitted_at: FiniteFloat
    need: str = Field(max_length=REASON_CHARS)  # what it waits for, in words ("1 GPU >= 24 GiB", "GPUs 0,1 of m5")
    params: dict[ParamName, str | int | float | bool] = Field(default_factory=dict, max_length=64)
    position: int | None = None  # 1 = next to start; None once placed or done
    reason: str | None = Field(default=None, max_length=REASON_CHARS)  # why it waits, or why it ended as it did
    expected_start: Finite = None  # unix time, from the running jobs' ETAs; None: not known
    machine: Name | None = None  # where it runs (or ran)
    gpus: list[int] = Field(default_factory=list, max_length=64)
    job_id: JobId | None = None
    job_state: JobState | None = None  # the job's own state once it ran (exited, failed, lost)
    started_at: Finite = None
    ended_at: Finite = None
    # models of its machine put aside for it (lab.yaml orchestra.yields), and whether they are back as they were
    yielded: list[ModelName] = Field(default_factory=list, max_length=64)
    restored: bool = False


class QueueSection(Section):
    """The lab queue on its keeper's machine: entries waiting or running, then the most recent ended ones."""

    machine: str
    entries: list[QueueEntry] = Field(default_factory=list)
    waiting: int = 0
    running: int = 0
