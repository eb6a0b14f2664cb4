"""What the tests of a lab share: the repository's root, an agent as a real process, a trainer's environment, a
checkpoint's age, the jobs a failed test left, and the llama-server build the suite runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from agents.wire.agent_argv import agent_argv, python_agent

REPO = Path(__file__).resolve().parents[2]
TESTS_DIR = str(REPO / "tests")


def pin_llama_server(environ: dict[str, str] | os._Environ[str]) -> None:
    """The suite runs llama.cpp's CPU build, the one `make llama-server` caches: a CUDA build cached beside it (found
    first by find_llama_server, as an operator wants) would move the tests' engines onto a real GPU and judge the
    simulated GPUs of the test labs against its archs. An operator's own CETLAB_LLAMA_SERVER is kept."""
    from agents.orchestra.engines.llamacpp import build as llamacpp_build

    environ.setdefault(llamacpp_build.BINARY_ENV, str(llamacpp_build.build_dir(cuda=False) / "bin" / "llama-server"))


HOUR_S = 3600


def trainer_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CETLAB_PROGRESS_FILE"}
    env.update(OMP_NUM_THREADS="2", TOKENIZERS_PARALLELISM="false")
    return env


def age(folder: Path, seconds: float) -> None:
    """Make a checkpoint look written `seconds` ago, so the settle window does not depend on the test's speed."""
    then = time.time() - seconds
    for path in [*folder.rglob("*"), folder]:
        os.utime(path, (then, then))


def run_agent(lab_path: Path, machine: str, state_dir: Path) -> subprocess.Popen:
    """Start `cetlab-agent serve` as a real process (for kill/restart tests)."""
    return subprocess.Popen(
        agent_argv(python_agent(sys.executable), lab_path, machine, state_dir, log_level="warning"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def kill_jobs_left(directory) -> None:
    """Kill the trainers (their process groups) of every job under a demo's folder: jobs outlive agents on purpose,
    so a test that failed half-way would leave them running."""
    import os
    import signal

    from agents.jobs.component import _alive
    from agents.jobs.runner import read_json

    for child in directory.glob("agents/*/jobs/*/child.json"):
        record = read_json(child) or {}
        pid = record.get("pid")
        if pid and _alive(pid, record.get("create_time")):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
