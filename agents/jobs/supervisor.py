"""JobsComponent: launches trainer recipes, supervises them, re-adopts them after an agent restart."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
from pydantic import BaseModel, ConfigDict, Field

from agents.jobs import recipes
from agents.jobs.logs import Follower, read_from, tail
from agents.jobs.runner import LOG_KEEP, LOG_MAX_BYTES, descendants, read_json
from agents.lab import Trainer
from agents.protocol import EVENT_LOG, EVENT_NOTICE, ErrorCode, RemoteError, Role, Telemetry
from agents.rpc import Peer
from agents.train.progress import ENV_VAR as PROGRESS_ENV, read_progress

if TYPE_CHECKING:
    from agents.agent import Agent

log = logging.getLogger("cetlab.jobs")

ACTIVE = ("starting", "running", "stopping")
LOSS_POINTS = 120  # loss history kept per job, for the sparkline
LAST_LINES = 20  # log lines kept in the record of a finished job
SECTION_FINISHED = 20  # finished jobs shown beside the active ones
KEPT_FINISHED = 200  # finished jobs kept in memory (for the checkpoints view); older ones stay in SQLite only
SECTION_LOSS_POINTS = 60
SECTION_LAST_LINES = 3
NO_PROGRESS_RUNNING_S = 3.0  # a command without a progress file counts as running after this long
CHILD_WAIT_S = 5.0  # how long stop/kill wait for the runner to name its trainer
SIM_UTIL_CAP_PCT = 97.0

SCHEMA = [
    """CREATE TABLE jobs (
        n INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT UNIQUE NOT NULL,
        recipe TEXT NOT NULL,
        record TEXT NOT NULL,   -- the job as JSON (see Job)
        state TEXT NOT NULL
    )""",
    "CREATE INDEX jobs_state ON jobs(state)",
]


class StartParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    recipe: str = Field(max_length=64)
    params: dict[str, Any] = Field(default_factory=dict, max_length=64)


class JobParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(max_length=100)


class StopParams(JobParams):
    grace_s: float | None = Field(default=None, ge=0, le=86400)


class LogsParams(JobParams):
    tail_lines: int = Field(default=100, ge=0, le=10000)
    offset: int | None = Field(default=None, ge=0)  # continue from here instead of the tail
    follow: bool = False  # push new lines as `log` events to this connection


class ListParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=100, ge=1, le=10000)


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
    state: str = "starting"
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
    # live handles, not persisted
    popen: subprocess.Popen | None = field(default=None, repr=False)
    proc: psutil.Process | None = field(default=None, repr=False)
    starved_since: float | None = field(default=None, repr=False)

    PERSISTED = (
        "id", "recipe", "machine", "gpus", "params", "argv", "cwd", "output_dir", "log_path", "job_dir",
        "started_at", "state", "exit_code", "ended_at", "runner_pid", "runner_started", "pid", "pid_started",
        "stop_requested", "kill_at", "progress", "loss_points", "last_lines", "error", "adopted",
    )

    def record(self) -> str:
        return json.dumps({k: getattr(self, k) for k in self.PERSISTED})

    @classmethod
    def from_record(cls, text: str) -> Job:
        data = json.loads(text)
        return cls(**{k: v for k, v in data.items() if k in cls.PERSISTED})

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    def to_json(self, simulated: bool, now: float | None = None) -> dict[str, Any]:
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
            "loss_history": [loss for _, loss in self.loss_points],
            "learning_rate": p.get("learning_rate"),
            "samples_per_s": p.get("samples_per_s"),
            "tokens_per_s": p.get("tokens_per_s"),
            "eta_s": p.get("eta_s"),
            "checkpoints": p.get("checkpoints") or [],
            "trainer_state": p.get("state"),
            "stop_reason": p.get("stop_reason"),
            "precision": p.get("precision"),  # bf16 | fp16 | fp32, as the trainer chose it for the GPU
            "notes": p.get("notes") or [],  # e.g. "tf32 off: it needs compute capability 8.0 ..."
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
            "simulated": simulated,  # GPU figures (util, VRAM, starved) come from the simulator
        }


def _alive(pid: int | None, started: float | None) -> bool:
    """This very process (pid and start time, so a reused pid is not mistaken) exists and is not a zombie."""
    if pid is None:
        return False
    try:
        proc = psutil.Process(pid)
        if started is not None and abs(proc.create_time() - started) > 0.05:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


class JobsComponent:
    name = "jobs"

    def __init__(self) -> None:
        self.agent: Agent | None = None
        self.jobs: dict[str, Job] = {}
        self.followers: dict[tuple[int, str], tuple[Peer, Follower]] = {}

    # -- lifecycle

    async def start(self, agent: Agent) -> None:
        self.agent = agent
        self.logs_dir = agent.state_dir / "logs"
        self.jobs_dir = agent.state_dir / "jobs"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        agent.store.migrate("jobs", SCHEMA)
        self._load()
        self._register()

    async def stop(self) -> None:
        """Nothing to stop: jobs outlive the agent on purpose, and a restarted agent re-adopts them."""

    def _load(self) -> None:
        rows = self.agent.store.query(
            "SELECT record FROM jobs WHERE state IN ('starting','running','stopping') OR n > (SELECT COALESCE(MAX(n), 0) FROM jobs) - ? ORDER BY n",
            (KEPT_FINISHED,),
        )
        for row in rows:
            job = Job.from_record(row["record"])
            self.jobs[job.id] = job
            if job.active:
                job.adopted = True
                if _alive(job.runner_pid, job.runner_started):
                    log.info("re-adopted job %s (runner pid %s)", job.id, job.runner_pid)
                else:
                    self._finish(job)  # ended while the agent was away: its exit code is on disk
                self._save(job)

    def _save(self, job: Job) -> None:
        with self.agent.store.transaction() as db:
            db.execute("UPDATE jobs SET record=?, state=? WHERE id=?", (job.record(), job.state, job.id))

    # -- launching

    def _recipe_env(self, recipe: Trainer, job_id: str, output_dir: str) -> dict[str, str]:
        env = dict(os.environ)
        # torchrun's grace for its workers after SIGTERM (its default is 30 s): the recipe's own
        env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(max(1, int(recipe.stop_grace_s)))
        env.update({k: recipes.expand(v, job_id, output_dir) for k, v in recipe.env.items()})
        env["PATH"] = recipes.search_path(env)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA numbers GPUs as NVML does (PCI order), not fastest first
        env["CUDA_VISIBLE_DEVICES"] = recipes.visible_devices(recipe.gpus)  # none: no GPU, not every GPU
        env["CETLAB_JOB_ID"] = job_id
        env["PYTHONUNBUFFERED"] = "1"  # log lines as they happen, not when a buffer fills
        return env

    def _check_gpus(self, recipe: Trainer) -> None:
        latest = self.agent.latest
        count = len(latest.gpus) if latest is not None and latest.gpu_backend != "none" else None
        for index in recipe.gpus:
            if count is not None and index >= count:
                raise RemoteError(ErrorCode.UNAVAILABLE, f"recipe {recipe.name} wants GPU {index}, {self.agent.machine.name} has {count} GPUs")
        for other in self.jobs.values():
            taken = sorted(set(other.gpus) & set(recipe.gpus))
            if other.active and taken:
                raise RemoteError(
                    ErrorCode.CONFLICT,
                    f"GPU {','.join(map(str, taken))} is taken by job {other.id} ({other.recipe}, {other.state}); stop it first or pick other GPUs",
                    {"job": other.id},
                )
        for model in self._models_on_gpus():
            taken = sorted(set(model.get("gpus") or []) & set(recipe.gpus))
            if taken:
                raise RemoteError(
                    ErrorCode.CONFLICT,
                    f"GPU {','.join(map(str, taken))} holds model {model['name']} ({model['state']}); "
                    f"`cetlab sleep {model['name']}` or `cetlab cold {model['name']}` first, or pick other GPUs",
                    {"model": model["name"]},
                )

    def _models_on_gpus(self) -> list[dict[str, Any]]:
        """Models of the orchestra that occupy their GPUs now (a sleeping vLLM engine has freed them)."""
        for component in self.agent.components:
            if component.name == "models":
                section = component.section() or {}
                return [m for m in section.get("models", []) if m.get("state") in ("loading", "warming", "warm")]
        return []

    def _next_id(self) -> str:
        row = self.agent.store.query("SELECT COALESCE(MAX(n), 0) + 1 AS n FROM jobs")
        return f"{self.agent.machine.name}-{row[0]['n']}"

    def start_job(self, name: str, given: dict[str, Any]) -> Job:
        """Check everything, then launch; any problem is a typed error before a process exists."""
        agent = self.agent
        lab = agent.lab
        recipe = recipes.find_recipe(lab, name, agent.machine.name)
        values = recipes.resolve_params(recipe, given)
        self._check_gpus(recipe)
        job_id = self._next_id()
        output_dir = lab.resolve(recipes.expand(recipe.output_dir, job_id))
        cwd = lab.resolve(recipe.cwd) if recipe.cwd else (lab.source.parent if lab.source else output_dir)
        if cwd != output_dir and not cwd.is_dir():
            raise RemoteError(ErrorCode.UNAVAILABLE, f"cwd {cwd} of recipe {name} is not a folder")
        env = self._recipe_env(recipe, job_id, str(output_dir))
        program = recipes.expand(recipe.command[0], job_id, str(output_dir))
        found = recipes.find_program(program, cwd, env["PATH"])
        if found is None:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"command {program!r} of recipe {name} not found or not executable on {agent.machine.name} (PATH {env['PATH']})")
        torchrun = "torchrun"
        if recipe.launcher == "torchrun":
            torchrun = recipes.find_program("torchrun", cwd, env["PATH"])
            if torchrun is None:
                raise RemoteError(ErrorCode.UNAVAILABLE, f"recipe {name} uses torchrun, which is not installed on {agent.machine.name}")
        try:  # last: a refused start leaves no empty folder behind
            output_dir.mkdir(parents=True, exist_ok=True)
            if not os.access(output_dir, os.W_OK):
                raise PermissionError("permission denied")
        except OSError as exc:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"output_dir {output_dir} of recipe {name} is not writable: {exc.strerror or exc}") from None
        argv = recipes.build_argv(recipe, values, job_id, str(output_dir), torchrun)
        job_dir = self.jobs_dir / job_id
        job_dir.mkdir(parents=True, exist_ok=True)
        env[PROGRESS_ENV] = str(job_dir / "progress.json")
        job = Job(
            id=job_id, recipe=name, machine=agent.machine.name, gpus=list(recipe.gpus), params=values, argv=argv,
            cwd=str(cwd), output_dir=str(output_dir), log_path=str(self.logs_dir / f"job-{job_id}.log"),
            job_dir=str(job_dir), started_at=time.time(),
        )
        with agent.store.transaction() as db:
            db.execute("INSERT INTO jobs (id, recipe, record, state) VALUES (?, ?, ?, ?)", (job.id, name, job.record(), job.state))
        runner = [sys.executable, "-m", "agents.jobs.runner", "--job-dir", str(job_dir), "--log", job.log_path,
                  "--log-max-bytes", str(LOG_MAX_BYTES), "--log-keep", str(LOG_KEEP), "--", *argv]
        try:
            with open(job_dir / "runner.err", "ab") as err:
                # a new session: the job is nobody's terminal child and survives the agent
                job.popen = subprocess.Popen(runner, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True)
        except OSError as exc:
            job.state, job.error, job.ended_at = "failed", f"could not start the runner: {exc}", time.time()
            self.jobs[job.id] = job
            self._save(job)
            raise RemoteError(ErrorCode.UNAVAILABLE, job.error) from None
        job.runner_pid, job.runner_started = job.popen.pid, _create_time(job.popen.pid)
        self.jobs[job.id] = job
        self._save(job)
        log.info("started job %s (%s): %s", job.id, name, " ".join(argv))
        return job

    # -- stopping

    async def _trainer_pid(self, job: Job) -> int | None:
        """The trainer's pid (its process group), once the runner has started it."""
        deadline = time.monotonic() + CHILD_WAIT_S
        while job.pid is None and job.active and time.monotonic() < deadline:
            self._read_child(job)
            if job.pid is None:
                await asyncio.sleep(0.05)
        return job.pid

    def _signal(self, job: Job, sig: signal.Signals) -> None:
        if job.pid is None or not _alive(job.pid, job.pid_started):
            return
        # torchrun starts its workers in sessions of their own: a kill must reach the whole tree, not the group alone
        tree = descendants(job.pid) if sig == signal.SIGKILL else []
        try:
            os.killpg(job.pid, sig)
        except ProcessLookupError:
            pass
        for proc in tree:
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass

    async def stop_job(self, job: Job, grace_s: float | None, kill: bool) -> Job:
        if not job.active:
            raise RemoteError(ErrorCode.CONFLICT, f"job {job.id} has already {job.state}" + (f" (exit code {job.exit_code})" if job.exit_code is not None else ""))
        await self._trainer_pid(job)
        recipe = next((r for r in self.agent.lab.trainers if r.name == job.recipe), None)
        grace = grace_s if grace_s is not None else (recipe.stop_grace_s if recipe else 60.0)
        job.state = "stopping"
        if kill or job.stop_requested == "kill":
            job.stop_requested, job.kill_at = "kill", time.time()
            self._signal(job, signal.SIGKILL)
        else:
            job.stop_requested = "stop"
            job.kill_at = min(job.kill_at or float("inf"), time.time() + grace)
            self._signal(job, signal.SIGTERM)
        self._save(job)
        return job

    # -- supervision, once per tick

    def _read_child(self, job: Job) -> None:
        child = read_json(Path(job.job_dir) / "child.json")
        if child and isinstance(child.get("pid"), int):
            job.pid, job.pid_started = child["pid"], child.get("create_time")

    def _runner_ended(self, job: Job) -> bool:
        if job.popen is not None:
            return job.popen.poll() is not None  # our child: reap it
        return not _alive(job.runner_pid, job.runner_started)

    def _update_progress(self, job: Job) -> bool:
        doc = read_progress(Path(job.job_dir) / "progress.json")
        if not doc or doc.get("updated_at") == job.progress.get("updated_at"):
            return False
        previous = job.progress
        job.progress = {k: doc.get(k) for k in (
            "state", "step", "max_steps", "epoch", "loss", "learning_rate", "samples_per_s", "tokens_per_s",
            "eta_s", "checkpoints", "updated_at", "error", "stop_reason", "precision", "notes")}
        points = {step: loss for step, loss in job.loss_points}
        loss, step = doc.get("loss"), doc.get("step")
        if isinstance(loss, (int, float)) and isinstance(step, int) and loss != previous.get("loss"):
            points[step] = round(float(loss), 5)  # a new logged loss, seen at this tick's step
        checkpoints = [c for c in doc.get("checkpoints") or [] if isinstance(c, dict) and isinstance(c.get("step"), int)]
        if checkpoints and checkpoints[-1] != (previous.get("checkpoints") or [None])[-1]:
            # the newest checkpoint's log_history has every logged step up to it, at its true step
            latest = checkpoints[-1]
            state = read_json(Path(str(latest.get("path"))) / "trainer_state.json") or {}
            rows = [r for r in state.get("log_history") or [] if isinstance(r, dict) and isinstance(r.get("step"), int) and isinstance(r.get("loss"), (int, float))]
            if rows:
                points = {s: v for s, v in points.items() if s > latest["step"]}
                points.update({r["step"]: round(float(r["loss"]), 5) for r in rows})
        job.loss_points = [[s, points[s]] for s in sorted(points)][-LOSS_POINTS:]
        return True

    def _finish(self, job: Job) -> None:
        """The runner is gone: take the exit code it recorded, or call the job lost."""
        self._update_progress(job)
        ended = read_json(Path(job.job_dir) / "exit.json")
        job.ended_at = (ended or {}).get("ended_at") or time.time()
        if ended is None or not isinstance(ended.get("exit_code"), int):
            job.state = "lost"
            job.error = "the job's runner ended without recording an exit code (killed, or the machine rebooted)"
        else:
            job.exit_code = ended["exit_code"]
            stopped = job.stop_requested is not None
            job.state = "exited" if job.exit_code == 0 or stopped else "failed"
            if job.state == "failed":
                job.error = ended.get("error") or job.progress.get("error") or f"exited with code {job.exit_code}"
        job.last_lines, _ = tail(Path(job.log_path), LAST_LINES)
        job.starved = False
        job.popen = job.proc = None
        finished = sorted((j for j in self.jobs.values() if not j.active), key=lambda j: j.started_at)
        for old in finished[:-KEPT_FINISHED]:
            del self.jobs[old.id]
        self.agent.release_gpus(f"job:{job.id}")
        log.info("job %s %s (exit code %s)", job.id, job.state, job.exit_code)
        self.agent.notify(EVENT_NOTICE, {"level": "info" if job.state == "exited" else "error",
                                         "message": f"job {job.id} ({job.recipe}) {job.state}" + (f" with exit code {job.exit_code}" if job.exit_code is not None else "")})

    def _claim(self, job: Job) -> None:
        """Simulated GPUs show what the trainer really does on the CPU: its RSS as VRAM, its CPU as load."""
        if not job.gpus or job.pid is None or not self.agent.simulated:
            return
        try:
            if job.proc is None or job.proc.pid != job.pid:
                job.proc = psutil.Process(job.pid)
                job.proc.cpu_percent(None)
            procs = [job.proc, *job.proc.children(recursive=True)]
            cpu_pct = sum(p.cpu_percent(None) for p in procs)
            rss = sum(p.memory_info().rss for p in procs)
        except psutil.Error:
            return
        self.agent.claim_gpus(job.gpus, f"job:{job.id}", f"job {job.id} {job.recipe}", rss, min(SIM_UTIL_CAP_PCT, cpu_pct), pid=job.pid)

    def _check_starved(self, job: Job, telemetry: Telemetry, now: float) -> None:
        alerts = self.agent.lab.alerts
        utils = [g.util_pct for g in telemetry.gpus if g.index in job.gpus and g.util_pct is not None]
        if job.state != "running" or not utils or max(utils) >= alerts.starved_util_pct:
            job.starved_since, job.starved = None, False
            return
        job.starved_since = job.starved_since or now
        job.starved = now - job.starved_since >= alerts.starved_for_s

    def on_telemetry(self, telemetry: Telemetry) -> None:
        now = time.time()
        for job in list(self.jobs.values()):
            if not job.active:
                continue
            before = job.record()
            if job.pid is None:
                self._read_child(job)
            progressed = self._update_progress(job)
            if self._runner_ended(job):
                self._finish(job)
            else:
                if job.state == "starting" and (job.progress.get("state") in ("running", "saving") or (not job.progress and now - job.started_at >= NO_PROGRESS_RUNNING_S)):
                    job.state = "running"
                if job.state == "stopping" and job.kill_at is not None and now >= job.kill_at and job.stop_requested == "stop":
                    log.warning("job %s did not stop within its grace period: SIGKILL", job.id)
                    job.stop_requested = "kill"
                    self._signal(job, signal.SIGKILL)
                self._claim(job)
                self._check_starved(job, telemetry, now)
            if progressed or job.record() != before:
                self._save(job)
        self._push_logs()

    # -- logs

    def _push_logs(self) -> None:
        for key, (peer, follower) in list(self.followers.items()):
            job_id = key[1]
            if peer.closed or f"log:{job_id}" not in peer.topics:
                del self.followers[key]
                continue
            lines, offset = follower.read()
            job = self.jobs.get(job_id)
            ended = job is None or not job.active
            if lines or ended:
                peer.push(EVENT_LOG, {"job": job_id, "lines": lines, "offset": offset, "ended": ended and not lines,
                                      "state": job.state if job else None, "exit_code": job.exit_code if job else None})
            if ended and not lines:
                del self.followers[key]

    def logs(self, peer: Peer, job: Job, params: LogsParams) -> dict[str, Any]:
        path = Path(job.log_path)
        if params.offset is None:
            lines, offset = tail(path, params.tail_lines)
        else:
            lines, offset = read_from(path, params.offset)
        if params.follow:
            peer.topics.add(f"log:{job.id}")
            self.followers[(id(peer), job.id)] = (peer, Follower(path, offset))
        return {"id": job.id, "path": str(path), "lines": lines, "offset": offset, "state": job.state}

    # -- state

    def section(self) -> list[dict[str, Any]]:
        now = time.time()
        jobs = sorted(self.jobs.values(), key=lambda j: j.started_at, reverse=True)
        finished = [j for j in jobs if not j.active][:SECTION_FINISHED]
        keep = {j.id for j in finished}
        return [self._pushed(j, now) for j in jobs if j.active or j.id in keep]

    def _pushed(self, job: Job, now: float) -> dict[str, Any]:
        """A job as pushed to every console at every change: trimmed (jobs.get has the rest)."""
        data = job.to_json(self.agent.simulated, now)
        data["loss_history"] = data["loss_history"][-SECTION_LOSS_POINTS:]
        data["last_lines"] = data["last_lines"][-SECTION_LAST_LINES:]
        return data

    def get(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            rows = self.agent.store.query("SELECT record FROM jobs WHERE id=?", (job_id,))
            if not rows:
                raise RemoteError(ErrorCode.NOT_FOUND, f"no job {job_id!r} on {self.agent.machine.name} (see `cetlab jobs`)")
            job = Job.from_record(rows[0]["record"])
        return job

    def _register(self) -> None:
        rpc = self.agent.rpc

        @rpc.method("jobs.recipes", doc="The recipes of this machine with their launch params.")
        async def list_recipes(peer: Peer, _params) -> list:
            return [recipes.recipe_json(r) for r in self.agent.lab.trainers if r.machine == self.agent.machine.name]

        @rpc.method("jobs.list", params=ListParams, doc="Jobs, newest first: the active ones and recent history.")
        async def list_jobs(peer: Peer, params: ListParams) -> list:
            rows = self.agent.store.query("SELECT id, record FROM jobs ORDER BY n DESC LIMIT ?", (params.limit,))
            now = time.time()
            jobs = [self.jobs.get(row["id"]) or Job.from_record(row["record"]) for row in rows]
            return [job.to_json(self.agent.simulated, now) for job in jobs]

        @rpc.method("jobs.get", params=JobParams, doc="One job, with its command line and last log lines.")
        async def get_job(peer: Peer, params: JobParams) -> dict:
            job = self.get(params.id)
            return {**job.to_json(self.agent.simulated), "argv": job.argv, "cwd": job.cwd, "runner_pid": job.runner_pid}

        @rpc.method("jobs.start", role=Role.OPERATOR, params=StartParams, doc="Launch a recipe with validated params.")
        async def start_job(peer: Peer, params: StartParams) -> dict:
            job = self.start_job(params.recipe, params.params)
            log.info("job %s started by %s", job.id, peer.who)
            return {**job.to_json(self.agent.simulated), "argv": job.argv, "cwd": job.cwd}

        @rpc.method("jobs.stop", role=Role.OPERATOR, params=StopParams, doc="SIGTERM to the job's process group; SIGKILL after grace_s.")
        async def stop_job(peer: Peer, params: StopParams) -> dict:
            job = await self.stop_job(self.get(params.id), params.grace_s, kill=False)
            log.info("job %s stop requested by %s", job.id, peer.who)
            return job.to_json(self.agent.simulated)

        @rpc.method("jobs.kill", role=Role.OPERATOR, params=JobParams, doc="SIGKILL to the job's process group now.")
        async def kill_job(peer: Peer, params: JobParams) -> dict:
            job = await self.stop_job(self.get(params.id), None, kill=True)
            log.info("job %s killed by %s", job.id, peer.who)
            return job.to_json(self.agent.simulated)

        @rpc.method("jobs.logs", params=LogsParams, doc="Log lines: the tail, or from an offset; follow pushes `log` events.")
        async def job_logs(peer: Peer, params: LogsParams) -> dict:
            return self.logs(peer, self.get(params.id), params)
