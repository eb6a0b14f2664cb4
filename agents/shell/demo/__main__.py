"""The demo lab's process: build DIR, run its agents until SIGTERM/SIGINT (or until --parent-pid is gone), then stop them.

    python -m agents.shell.demo --dir DIR [--source LAB] [--scale N] [--agents-per-process K] [--parent-pid PID]

The console (`cetlab-console --demo`, `cetlab demo`) starts this as its child and reads one line of its stdout:
READY and DIR/lab.yaml's path once every agent accepts connections, or FAILED and why as a JSON string.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from agents.runtime.demo import FAILED, READY
from agents.shell.demo.lab import DemoLab

START_TIMEOUT_S = 60.0  # every agent listening within this, else FAILED


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.shell.demo", description="Run the demo lab's agents on loopback.")
    parser.add_argument("--dir", required=True, help="where the lab file, keys, agent state, runs and checkpoints are kept")
    parser.add_argument("--source", help="the demo's source lab.yaml (default: the checkout's)")
    parser.add_argument("--scale", type=int, help="emulate N machines of 8 GPUs instead of the source's machines")
    parser.add_argument("--agents-per-process", type=int, help="machines served by one agent process")
    parser.add_argument("--parent-pid", type=int, help="stop when this process is gone (the console, even after a crash)")
    args = parser.parse_args(argv)
    demo = DemoLab(
        Path(args.dir),
        source=Path(args.source) if args.source else None,
        scale=args.scale,
        agents_per_process=args.agents_per_process or (8 if args.scale else 1),
    )
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        try:
            demo.start()
            demo.wait_listening(START_TIMEOUT_S)
        except Exception as exc:  # any reason it did not start is the console's to say, on the one line it reads
            print(FAILED + json.dumps(str(exc)), flush=True)
            return 1
        print(READY + str(demo.lab_path), flush=True)
        while not stop.wait(1.0):
            if args.parent_pid is not None and not _alive(args.parent_pid):
                break
    finally:
        demo.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
