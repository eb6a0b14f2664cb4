"""A stop that ends: each part's stop gets a deadline, and one that holds past it is named in the log, with where it
waits, and left behind so the rest can stop (an agent's stop, a lab's teardown).

A part that stops child processes (the model pool) says how long that may take with ``stop_grace_s``; the others get
``STOP_DEADLINE_S``.
"""

from __future__ import annotations

import asyncio
import linecache
import logging
from collections.abc import Awaitable

log = logging.getLogger(__name__)

STOP_DEADLINE_S = 5.0  # a part's stop that waits on nothing outside the agent ends well within this
DRAIN_S = 5.0  # a server's requests in flight get this long to finish at its stop (the gateway: aiohttp's default
# of 60 s was more than the agent's whole stop under systemd)
STOP_CANCEL_S = 1.0  # after the deadline: the time a cancelled stop gets to unwind


def where_it_waits(task: asyncio.Task[object]) -> str:
    """The chain of awaits the task is in, outermost first, as a traceback shows it: the last line is the one it waits
    on. (Task.print_stack shows only the task's own frame, not the coroutines it awaits.)"""
    lines: list[str] = []
    awaited: object = task.get_coro()
    while awaited is not None and len(lines) < 16:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:
            lines.append(f"  waiting on {awaited!r}")
            break
        code = frame.f_code
        lines.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}')
        source = linecache.getline(code.co_filename, frame.f_lineno).strip()
        if source:
            lines.append(f"    {source}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return "\n".join(lines)


async def _awaited(stopping: Awaitable[object]) -> object:
    return await stopping  # a task of any awaitable (a coroutine, a gather's future): the stack then runs through here


async def stop_within(name: str, stopping: Awaitable[object], deadline_s: float = STOP_DEADLINE_S) -> bool:
    """Await ``stopping`` for at most ``deadline_s``; True when it ended (an error in it is logged, not raised), False
    when it held past the deadline: then it is logged with where it waits, and cancelled."""
    coro = stopping if asyncio.iscoroutine(stopping) else _awaited(stopping)
    task = asyncio.create_task(coro, name=f"stop {name}")
    done, _ = await asyncio.wait({task}, timeout=deadline_s)
    if done:
        if not task.cancelled() and task.exception() is not None:
            log.error("stopping %s failed", name, exc_info=task.exception())
        return True
    log.error(
        "stopping %s held past its %g s deadline; going on without it. It waits at:\n%s", name, deadline_s, where_it_waits(task)
    )
    task.cancel()
    await asyncio.wait({task}, timeout=STOP_CANCEL_S)
    return False
