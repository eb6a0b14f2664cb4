"""The method catalogue: every RPC method with its params model, its result model, its role and its doc: queue."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from agents.wire.catalogue.method import OP, Method, Params, Root
from agents.wire.schema import Name, ParamName
from agents.wire.sections.queue import QueueEntry

MAX_LIST = 1000


class SubmitParams(Params):
    recipe: Name
    params: dict[ParamName, Any] = Field(default_factory=dict, max_length=64)
    priority: int | None = Field(default=None, ge=-1000, le=1000)  # default: the recipe's
    now: bool = False  # start now or be refused (the old `cetlab train`): never queued


class EntryParams(Params):
    id: int = Field(ge=1)


class QueueListParams(Params):
    limit: int = Field(default=200, ge=1, le=MAX_LIST)
    ended: bool = True  # include the ended and cancelled ones (newest first, after the others)


class QueueList(Root):
    model_config = ConfigDict(defer_build=True)

    root: list[QueueEntry]


QUEUE_SUBMIT = Method(
    "queue.submit",
    SubmitParams,
    QueueEntry,
    OP,
    "Queue a recipe's job: started at once where what it needs is free, else it waits, saying why.",
)
QUEUE_LIST = Method("queue.list", QueueListParams, QueueList, doc="The lab queue: waiting first, in the order they would start.")
QUEUE_CANCEL = Method("queue.cancel", EntryParams, QueueEntry, OP, "Take a waiting job out of the queue.")
QUEUE_HOLD = Method("queue.hold", EntryParams, QueueEntry, OP, "Keep a waiting job from starting until it is released.")
QUEUE_RELEASE = Method("queue.release", EntryParams, QueueEntry, OP, "Let a held job start again when it can.")
