"""How a simulated engine process lives and dies (SIMULATED): it follows its agent, and fails on purpose when asked.

Shared by the simulated vLLM (agents.orchestra.sim_server) and the simulated llama-server (agents.orchestra.sim_llamacpp).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ORPHAN_GRACE_S = 30.0  # how long a server whose agent died waits to be re-adopted


def exit_with_parent(pid: int) -> None:
    """A simulated server never outlives its agent (a real engine may: it keeps serving)."""
    while True:
        time.sleep(1.0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(0)


def follow_agent(pid_file: Path) -> None:
    """Live while some agent owns the state dir: a restarted agent re-adopts us; none for ORPHAN_GRACE_S: exit."""
    orphan_since = None
    while True:
        time.sleep(1.0)
        try:
            os.kill(int(pid_file.read_text().strip()), 0)
            orphan_since = None
        except (OSError, ValueError):
            orphan_since = orphan_since or time.monotonic()
            if time.monotonic() - orphan_since > ORPHAN_GRACE_S:
                os._exit(0)


def fail_later(seconds: float) -> None:
    time.sleep(seconds)
    print(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (SIMULATED failure: fail_after_s)",
        file=sys.stderr,
        flush=True,
    )
    os._exit(1)
