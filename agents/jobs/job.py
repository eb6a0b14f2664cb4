"""A trainer job: its record (persisted as JSON), the copy other components see, and its typed views."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import psutil
from pydantic import ValidationError

from agents.documents import Progress
from agents.jobs.port import JobView
from agents.protocol import finite_or_none
from agents.sections import CheckpointReport, JobDetail, JobInfo
from agents.states import JOB_ACTIVE, JobState

# what a job keeps of its trainer's progress file (persisted with the job)
PROGRESS_KEPT = {"state", "step", "max_steps", "epoch", "loss", "learning_rate", "samples_per_s", "tokens_per_s",
                 "eta_s", "checkpoints", "updated_at", "error", "stop_reason", "precision", "notes"}


@dataclass
class Job:
    """One run of a recipe; everything but the live handles is persisted as JSON."""

    id: str
    recipe: str
    machine: str
    gpus: list[int]
    params: dict[str, Any]
    argv: list[str]
    cwd: str
    output_dir: str
    log_path: str
    job_dir: str
    started_at: float
    state: JobState = JobState.STARTING
    exit_code: int | None = None
    ended_at: float | None = None
    runner_pid: int | None = None
    runner_started: float | None = None
    pid: int | None = None
    pid_started: float | None = None
    stop_requested: str | None = None  # "stop" | "kill"
    kill_at: float | None = None  # when a graceful stop turns into SIGKILL
    progress: dict[str, Any] = field(default_factory=dict)
    loss_points: list[list] = field(default_factory=list)  # [step, loss], sorted, the last LOSS_POINTS
    last_lines: list[str] = field(default_factory=list)
    error: str | None = None
    adopted: bool = False  # re-adopted after an agent restart
    starved: bool = False
    diverged_at_step: int | None = None  # the first step whose loss the trainer reported as NaN or infinite
    progress_problem: str | None = None  # its progress file (or the newest checkpoint's trainer_state.json) is bad: what and where
    nodes: list[dict[str, Any]] = field(default_factory=list)  # multi-node, on the coordinator: JobNode per node, rank order
    node_rank: int | None = None  # multi-node: this machine's rank
    coordinator: str | None = None  # multi-node: the first node's machine
    failure: str | None = None  # multi-node: why the coordinator failed the job (another node failed); kept as its error
    # live handles, not persisted
    popen: subprocess.Popen | None = field(default=None, repr=False)
    proc: psutil.Process | None = field(default=None, repr=False)
    child_procs: dict[int, psutil.Process] = field(default_factory=dict, repr=False)  # the trainer's processes, by pid
    starved_since: float | None = field(default=None, repr=False)

    PERSISTED = (
        "id", "recipe", "machine", "gpus", "params", "argv", "cwd", "output_dir", "log_path", "job_dir",
        "started_at", "state", "exit_code", "ended_at", "runner_pid", "runner_started", "pid", "pid_started",
        "stop_requested", "kill_at", "progress", "loss_points", "last_lines", "error", "adopted",
        "diverged_at_step", "progress_problem", "nodes", "node_rank", "coordinator", "failure",
    )

    def record(self) -> str:
        return json.dumps({k: getattr(self, k) for k in self.PERSISTED})

    @classmethod
    def from_record(cls, text: str) -> Job:
        data = json.loads(text)
        job = cls(**{k: v for k, v in data.items() if k in cls.PERSISTED})
        job.state = JobState(job.state)
        try:  # kept by an older agent, which did not check its trainer's file: check it now (none stays none)
            job.progress = Progress.model_validate(job.progress).model_dump(mode="json", include=PROGRESS_KEPT) if job.progress else {}
        except ValidationError:
            job.progress, job.progress_problem = {}, "the recorded progress did not match the progress file's schema"
        job.loss_points = [[s, v] for s, v in job.loss_points if finite_or_none(v) is not None]
        return job

    @property
    def active(self) -> bool:
        return self.state in JOB_ACTIVE

    def view(self) -> JobView:
        reports = tuple(CheckpointReport.model_validate(c) for c in self.progress.get("checkpoints") or ())
        return JobView(self.id, self.recipe, self.state, self.started_at, self.ended_at, self.output_dir, tuple(self.argv),
                       dict(self.params), reports, tuple((s, v) for s, v in self.loss_points))

    def info(self, simulated: bool, now: float | None = None) -> JobInfo:
        """The job as the jobs section and `jobs.list` send it."""
        return JobInfo.model_validate(self._fields(simulated, now))

    def detail(self, simulated: bool) -> JobDetail:
        """The job with its command line (`jobs.get`, `jobs.start`)."""
        return JobDetail.model_validate({**self._fields(simulated, None), "argv": self.argv, "cwd": self.cwd, "runner_pid": self.runner_pid})

    def to_json(self, simulated: bool, now: float | None = None) -> dict[str, Any]:
        return self.info(simulated, now).to_wire()

    def _fields(self, simulated: bool, now: float | None) -> dict[str, Any]:
        p = self.progress
        end = self.ended_at or now or time.time()
        return {
            "id": self.id,
            "recipe": self.recipe,
            "machine": self.machine,
            "gpus": self.gpus,
            "state": self.state,
            "exit_code": self.exit_code,
            "step": p.get("step"),
            "max_steps": p.get("max_steps"),
            "epoch": p.get("epoch"),
            "loss": p.get("loss"),
            "loss_history": [loss for _, loss in self.loss_points if finite_or_none(loss) is not None],
            "learning_rate": p.get("learning_rate"),
            "samples_per_s": p.get("samples_per_s"),
            "tokens_per_s": p.get("tokens_per_s"),
            "eta_s": p.get("eta_s"),
            "checkpoints": p.get("checkpoints") or [],
            "trainer_state": p.get("state"),
            "stop_reason": p.get("stop_reason"),
            "precision": p.get("precision"),
            "notes": p.get("notes") or [],
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "elapsed_s": round(max(0.0, end - self.started_at), 1),
            "pid": self.pid,
            "params": self.params,
            "output_dir": self.output_dir,
            "log_path": self.log_path,
            "stop_requested": self.stop_requested,
            "adopted": self.adopted,
            "starved": self.starved,
            "error": self.error,
            "last_lines": self.last_lines,
            "diverged_at_step": self.diverged_at_step,
            "progress_problem": self.progress_problem,
            "simulated": simulated,  # GPU figures (util, VRAM, starved) come from the simulator
            "nodes": self.nodes,
            "node_rank": self.node_rank,
            "coordinator": self.coordinator,
        }
