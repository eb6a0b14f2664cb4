"""The job runner: starts a trainer in its own process group, logs its output with rotation, records its exit code.

    python -m agents.jobs.runner --job-dir D --log F [--log-max-bytes N] [--log-keep K] -- argv...

The agent launches every job through this wrapper, in a new session, so the job
outlives the agent: the runner (not the agent) holds the trainer's output pipe
and is its parent, so it can write the exit code to ``D/exit.json`` however long
the agent is gone. ``D/child.json`` names the trainer's pid and start time; the
agent signals the trainer's process group (pgid = that pid) to stop or kill it,
which leaves the runner alive to record the outcome.
"""

from __future__ import annotations

import argparse
import codecs
import io
import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from agents.runtime.procfiles import LOG_KEEP, LOG_MAX_BYTES, write_json

CHUNK_BYTES = 64 * 1024
EXIT_NOT_STARTED = 127


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def open_log(path: Path, max_bytes: int, keep: int) -> logging.Logger:
    from logging.handlers import RotatingFileHandler  # in the job's runner process, not the agent's

    handler = RotatingFileHandler(path, maxBytes=max_bytes, backupCount=keep, encoding="utf-8")
    handler.terminator = ""  # chunks carry their own newlines
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(f"cetlab.job.{path.name}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return logger


def run(job_dir: Path, log_path: Path, argv: list[str], max_bytes: int, keep: int) -> int:
    log = open_log(log_path, max_bytes, keep)
    # The agent signals the trainer's group, not ours; a stray signal must not orphan the trainer.
    # A handler (not SIG_IGN) so the trainer does not inherit "ignored" across exec.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    try:
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, process_group=0
        )
    except OSError as exc:
        log.info(f"cetlab: cannot start {argv[0]}: {exc}\n")
        write_json(job_dir / "exit.json", {"exit_code": EXIT_NOT_STARTED, "ended_at": time.time(), "error": str(exc)})
        return EXIT_NOT_STARTED
    try:
        started = psutil.Process(child.pid).create_time()
    except psutil.Error:
        started = None
    write_json(job_dir / "child.json", {"pid": child.pid, "create_time": started})
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    stdout = child.stdout
    assert isinstance(stdout, io.BufferedReader)  # a pipe with Popen's default buffering: read1 returns what is there
    while chunk := stdout.read1(CHUNK_BYTES):
        # one record per line, so files rotate between lines and stay near max_bytes
        for line in decoder.decode(chunk).splitlines(keepends=True):
            log.info(line)
    tail = decoder.decode(b"", final=True)
    if tail:
        log.info(tail)
    code = child.wait()
    write_json(job_dir / "exit.json", {"exit_code": code, "ended_at": time.time()})
    return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.jobs.runner", description="Run one cetlab job.")
    parser.add_argument("--job-dir", required=True, type=Path)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--log-max-bytes", type=int, default=LOG_MAX_BYTES)
    parser.add_argument("--log-keep", type=int, default=LOG_KEEP)
    parser.add_argument("argv", nargs="+")
    args = parser.parse_args(argv)
    return run(args.job_dir, args.log, args.argv, args.log_max_bytes, args.log_keep)


if __name__ == "__main__":
    sys.exit(main())
