"""Waiting for an asyncio.Event with a timeout, in a loop that another task may cancel at any moment.

On Python 3.11 ``asyncio.wait_for`` swallows a cancellation that arrives once the awaited event is set but before the
waiting task ran again: it returns the result instead (python/cpython#86296, fixed in 3.12). A loop that waits for
an event someone sets just before cancelling it (a peer link told to retry now by a push, then stopped by the same
push's reconfigure) then goes on forever and the ``stop()`` that awaits it never returns. ``asyncio.wait`` always
raises the cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """True once ``event`` is set, False when ``timeout_s`` passed first; a cancellation of the caller always raises."""
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        done, _pending = await asyncio.wait({waiter}, timeout=timeout_s)
    finally:
        waiter.cancel()
    return bool(done)


async def within(awaitable: Awaitable[T], timeout_s: float | None) -> T:
    """``await awaitable`` for at most ``timeout_s`` seconds (TimeoutError past it); the caller's cancellation always
    raises, unlike ``asyncio.wait_for`` on 3.11, which returns (or raises) the awaited result when the cancellation
    arrives just as it completes (python/cpython#86296): a link's connect that failed as its stop() cancelled it went
    on to retry forever, and the agent's stop() never returned. ``asyncio.wait_for`` is banned by ruff (TID251)."""
    async with asyncio.timeout(timeout_s):
        return await awaitable
