"""The runs of this machine as last scanned, and why each checkpoint is in use: the checkpoints component's catalog."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from agents.checkpoints.discovery import Run, Scanner
from agents.checkpoints.parsing import Checkpoint
from agents.checkpoints.records import ServedRecords
from agents.jobs.port import JobsPort, JobView
from agents.orchestra.port import ModelsPort
from agents.runtime.core import AgentCore
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.checkpoints import RunSummary
from agents.wire.served import SERVE_PREPARING, is_served
from agents.wire.states import ModelState


class RunCatalog:
    """Every run with checkpoints under the watched folders, rescanned on demand; the kept flags; the events log."""

    def __init__(self, core: AgentCore, served: ServedRecords) -> None:
        self.core = core
        self.served = served  # the serving part's records: a served checkpoint is in use
        self.runs: dict[str, Run] = {}
        self.kept: set[str] = set()
        self.scanner = Scanner(core.lab.checkpoints.settle_s)
        self.summaries: list[RunSummary] = []
        self._scan_lock = asyncio.Lock()

    def load_kept(self) -> None:
        self.kept = {row["path"] for row in self.core.store.query("SELECT path FROM checkpoint_flags WHERE kept=1")}

    def _roots(self) -> tuple[list[tuple[Path, str | None]], dict[Path, JobView]]:
        """Folders to look in (with the recipe they belong to) and the jobs by output dir, gathered on the loop."""
        lab, here = self.core.lab, self.core.machine.name
        roots: list[tuple[Path, str | None]] = []
        for recipe in lab.trainers:
            if recipe.machine != here:
                continue
            template = recipe.output_dir
            # {job_id} in output_dir: every run is a folder in the part before it
            base = template.split("{job_id}")[0] if "{job_id}" in template else template
            roots.append((resolved(self.core, base.rstrip("/") or "."), recipe.name))
            roots += [(resolved(self.core, d), recipe.name) for d in recipe.checkpoint_dirs]
        roots += [(resolved(self.core, d.path), None) for d in lab.checkpoints.dirs if d.machine == here]
        jobs: dict[Path, JobView] = {}
        component = self.core.find(JobsPort)
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
            machine = self.core.machine.name
            self.summaries = [r.summary(machine) for r in runs.values()]

    def _mark_use(self, runs: dict[str, Run]) -> None:
        """Why a checkpoint may not be deleted now: a job resumes from it, trains into it, or a model serves it."""
        component = self.core.find(JobsPort)
        active = [j for j in component.views() if j.active] if component else []
        pool = self.core.find(ModelsPort)
        for run in runs.values():
            for ckpt in run.checkpoints:
                record = self.served.get(ckpt.path)
                if record is not None:
                    served = record.serving
                    view = pool.find_view(served.model) if pool is not None else None
                    # the serve's own steps (merging, converting) and its failure are its record's; after them, the model's state
                    state = (
                        view.state
                        if view is not None and served.state not in SERVE_PREPARING | {ModelState.FAILED}
                        else served.state
                    )
                    if served.mode == "adapter" and view is not None and view.engine_serial != record.engine_serial:
                        state = "unloaded"  # the engine restarted: the adapter is gone from it
                    ckpt.serving = served.model_copy(update={"state": state})
                    if is_served(ckpt.serving):  # the one answer the console and the CLI give (agents/wire/served.py)
                        ckpt.in_use = f"served by model {served.model} ({state})"
                for job in active:
                    if ckpt.path in job.argv:
                        ckpt.in_use = f"job {job.id} resumed from it and is {job.state}"
                    elif ckpt.newest and Path(job.output_dir).resolve() == run.path:
                        ckpt.in_use = (
                            f"job {job.id} is still training this run ({job.state}); its newest checkpoint is its restart point"
                        )

    async def run(self, name: str) -> Run:
        await self.rescan()
        run = self.runs.get(name)
        if run is None:
            names = ", ".join(self.runs) or "none"
            raise RemoteError(
                ErrorCode.NOT_FOUND,
                f"no run {name!r} on {self.core.machine.name} (runs here: {names}); runs are named by job id or output folder",
            )
        return run

    async def complete(self, run_name: str, step: int) -> tuple[Run, Checkpoint]:
        """The run and its checkpoint at `step`, which must be complete to be acted on."""
        run = await self.run(run_name)
        ckpt = run.by_step(step)
        if not ckpt.complete:
            raise RemoteError(
                ErrorCode.CONFLICT, f"checkpoint {ckpt.step} of {run.name} is incomplete ({ckpt.problem}); pick a complete one"
            )
        return run, ckpt

    def event(self, run: Run, ckpt: Checkpoint | None, event: str, who: str, detail: Any = None) -> None:
        with self.core.store.transaction() as db:
            db.execute(
                "INSERT INTO checkpoint_events (t, run, step, path, event, who, detail) VALUES (?,?,?,?,?,?,?)",
                (
                    time.time(),
                    run.name,
                    ckpt.step if ckpt else None,
                    ckpt.path if ckpt else None,
                    event,
                    who,
                    None if detail is None else json.dumps(detail),
                ),
            )


def resolved(core: AgentCore, path: str) -> Path:
    """A lab.yaml path, absolute against the lab file's folder."""
    return core.lab.resolve(path) or Path(path)
