"""CheckpointsComponent: Hugging Face checkpoints of every run on this machine: timeline, keep, prune, serve, resume."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from agents.lab import Model
from agents.protocol import EVENT_NOTICE, ErrorCode, RemoteError, Role, Telemetry
from agents.rpc import Peer
from agents.train.progress import read_progress

if TYPE_CHECKING:
    from agents.agent import Agent

log = logging.getLogger("cetlab.checkpoints")

CHECKPOINT_RE = re.compile(r"^(tmp-)?checkpoint-(\d+)$")
RESUME_PARAM = "resume_from_checkpoint"  # the recipe param a resume fills in (cetlab-train's --resume-from-checkpoint)
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")
FULL_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")
OPTIMIZER_FILES = ("optimizer.pt", "optimizer.bin")
CURVE_POINTS = 500  # loss points per curve sent to consoles
ADAPTER_ENGINES = ("vllm", "sim")  # engines that load LoRA adapters at run time (/v1/load_lora_adapter)
UP = ("loading", "warming", "warm", "sleeping")  # a served model in these states holds its checkpoint

SCHEMA = [
    "CREATE TABLE checkpoint_flags (path TEXT PRIMARY KEY, kept INTEGER NOT NULL, t REAL NOT NULL)",
    """CREATE TABLE checkpoint_events (id INTEGER PRIMARY KEY, t REAL NOT NULL, run TEXT NOT NULL, step INTEGER,
       path TEXT, event TEXT NOT NULL, who TEXT, detail TEXT)""",
]


class RunParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run: str = Field(min_length=1, max_length=200)


class StepParams(RunParams):
    step: int = Field(ge=0)


class ResumeParams(StepParams):
    params: dict[str, Any] = Field(default_factory=dict, max_length=64)  # overrides of the run's recipe params


class ServeParams(StepParams):
    model: str | None = Field(default=None, max_length=64)  # a warm model to load the adapter into, or to borrow engine/GPUs from


class DeleteParams(StepParams):
    confirm_special: bool = False  # needed to delete the best or the newest checkpoint


class KeepParams(StepParams):
    kept: bool = True


class PruneParams(RunParams):
    keep_last: int = Field(ge=0, le=100000)


# ---------------------------------------------------------------------------- reading a checkpoint


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (float("inf"), float("-inf")):
        return None
    return float(value)


def _row_step(row: dict) -> int | None:
    step = row.get("step", row.get("global_step"))
    return int(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else None


def history_points(log_history: Any) -> tuple[list[list], list[list]]:
    """[[step, loss]], [[step, eval_loss]] from a log_history, tolerant of key names across versions.

    `loss` rows are the training curve; `train_loss` (the end-of-run average in recent versions, the
    per-step loss in some old ones) is used only at steps with no `loss` row."""
    loss: dict[int, float] = {}
    fallback: dict[int, float] = {}
    evals: dict[int, float] = {}
    for row in log_history if isinstance(log_history, list) else []:
        if not isinstance(row, dict) or (step := _row_step(row)) is None:
            continue
        if (value := _number(row.get("loss"))) is not None:
            loss[step] = value
        elif (value := _number(row.get("train_loss"))) is not None:
            fallback[step] = value
        if (value := _number(row.get("eval_loss"))) is not None:
            evals[step] = value
    merged = {**fallback, **loss}
    return [[s, merged[s]] for s in sorted(merged)], [[s, evals[s]] for s in sorted(evals)]


def value_at(points: list[list], step: int) -> float | None:
    """The last value logged at or before `step`."""
    found = None
    for s, value in points:
        if s > step:
            break
        found = value
    return found


@dataclass
class Checkpoint:
    run: str
    step: int
    path: str
    epoch: float | None = None
    written_at: float | None = None
    size_bytes: int = 0
    loss: float | None = None
    eval_loss: float | None = None
    save_s: float | None = None
    save_s_from: str | None = None  # "trainer" (its progress reports) | "file_times"
    is_best: bool = False
    kept: bool = False
    newest: bool = False
    kind: str = "unknown"  # adapter | full | unknown
    has_optimizer: bool = False
    complete: bool = True
    problem: str | None = None
    in_use: str | None = None  # why it cannot be deleted now
    serving: dict[str, Any] | None = None
    # parsed, not sent
    base_model: str | None = field(default=None, repr=False)
    best_path: str | None = field(default=None, repr=False)
    loss_points: list[list] = field(default_factory=list, repr=False)
    eval_points: list[list] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in JSON_FIELDS}


JSON_FIELDS = tuple(f for f in Checkpoint.__dataclass_fields__ if f not in ("base_model", "best_path", "loss_points", "eval_points"))


@dataclass(frozen=True)
class JobView:
    """What discovery needs of a job, copied on the event loop so the scan thread reads no live state."""

    id: str
    recipe: str
    state: str
    started_at: float
    ended_at: float | None
    reports: tuple  # the trainer's checkpoint entries (progress.json)
    loss_points: tuple


def _walk_files(path: Path) -> list[os.stat_result]:
    stats = []
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                stats.append(os.stat(os.path.join(root, name)))
            except OSError:  # removed while we looked: the next poll sees the new state
                pass
    return stats


def read_checkpoint(run: str, path: Path, settle_s: float, now: float, reported: bool = False) -> Checkpoint:
    """Everything about one checkpoint folder; a broken one comes back incomplete with the reason, never raises.

    `reported`: the trainer said it finished saving it, so fresh files do not mean a save in progress."""
    match = CHECKPOINT_RE.match(path.name)
    ckpt = Checkpoint(run=run, step=int(match.group(2)) if match else -1, path=str(path))
    stats = _walk_files(path)
    ckpt.size_bytes = sum(s.st_size for s in stats)
    mtimes = [s.st_mtime for s in stats]
    ckpt.written_at = max(mtimes) if mtimes else path.stat().st_mtime
    if len(mtimes) > 1:
        ckpt.save_s, ckpt.save_s_from = round(max(mtimes) - min(mtimes), 3), "file_times"
    names = set(os.listdir(path)) if path.is_dir() else set()
    ckpt.kind = "adapter" if names & set(ADAPTER_FILES) else "full" if (names & set(FULL_FILES) or any(n.startswith("model-") for n in names)) else "unknown"
    ckpt.has_optimizer = bool(names & set(OPTIMIZER_FILES))
    if ckpt.kind == "adapter":
        try:
            ckpt.base_model = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
        except (OSError, ValueError, AttributeError):
            pass
    state: Any = None
    try:
        state = json.loads((path / "trainer_state.json").read_text())
    except FileNotFoundError:
        ckpt.problem = "no trainer_state.json (an interrupted or half-written save)"
    except (OSError, ValueError) as exc:
        ckpt.problem = f"trainer_state.json is unreadable ({type(exc).__name__}: truncated or half-written?)"
    if isinstance(state, dict):
        ckpt.epoch = _number(state.get("epoch"))
        ckpt.best_path = state.get("best_model_checkpoint") if isinstance(state.get("best_model_checkpoint"), str) else None
        ckpt.loss_points, ckpt.eval_points = history_points(state.get("log_history"))
        ckpt.loss = value_at(ckpt.loss_points, ckpt.step)
        ckpt.eval_loss = value_at(ckpt.eval_points, ckpt.step)
    elif state is not None and ckpt.problem is None:
        ckpt.problem = "trainer_state.json is not a JSON object"
    if ckpt.problem is None and ckpt.kind == "unknown":
        ckpt.problem = "no model or adapter weights in it"
    age_s = now - ckpt.written_at
    if match and match.group(1):
        ckpt.problem = "save in progress (temporary folder)" if age_s < settle_s else "left over from an interrupted save (temporary folder)"
    elif age_s < settle_s and not reported:
        ckpt.problem = f"save in progress (written {max(0.0, age_s):.0f} s ago)"
    ckpt.complete = ckpt.problem is None
    return ckpt


def merge_adapter(base: str, adapter: str, out: str) -> None:
    """Merge a PEFT adapter into a copy of its base model (peft merge_and_unload); runs in a child process."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = Path(out)
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    merged.save_pretrained(tmp)
    tokenizer_from = adapter if (Path(adapter) / "tokenizer_config.json").is_file() else base
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)


