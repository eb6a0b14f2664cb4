"""A trainer job: its record (persisted as JSON), the copy other components see, and its typed views."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import psutil
from pydantic import ValidationError

from agents.jobs.port import JobView
from agents.wire.protocol import finite_or_none
from agents.wire.sections.base import StopRequest
from agents.wire.sections.jobs import JobDetail, JobInfo, JobNode, JobProgress
from agents.wire.states import JOB_ACTIVE, JobState


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
    stop_requested: StopRequest | None = None
    kill_at: float | None = None  # when a graceful stop turns into SIGKILL
    progress: JobProgress | None = None  # what the job keeps of its trainer's progress file as last read; None before any
    loss_points: list[tuple[int, float]] = field(default_factory=list)  # (step, loss), sorted, the last LOSS_POINTS
    last_lines: list[str] = field(default_factory=list)
    error: str | None = None
    adopted: bool = False  # re-adopted after an agent restart
    starved: bool = False
    diverged_at_step: int | None = None  # the first step whose loss the trainer reported as NaN or infinite
    progress_problem: str | None = (
        None  # its progress file (or the newest checkpoint's trainer_state.json) is bad: what and where
    )
    nodes: list[JobNode] = field(default_factory=list)  # multi-node, on the coordinator: every node, rank order
    node_rank: int | None = None  # multi-node: this machine's rank
    coordinator: str | None = None  # multi-node: the first node's machine
    failure: str | None = None  # multi-node: why the coordinator failed the job (another node failed); kept as its error
    queued_as: str | None = None  # the lab queue's entry that started it ("pharaoh:12"), and who submitted it
    user: str | None = None
    # live handles, not persisted
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    proc: psutil.Process | None = field(default=None, repr=False)
    child_procs: dict[int, psutil.Process] = field(default_factory=dict, repr=False)  # the trainer's processes, by pid
    starved_since: float | None = field(default=None, repr=False)

    PERSISTED = (
        "id",
        "recipe",
        "machine",
        "gpus",
        "params",
        "argv",
        "cwd",
        "output_dir",
        "log_path",
        "job_dir",
        "started_at",
        "state",
        "exit_code",
        "ended_at",
        "runner_pid",
        "runner_started",
        "pid",
        "pid_started",
        "stop_requested",
        "kill_at",
        "progress",
        "loss_points",
        "last_lines",
        "error",
        "adopted",
        "diverged_at_step",
        "progress_problem",
        "nodes",
        "node_rank",
        "coordinator",
        "failure",
        "queued_as",
        "user",
    )

    def record(self) -> str:
        data: dict[str, Any] = {k: getattr(self, k) for k in self.PERSISTED}
        data["progress"] = self.progress.to_wire() if self.progress is not None else {}
        data["nodes"] = [node.to_wire() for node in self.nodes]
        return json.dumps(data)

    @classmethod
    def from_record(cls, text: str) -> Job:
        """A job from its record in state.db (or its folder); ValueError or TypeError when the record is not one."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("a job record is a JSON object")
        fields = {k: v for k, v in data.items() if k in cls.PERSISTED and k not in ("progress", "loss_points", "nodes")}
        job = cls(**fields)
        job.state = JobState(job.state)
        if job.stop_requested not in (None, "stop", "kill"):
            raise ValueError(f"stop_requested {job.stop_requested!r} is neither stop nor kill")
        try:  # kept by an older agent, which did not check its trainer's file: check it now (none stays none)
            job.progress = JobProgress.model_validate(data["progress"]) if data.get("progress") else None
        except ValidationError:
            job.progress, job.progress_problem = None, "the recorded progress did not match the progress file's schema"
        job.loss_points = [(int(s), float(v)) for s, v in data.get("loss_points") or [] if finite_or_none(v) is not None]
        try:
            job.nodes = [JobNode.model_validate(node) for node in data.get("nodes") or []]
        except ValidationError as exc:
            raise ValueError(f"its nodes do not fit: {exc.errors()[0]['msg']}") from None
        return job

    @property
    def active(self) -> bool:
        return self.state in JOB_ACTIVE

    def view(self) -> JobView:
        reports = tuple(self.progress.checkpoints) if self.progress is not None else ()
        return JobView(
            self.id,
            self.recipe,
            self.state,
            self.started_at,
            self.ended_at,
            self.output_dir,
            tuple(self.argv),
            dict(self.params),
            reports,
            tuple(self.loss_points),
            tuple(self.gpus),
            self.progress.eta_s if self.progress is not None else None,
        )

    def info(self, simulated: bool, now: float | None = None) -> JobInfo:
        """The job as the jobs section and `jobs.list` send it."""
        return JobInfo.model_validate(self._fields(simulated, now))

    def detail(self, simulated: bool) -> JobDetail:
        """The job with its command line (`jobs.get`, `jobs.start`)."""
        return JobDetail.model_validate(
            {**self._fields(simulated, None), "argv": self.argv, "cwd": self.cwd, "runner_pid": self.runner_pid}
        )

    def _fields(self, simulated: bool, now: float | None) -> dict[str, Any]:
        p = self.progress or JobProgress()
        end = self.ended_at or now or time.time()
        return {
            "id": self.id,
            "recipe": self.recipe,
            "machine": self.machine,
            "gpus": self.gpus,
            "state": self.state,
            "exit_code": self.exit_code,
            "step": p.step,
            "max_steps": p.max_steps,
            "epoch": p.epoch,
            "loss": p.loss,
            "loss_history": [loss for _, loss in self.loss_points],
            "learning_rate": p.learning_rate,
            "samples_per_s": p.samples_per_s,
            "tokens_per_s": p.tokens_per_s,
            "eta_s": p.eta_s,
            "checkpoints": p.checkpoints,
            "trainer_state": p.state,
            "stop_reason": p.stop_reason,
            "precision": p.precision,
            "notes": p.notes,
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
            "queued_as": self.queued_as,
            "user": self.user,
        }
