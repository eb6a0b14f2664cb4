"""CheckpointsComponent: the runs of this machine, rescanned in the background, and why a checkpoint is in use."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.checkpoints.actions import ActionsMixin
from agents.checkpoints.discovery import Run, Scanner
from agents.checkpoints.parsing import Checkpoint
from agents.checkpoints.rpc import register
from agents.checkpoints.serving import ServingMixin
from agents.jobs.supervisor import JobView
from agents.protocol import ErrorCode, RemoteError, Telemetry
from agents.sections import RunSummary, Serving
from agents.states import MODEL_ENGINE_UP, ModelState

if TYPE_CHECKING:
    from agents.agent import Agent

log = logging.getLogger("cetlab.checkpoints")

SCHEMA = [
    "CREATE TABLE checkpoint_flags (path TEXT PRIMARY KEY, kept INTEGER NOT NULL, t REAL NOT NULL)",
    """CREATE TABLE checkpoint_events (id INTEGER PRIMARY KEY, t REAL NOT NULL, run TEXT NOT NULL, step INTEGER,
       path TEXT, event TEXT NOT NULL, who TEXT, detail TEXT)""",
]


class CheckpointsComponent(ActionsMixin, ServingMixin):
    """Hugging Face checkpoints of every run on this machine: timeline, keep, prune, serve, resume."""

    name = "checkpoints"

    def __init__(self) -> None:
        self.agent: Agent | None = None
        self.runs: dict[str, Run] = {}
        self.kept: set[str] = set()
        self.serving: dict[str, dict[str, Any]] = {}  # checkpoint path -> {"model", "mode", "state", "error", "engine"}
        self.scanner: Scanner | None = None
        self._section: list[RunSummary] = []
        self._scan_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task] = []

    # -- lifecycle

    async def start(self, agent: Agent) -> None:
        """Registers the methods and starts the background scan: the agent listens before the first scan ends."""
        self.agent = agent
        self.scanner = Scanner(agent.lab.checkpoints.settle_s)
        agent.store.migrate(self.name, SCHEMA)
        self.kept = {row["path"] for row in agent.store.query("SELECT path FROM checkpoint_flags WHERE kept=1")}
        register(self)
        self._tasks.append(asyncio.create_task(self._loop(), name="checkpoints"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def on_telemetry(self, telemetry: Telemetry) -> None:
        """Discovery runs on its own, slower poll (lab.yaml checkpoints.poll_s)."""

    def section(self) -> list[RunSummary]:
        return self._section

    def run_summaries(self) -> list[RunSummary]:  # CheckpointsPort (agents/checkpoints/port.py)
        return self._section

    async def _loop(self) -> None:
        while True:
            try:
                await self.rescan()
            except Exception:
                log.exception("checkpoint scan failed")
            await asyncio.sleep(self.agent.lab.checkpoints.poll_s)

    # -- discovery

    def _jobs(self) -> Any | None:
        return self.agent.component("jobs")

    def _pool(self) -> Any | None:
        return self.agent.component("models")

    def _roots(self) -> tuple[list[tuple[Path, str | None]], dict[Path, JobView]]:
        """Folders to look in (with the recipe they belong to) and the jobs by output dir, gathered on the loop."""
        lab, here = self.agent.lab, self.agent.machine.name
        roots: list[tuple[Path, str | None]] = []
        for recipe in lab.trainers:
            if recipe.machine != here:
                continue
            template = recipe.output_dir
            # {job_id} in output_dir: every run is a folder in the part before it
            base = template.split("{job_id}")[0] if "{job_id}" in template else template
            roots.append((lab.resolve(base.rstrip("/") or "."), recipe.name))
            roots += [(lab.resolve(d), recipe.name) for d in recipe.checkpoint_dirs]
        roots += [(lab.resolve(d.path), None) for d in lab.checkpoints.dirs if d.machine == here]
        jobs: dict[Path, JobView] = {}
        component = self._jobs()
        for job in component.views() if component else []:
            path = Path(job.output_dir).resolve()
            jobs[path] = job  # the newest job that wrote into a folder names it
            roots.append((path, job.recipe))
        return roots, jobs

    async def rescan(self) -> None:
        async with self._scan_lock:
            roots, jobs = self._roots()
            runs = await asyncio.to_thread(self.scanner.scan, roots, jobs, set(self.kept), time.time())
            self._mark_use(runs)
            self.runs = runs
            machine = self.agent.machine.name
            self._section = [r.summary(machine) for r in runs.values()]

    def _mark_use(self, runs: dict[str, Run]) -> None:
        """Why a checkpoint may not be deleted now: a job resumes from it, trains into it, or a model serves it."""
        component = self._jobs()
        active = [j for j in component.views() if j.active] if component else []
        pool = self._pool()
        for run in runs.values():
            for ckpt in run.checkpoints:
                record = self.serving.get(ckpt.path)
                if record is not None:
                    slot = pool.find(record["model"]) if pool is not None else None
                    state = slot.state if slot is not None and record["state"] not in ("merging", ModelState.FAILED) else record["state"]
                    if record["mode"] == "adapter" and slot is not None and slot.engine is not record.get("engine"):
                        state = "unloaded"  # the engine restarted: the adapter is gone from it
                    ckpt.serving = Serving(model=record["model"], mode=record["mode"], state=state, error=record.get("error"))
                    if state in MODEL_ENGINE_UP or state == "merging":
                        ckpt.in_use = f"served by model {record['model']} ({state})"
                for job in active:
                    if ckpt.path in job.argv:
                        ckpt.in_use = f"job {job.id} resumed from it and is {job.state}"
                    elif ckpt.newest and Path(job.output_dir).resolve() == run.path:
                        ckpt.in_use = f"job {job.id} is still training this run ({job.state}); its newest checkpoint is its restart point"

    # -- lookups

    async def run(self, name: str) -> Run:
        await self.rescan()
        run = self.runs.get(name)
        if run is None:
            names = ", ".join(self.runs) or "none"
            raise RemoteError(ErrorCode.NOT_FOUND, f"no run {name!r} on {self.agent.machine.name} (runs here: {names}); runs are named by job id or output folder")
        return run

    async def _complete(self, run_name: str, step: int) -> tuple[Run, Checkpoint]:
        """The run and its checkpoint at `step`, which must be complete to be acted on."""
        run = await self.run(run_name)
        ckpt = run.by_step(step)
        if not ckpt.complete:
            raise RemoteError(ErrorCode.CONFLICT, f"checkpoint {ckpt.step} of {run.name} is incomplete ({ckpt.problem}); pick a complete one")
        return run, ckpt

    def _event(self, run: Run, ckpt: Checkpoint | None, event: str, who: str, detail: Any = None) -> None:
        with self.agent.store.transaction() as db:
            db.execute("INSERT INTO checkpoint_events (t, run, step, path, event, who, detail) VALUES (?,?,?,?,?,?,?)",
                       (time.time(), run.name, ckpt.step if ckpt else None, ckpt.path if ckpt else None, event, who,
                        None if detail is None else json.dumps(detail)))
