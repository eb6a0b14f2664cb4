"""Files and processes that outlive the agent: atomic JSON records, logs rotated under a live writer, a process's descendants.

Shared by the components that launch long-lived children (jobs' trainers, the orchestra's engines), so neither
imports the other's internals.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import psutil

LOG_MAX_BYTES = 10 * 1024 * 1024  # a child's log is rotated past this size
LOG_KEEP = 5  # rotated logs kept (.1 ... .5)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically: a reader sees the whole document or none."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def descendants(pid: int) -> list[psutil.Process]:
    """Every process below ``pid``, whatever session or group it moved to (torchrun's workers do)."""
    try:
        found: list[psutil.Process] = psutil.Process(pid).children(recursive=True)
        return found
    except psutil.Error:
        return []


def copy_truncate(path: Path, max_bytes: int, keep: int) -> bool:
    """Rotate a log that another process appends to (O_APPEND): copy it to .1 (older ones shift), then empty it.

    For logs written by a process that outlives us (a model server); returns whether it rotated.
    """
    try:
        if path.stat().st_size < max_bytes:
            return False
    except OSError:
        return False
    for index in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{index}")
        if older.exists():
            os.replace(older, path.with_name(f"{path.name}.{index + 1}"))
    shutil.copyfile(path, path.with_name(f"{path.name}.1"))
    os.truncate(path, 0)  # the writer's next append lands at the new end, offset 0
    return True
