"""A loop that waits for an event ends when it is cancelled, even when the event was set just before (a peer link told
to retry now by a push, then stopped by the same push: on Python 3.11 asyncio.wait_for swallowed that cancellation
and the link's stop() hung, so a push that removed a machine timed out on the gateway's agent)."""

from __future__ import annotations

import asyncio

from agents.runtime.waits import wait_event


async def test_a_cancel_right_after_the_event_is_set_ends_the_loop():
    event = asyncio.Event()
    rounds = 0

    async def loop() -> None:
        nonlocal rounds
        while True:
            rounds += 1
            event.clear()
            await wait_event(event, 3600)

    task = asyncio.create_task(loop())
    while rounds == 0:
        await asyncio.sleep(0)  # the loop waits for the event now
    event.set()  # retry now ...
    task.cancel()  # ... and stop, in the same turn
    done, _ = await asyncio.wait({task}, timeout=30)
    assert done and task.cancelled(), f"the loop went on after its cancellation ({rounds} rounds)"


async def test_it_says_set_or_timed_out():
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_soon(event.set)
    assert await wait_event(event, 3600) is True
    assert await wait_event(event, 0) is True  # already set
