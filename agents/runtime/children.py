"""Short-lived helper processes the agent runs (a notification command, a converter, a merge): a small environment,
a timeout, and output read in bounded pieces, in one place so that no caller can forget one of them."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agents.runtime.waits import within

OUTPUT_KEEP_BYTES = 64 * 1024  # what is kept of a helper's output: its end, where the error is
# what a helper inherits of the agent's environment: enough to find programs and speak the locale, never the agent's
# secrets (a provider's API key on the gateway's machine, a notification route's token)
INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME")
# what keeps a Python helper off the network (transformers, huggingface_hub): it reads the files it is given
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def minimal_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The agent's PATH, HOME and locale, and ``extra``; nothing else of the agent's environment."""
    env = {name: os.environ[name] for name in INHERITED if name in os.environ}
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class Finished:
    """How a helper ended: its exit code (None when it was killed at its timeout) and the end of its output."""

    returncode: int | None
    output: bytes  # at most OUTPUT_KEEP_BYTES: the last ones
    cut: bool  # more was written than was kept
    timed_out: bool


async def run_helper(
    argv: Sequence[str],
    *,
    timeout_s: float,
    env: Mapping[str, str],
    stdin_data: bytes | None = None,
    cwd: str | None = None,
    keep_bytes: int = OUTPUT_KEEP_BYTES,
) -> Finished:
    """Run ``argv`` (no shell) in its own session; kill its whole group at ``timeout_s``. Raises OSError when it
    cannot be started."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin_data is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=cwd,
        env=dict(env),
        start_new_session=True,
    )
    kept = bytearray()
    cut = False

    async def feed() -> None:
        if proc.stdin is None or stdin_data is None:
            return
        try:
            proc.stdin.write(stdin_data)
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the helper did not read it all: its exit code says what it made of that

    async def drain() -> None:
        nonlocal cut
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            kept.extend(chunk)
            if len(kept) > keep_bytes:
                del kept[: len(kept) - keep_bytes]
                cut = True
        await proc.wait()

    try:
        await within(asyncio.gather(feed(), drain()), timeout_s)
    except TimeoutError:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await proc.wait()
        return Finished(None, bytes(kept), cut, True)
    except asyncio.CancelledError:  # the caller stops (an agent shutting down): the helper's group goes with it
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        raise
    return Finished(proc.returncode, bytes(kept), cut, False)
