"""Waiting on conditions, never on the clock: for async tests, sync tests (a process to watch) and a console's frame."""

from __future__ import annotations

import asyncio
import inspect
import time


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.05, what: str | None = None):
    """wait_for for synchronous tests (a subprocess to watch, no event loop): poll a condition, fail on timeout.

    The predicate may raise (an AssertionError that the watched process died, say) to end the wait early.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout} s: {what or getattr(predicate, '__name__', predicate)}")
        time.sleep(interval)


async def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05):
    """Poll until predicate() is truthy (a coroutine function is awaited); fail with a clear message on timeout.

    Returns the predicate's truthy value. Every wait in the tests goes through here: no sleeps, no
    hand-made deadline loops, no pauses that hope the console has caught up.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout} s: {getattr(predicate, '__name__', predicate)}")
        await asyncio.sleep(interval)


def drawn(app, kind: type | None = None) -> bool:
    """The console shows a view (of this kind) that has drawn the newest LabState."""
    from console.tui.screens.base import LabScreen

    screen = app.screen
    return (
        isinstance(screen, LabScreen)
        and (kind is None or isinstance(screen, kind))
        and screen.ready
        and screen.drawn_version == app.state.version
        and getattr(screen, "aligned", True)  # the fleet: its cards' GPU columns lined up
    )


async def until_drawn(pilot, kind: type | None = None, timeout: float = 20.0) -> None:
    """Wait until the view (of this kind) has drawn the newest data, then let Textual finish the frame."""
    await wait_for(lambda: drawn(pilot.app, kind), timeout)
    await pilot.pause()  # no delay: only the messages already queued (the redraw) run
