"""The lab queue's methods: submit, list, cancel, hold, release (agents/wire/catalogue/queue.py)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from agents.runtime.rpc import Peer
from agents.wire.catalogue.queue import (
    QUEUE_CANCEL,
    QUEUE_HOLD,
    QUEUE_LIST,
    QUEUE_RELEASE,
    QUEUE_SUBMIT,
    EntryParams,
    QueueList,
    QueueListParams,
    SubmitParams,
)
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.queue import ENTRY_DONE, ENTRY_WAITING, EntryState, QueueEntry

if TYPE_CHECKING:
    from agents.scheduler.component import SchedulerComponent

log = logging.getLogger("cetlab.queue")


def register(queue: SchedulerComponent) -> None:
    """The queue.* methods, on the keeper's agent (agents/wire/catalogue/queue.py)."""
    rpc = queue.core.rpc

    @rpc.implements(QUEUE_SUBMIT)
    async def submit(peer: Peer, params: SubmitParams) -> QueueEntry:
        return await queue.submit(peer, params)

    @rpc.implements(QUEUE_LIST)
    async def listing(peer: Peer, params: QueueListParams) -> QueueList:
        section = queue.section()
        entries = section.entries if section is not None else []
        return QueueList([e for e in entries if params.ended or e.state not in ENTRY_DONE][: params.limit])

    @rpc.implements(QUEUE_CANCEL)
    async def cancel(peer: Peer, params: EntryParams) -> QueueEntry:
        entry = queue.get(params.id)
        if entry.state not in ENTRY_WAITING:
            raise RemoteError(
                ErrorCode.CONFLICT,
                f"queue entry {entry.id} is {entry.state}"
                + (f": its job is {entry.job_id} (`cetlab stop {entry.job_id}`)" if entry.job_id else ""),
            )
        log.info("%s cancelled queue entry %d (%s)", peer.who, entry.id, entry.recipe)
        queue._wake.set()
        return queue._update(
            entry, state=EntryState.CANCELLED, ended_at=time.time(), position=None, reason=f"cancelled by {peer.who}"
        )

    @rpc.implements(QUEUE_HOLD)
    async def hold(peer: Peer, params: EntryParams) -> QueueEntry:
        entry = queue.get(params.id)
        if entry.state is not EntryState.QUEUED:
            raise RemoteError(ErrorCode.CONFLICT, f"queue entry {entry.id} is {entry.state}: only a queued one can be held")
        queue._wake.set()
        return queue._update(
            entry, state=EntryState.HELD, position=None, reason=f"held by {peer.who}: `cetlab release {entry.id}`"
        )

    @rpc.implements(QUEUE_RELEASE)
    async def release(peer: Peer, params: EntryParams) -> QueueEntry:
        entry = queue.get(params.id)
        if entry.state is not EntryState.HELD:
            raise RemoteError(ErrorCode.CONFLICT, f"queue entry {entry.id} is {entry.state}, not held")
        queue._wake.set()
        return queue._update(entry, state=EntryState.QUEUED, reason=None)