# ---------------------------------------------------------------------------- runs


@dataclass
class Run:
    name: str
    path: Path
    job: str | None = None
    recipe: str | None = None
    job_state: str | None = None
    wall_s: float | None = None
    checkpoints: list[Checkpoint] = field(default_factory=list)
    live_loss: list[list] = field(default_factory=list)  # the job's loss beyond its newest checkpoint

    def by_step(self, step: int) -> Checkpoint:
        for ckpt in self.checkpoints:
            if ckpt.step == step:
                return ckpt
        steps = ", ".join(str(c.step) for c in self.checkpoints) or "none"
        raise RemoteError(ErrorCode.NOT_FOUND, f"run {self.name} has no checkpoint at step {step} (steps: {steps})")

    def summary(self, machine: str) -> dict[str, Any]:
        complete = [c for c in self.checkpoints if c.complete]
        best = next((c for c in complete if c.is_best), None)
        saves = [c.save_s for c in complete if c.save_s is not None]
        save_total = round(sum(saves), 3) if saves else None
        return {
            "run": self.name,
            "machine": machine,
            "path": str(self.path),
            "job": self.job,
            "recipe": self.recipe,
            "job_state": self.job_state,
            "count": len(complete),
            "incomplete": len(self.checkpoints) - len(complete),
            "newest_step": complete[-1].step if complete else None,
            "best_step": best.step if best else None,
            "best_loss": (best.eval_loss if best.eval_loss is not None else best.loss) if best else None,
            "disk_bytes": sum(c.size_bytes for c in self.checkpoints),
            "save_s_total": save_total,
            "wall_s": self.wall_s,
            "save_share_pct": round(100 * save_total / self.wall_s, 2) if save_total is not None and self.wall_s else None,
        }

    def curves(self) -> dict[str, list[list]]:
        """The run's loss and eval-loss curves: the newest complete checkpoint's history, then the live job's."""
        source = next((c for c in reversed(self.checkpoints) if c.complete and c.loss_points), None)
        loss = list(source.loss_points) if source else []
        evals = list(source.eval_points) if source else []
        last = loss[-1][0] if loss else -1
        loss += [p for p in self.live_loss if p[0] > last]
        step = max(1, -(-len(loss) // CURVE_POINTS))
        return {"loss": loss[::step] if step == 1 else loss[::step] + [loss[-1]], "eval_loss": evals[-CURVE_POINTS:]}


def mark_best(checkpoints: list[Checkpoint]) -> None:
    """best_model_checkpoint of the newest state that names one, else the lowest eval_loss, else the lowest loss."""
    complete = [c for c in checkpoints if c.complete]
    for ckpt in checkpoints:
        ckpt.is_best = ckpt.newest = False
    if not complete:
        return
    complete[-1].newest = True
    best = None
    named = next((c.best_path for c in reversed(complete) if c.best_path), None)
    if named:
        best = next((c for c in complete if Path(c.path).name == Path(named).name), None)
    if best is None and any(c.eval_loss is not None for c in complete):
        best = min((c for c in complete if c.eval_loss is not None), key=lambda c: (c.eval_loss, c.step))
    if best is None and any(c.loss is not None for c in complete):
        best = min((c for c in complete if c.loss is not None), key=lambda c: (c.loss, c.step))
    if best is not None:
        best.is_best = True


def _checkpoint_dirs(folder: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(folder) if CHECKPOINT_RE.match(e.name) and e.is_dir()]
    except OSError:
        return []


def _safe_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._") or "run"
    return name[:64]


class CheckpointsComponent:
    name = "checkpoints"

    def __init__(self) -> None:
        self.agent: Agent | None = None
        self.runs: dict[str, Run] = {}
        self.kept: set[str] = set()
        self.serving: dict[str, dict[str, Any]] = {}  # checkpoint path -> {"model", "mode", "state", "error"}
        self._cache: dict[str, tuple[int, float, Checkpoint]] = {}  # path -> (folder mtime_ns, read at, parsed)
        self._progress: dict[str, tuple[float, dict]] = {}  # progress.json path -> (mtime, doc)
        self._section: list[dict[str, Any]] = []
        self._scan_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task] = []

    # -- lifecycle

    async def start(self, agent: Agent) -> None:
        self.agent = agent
        agent.store.migrate(self.name, SCHEMA)
        self.kept = {row["path"] for row in agent.store.query("SELECT path FROM checkpoint_flags WHERE kept=1")}
        self._register()
        await self.rescan()
        self._tasks.append(asyncio.create_task(self._loop(), name="checkpoints"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def on_telemetry(self, telemetry: Telemetry) -> None:
        """Discovery runs on its own, slower poll (lab.yaml checkpoints.poll_s)."""

    def section(self) -> list[dict[str, Any]]:
        return self._section

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.agent.lab.checkpoints.poll_s)
            try:
                await self.rescan()
            except Exception:
                log.exception("checkpoint scan failed")

    # -- discovery

    def _jobs(self):
        return next((c for c in self.agent.components if c.name == "jobs"), None)

    def _orchestra(self):
        return next((c for c in self.agent.components if c.name == "models"), None)

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
        for job in sorted(component.jobs.values(), key=lambda j: j.started_at) if component else []:
            path = Path(job.output_dir).resolve()
            # the newest job that wrote into a folder names it
            jobs[path] = JobView(job.id, job.recipe, job.state, job.started_at, job.ended_at,
                                 tuple(job.progress.get("checkpoints") or ()), tuple(tuple(p) for p in job.loss_points))
            roots.append((path, job.recipe))
        return roots, jobs

    def _scan(self, roots: list[tuple[Path, str | None]], jobs: dict[Path, JobView], kept: set[str], now: float) -> dict[str, Run]:
        found: dict[Path, str | None] = {}
        for root, recipe in roots:
            root = root.resolve()
            if _checkpoint_dirs(root):
                found.setdefault(root, recipe)
                continue
            try:
                subdirs = [Path(e.path) for e in os.scandir(root) if e.is_dir()]
            except OSError:
                continue
            for sub in subdirs:
                if _checkpoint_dirs(sub):
                    found.setdefault(sub.resolve(), recipe)
        runs: dict[str, Run] = {}
        settle_s = self.agent.lab.checkpoints.settle_s
        seen: set[str] = set()
        for path in sorted(found):
            job = jobs.get(path)
            name = _safe_name(job.id if job else path.name)
            while name in runs:  # two folders of the same name: the later one gets a suffix
                name = _safe_name(f"{name}-{path.parent.name}") if not name.endswith(path.parent.name) else name + "-2"
            run = Run(name=name, path=path, job=job.id if job else None, recipe=job.recipe if job else found[path],
                      job_state=job.state if job else None)
            reports = self._reports(path, job)
            for folder in sorted(_checkpoint_dirs(path), key=lambda p: (int(CHECKPOINT_RE.match(p.name).group(2)), p.name)):
                seen.add(str(folder))
                report = reports.get(str(folder))
                ckpt = self._read(run.name, folder, settle_s, now, report is not None)
                ckpt.kept = str(folder) in kept
                if report is not None and _number(report.get("save_s")) is not None:
                    ckpt.save_s, ckpt.save_s_from = round(float(report["save_s"]), 3), "trainer"
                run.checkpoints.append(ckpt)
            mark_best(run.checkpoints)
            run.wall_s = self._wall_s(path, job, now)
            if job is not None:
                run.live_loss = [list(p) for p in job.loss_points]
            runs[name] = run
        self._cache = {k: v for k, v in self._cache.items() if k in seen}
        return runs

    def _read(self, run: str, folder: Path, settle_s: float, now: float, reported: bool) -> Checkpoint:
        """Parse again only when the folder changed or may still be changing."""
        try:
            stat = folder.stat()
        except OSError:
            return Checkpoint(run=run, step=-1, path=str(folder), complete=False, problem="removed while being read")
        cached = self._cache.get(str(folder))
        # a folder read while young may still be written to in place, which its mtime does not show
        if cached is not None and cached[0] == stat.st_mtime_ns and cached[1] - cached[2].written_at >= settle_s:
            ckpt = cached[2]
        else:
            ckpt = read_checkpoint(run, folder, settle_s, now, reported)
            self._cache[str(folder)] = (stat.st_mtime_ns, now, ckpt)
        return replace(ckpt, run=run)

    def _reports(self, path: Path, job: JobView | None) -> dict[str, dict]:
        """The trainer's own save reports by checkpoint path: the job's progress, else <run>/progress.json."""
        entries = list(job.reports) if job is not None else []
        progress = path / "progress.json"
        try:
            mtime = progress.stat().st_mtime
            if self._progress.get(str(progress), (None,))[0] != mtime:
                self._progress[str(progress)] = (mtime, read_progress(progress) or {})
            entries += self._progress[str(progress)][1].get("checkpoints") or []
        except OSError:
            pass
        return {str(e.get("path")): e for e in entries if isinstance(e, dict)}

    def _wall_s(self, path: Path, job: JobView | None, now: float) -> float | None:
        if job is not None:
            return round(max(0.0, (job.ended_at or now) - job.started_at), 1)
        doc = self._progress.get(str(path / "progress.json"), (None, {}))[1]
        return _number(doc.get("elapsed_s"))

    async def rescan(self) -> None:
        async with self._scan_lock:
            roots, jobs = self._roots()
            runs = await asyncio.to_thread(self._scan, roots, jobs, set(self.kept), time.time())
            self._mark_use(runs)
            self.runs = runs
            machine = self.agent.machine.name
            self._section = [r.summary(machine) for r in runs.values()]

    def _mark_use(self, runs: dict[str, Run]) -> None:
        """Why a checkpoint may not be deleted now: a job resumes from it, trains into it, or a model serves it."""
        component = self._jobs()
        active = [j for j in component.jobs.values() if j.active] if component else []
        slots = getattr(self._orchestra(), "slots", {})
        for run in runs.values():
            for ckpt in run.checkpoints:
                record = self.serving.get(ckpt.path)
                if record is not None:
                    slot = slots.get(record["model"])
                    state = slot.state if slot is not None and record["state"] not in ("merging", "failed") else record["state"]
                    if record["mode"] == "adapter" and slot is not None and slot.engine is not record.get("engine"):
                        state = "unloaded"  # the engine restarted: the adapter is gone from it
                    ckpt.serving = {"model": record["model"], "mode": record["mode"], "state": state, "error": record.get("error")}
                    if state in UP or state == "merging":
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

    def _event(self, run: Run, ckpt: Checkpoint | None, event: str, who: str, detail: Any = None) -> None:
        with self.agent.store.transaction() as db:
            db.execute("INSERT INTO checkpoint_events (t, run, step, path, event, who, detail) VALUES (?,?,?,?,?,?,?)",
                       (time.time(), run.name, ckpt.step if ckpt else None, ckpt.path if ckpt else None, event, who,
                        None if detail is None else json.dumps(detail)))

    # -- actions

    def _delete_path(self, run: Run, ckpt: Checkpoint) -> None:
        path = Path(ckpt.path)
        # only a checkpoint-<step> folder right inside a watched run folder is ever removed
        if path.parent.resolve() != run.path or not CHECKPOINT_RE.match(path.name):
            raise RemoteError(ErrorCode.INVALID_PARAMS, f"{path} is not a checkpoint folder of run {run.name}")
        if path.is_symlink():
            path.unlink()
        else:
            shutil.rmtree(path)
        self._cache.pop(str(path), None)

    def _forget(self, paths: list[str]) -> None:
        with self.agent.store.transaction() as db:
            db.executemany("DELETE FROM checkpoint_flags WHERE path=?", [(p,) for p in paths])
        self.kept -= set(paths)

    async def delete(self, peer: Peer, params: DeleteParams) -> dict[str, Any]:
        run = await self.run(params.run)
        ckpt = run.by_step(params.step)
        if ckpt.in_use:
            raise RemoteError(ErrorCode.CONFLICT, f"checkpoint {ckpt.step} of {run.name} is in use: {ckpt.in_use}")
        special = [w for w, flag in (("the best", ckpt.is_best), ("the newest", ckpt.newest)) if flag]
        if special and not params.confirm_special:
            raise RemoteError(ErrorCode.CONFLICT, f"checkpoint {ckpt.step} is {' and '.join(special)} of run {run.name}; "
                              "confirm to delete it anyway (confirm_special / --force)", {"special": special})
        try:
            await asyncio.to_thread(self._delete_path, run, ckpt)
        except OSError as exc:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"cannot delete {ckpt.path}: {exc.strerror or exc}") from None
        self._forget([ckpt.path])
        self._event(run, ckpt, "delete", peer.who, {"size_bytes": ckpt.size_bytes, "special": special})
        log.info("%s deleted %s", peer.who, ckpt.path)
        await self.rescan()
        return {"run": run.name, "deleted": [ckpt.to_json()], "freed_bytes": ckpt.size_bytes}

    async def prune(self, peer: Peer, params: PruneParams) -> dict[str, Any]:
        run = await self.run(params.run)
        complete = [c for c in run.checkpoints if c.complete]
        last = {c.path for c in complete[-params.keep_last:]} if params.keep_last else set()
        kept, deleted, skipped = [], [], []
        for ckpt in run.checkpoints:
            if not ckpt.complete:
                skipped.append({**ckpt.to_json(), "reason": f"incomplete: {ckpt.problem}; delete it by hand if it is garbage"})
            elif ckpt.is_best or ckpt.path in last or ckpt.kept:
                kept.append({**ckpt.to_json(), "reason": "best" if ckpt.is_best else "kept" if ckpt.kept else "last"})
            elif ckpt.in_use:
                skipped.append({**ckpt.to_json(), "reason": ckpt.in_use})
            else:
                try:
                    await asyncio.to_thread(self._delete_path, run, ckpt)
                except OSError as exc:
                    skipped.append({**ckpt.to_json(), "reason": f"cannot delete: {exc.strerror or exc}"})
                    continue
                deleted.append(ckpt.to_json())
        self._forget([c["path"] for c in deleted])
        freed = sum(c["size_bytes"] for c in deleted)
        self._event(run, None, "prune", peer.who, {"keep_last": params.keep_last, "deleted": [c["step"] for c in deleted], "freed_bytes": freed})
        log.info("%s pruned run %s: deleted steps %s", peer.who, run.name, [c["step"] for c in deleted])
        await self.rescan()
        return {"run": run.name, "keep_last": params.keep_last, "deleted": deleted, "kept": kept, "skipped": skipped, "freed_bytes": freed}

    async def keep(self, peer: Peer, params: KeepParams) -> dict[str, Any]:
        run = await self.run(params.run)
        ckpt = run.by_step(params.step)
        with self.agent.store.transaction() as db:
            db.execute("INSERT OR REPLACE INTO checkpoint_flags (path, kept, t) VALUES (?, ?, ?)", (ckpt.path, int(params.kept), time.time()))
        (self.kept.add if params.kept else self.kept.discard)(ckpt.path)
        self._event(run, ckpt, "keep" if params.kept else "unkeep", peer.who)
        await self.rescan()
        return self.runs[run.name].by_step(ckpt.step).to_json()

    async def _complete(self, run_name: str, step: int):
        """The run and its checkpoint at `step`, which must be complete to be acted on."""
        run = await self.run(run_name)
        ckpt = run.by_step(step)
        if not ckpt.complete:
            raise RemoteError(ErrorCode.CONFLICT, f"checkpoint {ckpt.step} of {run.name} is incomplete ({ckpt.problem}); pick a complete one")
        return run, ckpt

    async def resume(self, peer: Peer, params: ResumeParams) -> dict[str, Any]:
        run, ckpt = await self._complete(params.run, params.step)
        jobs = self._jobs()
        recipe = next((r for r in self.agent.lab.trainers if r.name == run.recipe and r.machine == self.agent.machine.name), None)
        if jobs is None or recipe is None:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"run {run.name} was not started from a recipe of {self.agent.machine.name}; "
                              f"resume it with its own trainer (--resume-from-checkpoint {ckpt.path})")
        if not any(p.name == RESUME_PARAM for p in recipe.params):
            raise RemoteError(ErrorCode.UNAVAILABLE, f"recipe {recipe.name} declares no {RESUME_PARAM} param; add "
                              f"{{name: {RESUME_PARAM}, type: str}} to its params in lab.yaml (cetlab-train takes --resume-from-checkpoint)")
        previous = jobs.get(run.job).params if run.job else {}
        values = {**{k: v for k, v in previous.items() if k != RESUME_PARAM}, **params.params, RESUME_PARAM: ckpt.path}
        job = jobs.start_job(recipe.name, values)
        self._event(run, ckpt, "resume", peer.who, {"job": job.id})
        log.info("%s resumed run %s from step %s as job %s", peer.who, run.name, ckpt.step, job.id)
        return {**job.to_json(self.agent.simulated), "argv": job.argv, "resumed_from": ckpt.to_json()}

    async def serve(self, peer: Peer, params: ServeParams) -> dict[str, Any]:
        run, ckpt = await self._complete(params.run, params.step)
        orchestra = self._orchestra()
        if orchestra is None:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"no model pool on {self.agent.machine.name}")
        named = orchestra._slot(params.model) if params.model else None
        if ckpt.kind == "adapter":
            target = named or self._compatible(orchestra, ckpt)
            if target is not None and target.model.engine in ADAPTER_ENGINES:
                return await self._load_adapter(peer, run, ckpt, target)
            base = str(named.path) if named is not None else ckpt.base_model
            if not base or not Path(base).is_dir():
                raise RemoteError(ErrorCode.UNAVAILABLE, f"the adapter's base model {base!r} is not a folder on {self.agent.machine.name}; "
                                  "name a warm model of the same base with --model")
            return self._start_runtime(peer, run, ckpt, orchestra, template=named, merge_base=base)
        if ckpt.kind == "full":
            return self._start_runtime(peer, run, ckpt, orchestra, template=named, merge_base=None)
        raise RemoteError(ErrorCode.UNAVAILABLE, f"checkpoint {ckpt.step} of {run.name} holds no model or adapter weights")

    def _compatible(self, orchestra: Any, ckpt: Checkpoint) -> Any:
        """A warm model that can load adapters at run time and has the adapter's base."""
        if not ckpt.base_model:
            return None
        base = Path(ckpt.base_model).resolve()
        for slot in orchestra.slots.values():
            if slot.state == "warm" and slot.model.engine in ADAPTER_ENGINES and slot.path.resolve() == base:
                return slot
        return None

    async def _load_adapter(self, peer: Peer, run: Run, ckpt: Checkpoint, slot: Any) -> dict[str, Any]:
        from agents.orchestra.engine import EngineDown, EngineRequestFailed

        if slot.state != "warm" or slot.engine is None:
            raise RemoteError(ErrorCode.CONFLICT, f"{slot.name} is {slot.state}; warm it first (`cetlab warm {slot.name}`), then serve the adapter")
        name = _safe_name(f"{run.name}-step{ckpt.step}")
        try:
            await slot.engine.load_adapter(name, ckpt.path)
        except (EngineDown, EngineRequestFailed) as exc:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"{slot.name} refused the adapter: {exc}") from None
        self.serving[ckpt.path] = {"model": slot.name, "mode": "adapter", "state": "warm", "engine": slot.engine, "adapter": name}
        self._event(run, ckpt, "serve", peer.who, {"model": slot.name, "mode": "adapter", "adapter": name})
        await self.rescan()
        base_matches = ckpt.base_model is not None and Path(ckpt.base_model).resolve() == slot.path.resolve()
        return {"run": run.name, "step": ckpt.step, "mode": "adapter", "model": slot.name, "served_name": name,
                "endpoint": slot.engine.endpoint, "state": "warm", "base_matches": base_matches, "simulated": slot.model.engine == "sim"}

    def _start_runtime(self, peer: Peer, run: Run, ckpt: Checkpoint, orchestra: Any, template: Any, merge_base: str | None) -> dict[str, Any]:
        """A new model entry for this checkpoint (weights as they are, or the adapter merged into its base), warmed in the background."""
        from agents.orchestra.pool import Slot

        name = _safe_name(f"{run.name}-step{ckpt.step}")
        existing = orchestra.slots.get(name)
        if any(m.name == name for m in self.agent.lab.models):
            raise RemoteError(ErrorCode.CONFLICT, f"lab.yaml already has a model named {name}; rename the run's folder or that model")
        if existing is not None and (existing.state in UP or existing.busy):
            return self._runtime_json(run, ckpt, existing, "merged" if merge_base else "full")
        record = self.serving.get(ckpt.path)
        if record is not None and record["state"] == "merging":
            return {"run": run.name, "step": ckpt.step, "mode": record["mode"], "model": name, "state": "merging", "endpoint": None}
        # --model lends its engine, GPUs and VRAM estimate; else `transformers serve` on the CPU
        engine = template.model.engine if template is not None else "transformers"
        gpus = list(template.model.gpus) if template is not None else []
        weights = Path(ckpt.path) if merge_base is None else self.agent.state_dir / "checkpoints" / "merged" / name
        model = Model(name=name, path=str(weights), engine=engine, machine=self.agent.machine.name, gpus=gpus,
                      vram_gib=template.model.vram_gib if template is not None else 0.0,
                      args=list(template.model.args) if template is not None else [])
        mode = "merged" if merge_base else "full"
        self.serving[ckpt.path] = {"model": name, "mode": mode, "state": "merging" if merge_base else "loading"}

        async def bring_up() -> None:
            try:
                if merge_base is not None:  # merged anew each time: the checkpoint may have been rewritten since
                    await self._merge(merge_base, ckpt.path, weights)
                slot = Slot(model, weights, gpus)
                orchestra.slots[name] = slot
                self.serving[ckpt.path]["state"] = "loading"
                task = orchestra.warm(slot)
                if task is not None:
                    await task
                self.serving[ckpt.path]["state"] = slot.state
                if slot.state == "failed":
                    self.serving[ckpt.path]["error"] = (slot.error or {}).get("message")
            except (RemoteError, RuntimeError, OSError) as exc:
                self.serving[ckpt.path].update(state="failed", error=str(exc))
                log.warning("serving %s failed: %s", ckpt.path, exc)
                self.agent.notify(EVENT_NOTICE, {"level": "error", "message": f"serving {run.name} step {ckpt.step} failed: {exc}"})

        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(asyncio.create_task(bring_up(), name=f"serve-{name}"))
        self._event(run, ckpt, "serve", peer.who, {"model": name, "mode": mode, "engine": engine})
        return {"run": run.name, "step": ckpt.step, "mode": mode, "model": name, "engine": engine,
                "state": self.serving[ckpt.path]["state"], "endpoint": None, "simulated": engine == "sim"}

    def _runtime_json(self, run: Run, ckpt: Checkpoint, slot: Any, mode: str) -> dict[str, Any]:
        return {"run": run.name, "step": ckpt.step, "mode": mode, "model": slot.name, "engine": slot.model.engine, "state": slot.state,
                "endpoint": slot.engine.endpoint if slot.engine else None, "simulated": slot.model.engine == "sim"}

    async def _merge(self, base: str, adapter: str, out: Path) -> None:
        """peft merge_and_unload in a child process: torch stays out of the agent."""
        out.parent.mkdir(parents=True, exist_ok=True)
        code = "import sys; from agents.checkpoints import merge_adapter; merge_adapter(*sys.argv[1:])"
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, base, adapter, str(out), stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        output, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"merging the adapter into {base} failed: {output.decode(errors='replace').strip()[-300:]}")

    # -- RPC

    def _register(self) -> None:
        rpc = self.agent.rpc

        @rpc.method("checkpoints.runs", doc="Every run with checkpoints on this machine: counts, best, disk, save-time share.")
        async def runs(peer: Peer, _params) -> list:
            await self.rescan()
            return self._section

        @rpc.method("checkpoints.list", params=RunParams, doc="One run's checkpoints (oldest first) and its loss curves.")
        async def list_(peer: Peer, params: RunParams) -> dict:
            run = await self.run(params.run)
            return {**run.summary(self.agent.machine.name), "checkpoints": [c.to_json() for c in run.checkpoints], "curves": run.curves()}

        # The actions are methods of this component with the handler signature (peer, params).
        rpc.method("checkpoints.resume", role=Role.OPERATOR, params=ResumeParams, doc="A new job of the run's recipe, resuming from this checkpoint.")(self.resume)
        rpc.method("checkpoints.serve", role=Role.OPERATOR, params=ServeParams, doc="Serve a checkpoint: adapter into a warm model, or as a new model.")(self.serve)
        rpc.method("checkpoints.delete", role=Role.OPERATOR, params=DeleteParams, doc="Delete one checkpoint (the best or newest only with confirm_special).")(self.delete)
        rpc.method("checkpoints.keep", role=Role.OPERATOR, params=KeepParams, doc="Mark a checkpoint kept (prune never deletes it), or un-keep it.")(self.keep)
        rpc.method("checkpoints.prune", role=Role.OPERATOR, params=PruneParams, doc="Delete all but the best, the last N and the kept checkpoints.")(self.prune)
