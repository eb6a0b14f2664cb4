"""Finding runs: folders holding checkpoint-<step> folders, named uniquely, with their trainer's save reports."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from agents.checkpoints.parsing import CHECKPOINT_RE, Checkpoint, mark_best, read_checkpoint
from agents.jobs.port import JobView
from agents.wire.documents import BadDocument, Progress, load_progress
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.checkpoints import RunSummary
from agents.wire.sections.jobs import CheckpointReport
from agents.wire.states import JobState

log = logging.getLogger("cetlab.checkpoints")

CURVE_POINTS = 500  # loss points per curve sent to consoles
NAME_CHARS = 64
# Joins a run's name to its rank among folders of the same name. safe_name never writes it, so
# a suffixed name can equal no other folder's name: names are unique by construction.
RANK_MARK = "~"


@dataclass
class Run:
    name: str
    path: Path
    job: str | None = None
    recipe: str | None = None
    job_state: JobState | None = None
    wall_s: float | None = None
    problem: str | None = None  # its progress.json is bad
    link: Path | None = None  # the watched folder's entry when it is a symlink to this run (delete and prune refuse it)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    live_loss: list[list[int | float]] = field(default_factory=list)  # the job's loss beyond its newest checkpoint

    def by_step(self, step: int) -> Checkpoint:
        for ckpt in self.checkpoints:
            if ckpt.step == step:
                return ckpt
        steps = ", ".join(str(c.step) for c in self.checkpoints) or "none"
        raise RemoteError(ErrorCode.NOT_FOUND, f"run {self.name} has no checkpoint at step {step} (steps: {steps})")

    def summary(self, machine: str) -> RunSummary:
        complete = [c for c in self.checkpoints if c.complete]
        best = next((c for c in complete if c.is_best), None)
        saves = [c.save_s for c in complete if c.save_s is not None]
        save_total = round(sum(saves), 3) if saves else None
        return RunSummary(
            run=self.name,
            machine=machine,
            path=str(self.path),
            job=self.job,
            recipe=self.recipe,
            job_state=self.job_state,
            count=len(complete),
            incomplete=len(self.checkpoints) - len(complete),
            newest_step=complete[-1].step if complete else None,
            best_step=best.step if best else None,
            best_loss=(best.eval_loss if best.eval_loss is not None else best.loss) if best else None,
            disk_bytes=sum(c.size_bytes for c in self.checkpoints),
            save_s_total=save_total,
            wall_s=self.wall_s,
            save_share_pct=round(100 * save_total / self.wall_s, 2) if save_total is not None and self.wall_s else None,
            problem=self.problem,
            in_use=[f"step {c.step}: {c.in_use}" for c in self.checkpoints if c.in_use],
        )

    def curves(self) -> dict[str, list[list[int | float]]]:
        """The run's loss and eval-loss curves: the newest complete checkpoint's history, then the live job's."""
        source = next((c for c in reversed(self.checkpoints) if c.complete and c.loss_points), None)
        loss = list(source.loss_points) if source else []
        evals = list(source.eval_points) if source else []
        last = loss[-1][0] if loss else -1
        loss += [p for p in self.live_loss if p[0] > last]
        step = max(1, -(-len(loss) // CURVE_POINTS))
        return {"loss": loss[::step] if step == 1 else loss[::step] + [loss[-1]], "eval_loss": evals[-CURVE_POINTS:]}


def checkpoint_dirs(folder: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(folder) if CHECKPOINT_RE.match(e.name) and e.is_dir()]
    except OSError:
        return []


def folder_step(folder: Path) -> int:
    """The step of a checkpoint-<step> folder (one checkpoint_dirs found)."""
    match = CHECKPOINT_RE.match(folder.name)
    return int(match.group(2)) if match else -1


def safe_name(text: str) -> str:
    """A name made of letters, digits and . _ - (never starting or ending with a mark), at most NAME_CHARS long."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")[:NAME_CHARS].strip("-._")
    return name or "run"


def unique_names(wanted: list[str]) -> list[str]:
    """The names, in order, with the second and later of a repeated name ranked: "exp", "exp~2", "exp~3".

    One pass, no search: a ranked name holds RANK_MARK, which no wanted name does (they are safe_name's)."""
    seen: dict[str, int] = {}
    names = []
    for name in wanted:
        seen[name] = seen.get(name, 0) + 1
        names.append(name if seen[name] == 1 else f"{name}{RANK_MARK}{seen[name]}")
    return names


class Scanner:
    """Walks the watched folders; keeps what it parsed so an unchanged checkpoint is not read again."""

    def __init__(self, settle_s: float):
        self.settle_s = settle_s
        self._cache: dict[str, tuple[int, float, Checkpoint]] = {}  # path -> (folder mtime_ns, read at, parsed)
        self._progress: dict[str, tuple[float, Progress | None, str | None]] = {}  # progress.json -> (mtime, doc, problem)

    def scan(self, roots: list[tuple[Path, str | None]], jobs: dict[Path, JobView], kept: set[str], now: float) -> dict[str, Run]:
        """Every run under the roots (runs in a thread: it reads no live state, only its arguments)."""
        found: dict[Path, str | None] = {}
        links: dict[Path, Path] = {}
        for root, recipe in roots:
            root = root.resolve()
            if checkpoint_dirs(root):
                found.setdefault(root, recipe)
                continue
            try:
                subdirs = [Path(e.path) for e in os.scandir(root) if e.is_dir()]
            except OSError:
                continue
            for sub in subdirs:
                if checkpoint_dirs(sub):
                    found.setdefault(sub.resolve(), recipe)
                    if sub.is_symlink():
                        links.setdefault(sub.resolve(), sub)
        paths = sorted(found)
        names = unique_names(
            [safe_name(jobs[p].id if p in jobs else links.get(p, p).name) for p in paths]
        )  # a link: the name it has here
        runs: dict[str, Run] = {}
        seen: set[str] = set()
        for path, name in zip(paths, names):
            job = jobs.get(path)
            run = Run(
                name=name,
                path=path,
                job=job.id if job else None,
                recipe=job.recipe if job else found[path],
                job_state=job.state if job else None,
                link=links.get(path),
            )
            reports = self._reports(run, job)
            for folder in sorted(checkpoint_dirs(path), key=lambda p: (folder_step(p), p.name)):
                seen.add(str(folder))
                report = reports.get(str(folder))
                ckpt = self._read(run.name, folder, now, report is not None)
                ckpt.kept = str(folder) in kept
                if report is not None and report.save_s is not None:
                    ckpt.save_s, ckpt.save_s_from = round(report.save_s, 3), "trainer"
                run.checkpoints.append(ckpt)
            mark_best(run.checkpoints)
            run.wall_s = self._wall_s(path, job, now)
            if job is not None:
                run.live_loss = [list(p) for p in job.loss_points]
            runs[name] = run
        self._cache = {k: v for k, v in self._cache.items() if k in seen}
        return runs

    def forget(self, path: str) -> None:
        self._cache.pop(path, None)

    def _read(self, run: str, folder: Path, now: float, reported: bool) -> Checkpoint:
        """Parse again only when the folder changed or may still be changing."""
        try:
            stat = folder.stat()
        except OSError:
            return Checkpoint(run=run, step=-1, path=str(folder), complete=False, problem="removed while being read")
        cached = self._cache.get(str(folder))
        # a folder read while young may still be written to in place, which its mtime does not show
        written_at = cached[2].written_at if cached is not None else None
        if (
            cached is not None
            and written_at is not None
            and cached[0] == stat.st_mtime_ns
            and cached[1] - written_at >= self.settle_s
        ):
            ckpt = cached[2]
        else:
            ckpt = read_checkpoint(run, folder, self.settle_s, now, reported)
            self._cache[str(folder)] = (stat.st_mtime_ns, now, ckpt)
        return ckpt.model_copy(update={"run": run})

    def _run_progress(self, path: Path) -> tuple[Progress | None, str | None]:
        """<run>/progress.json (a run cetlab did not start), read again when it changed; a bad one is a problem, not an error."""
        progress = path / "progress.json"
        try:
            mtime = progress.stat().st_mtime
        except OSError:
            return None, None
        cached = self._progress.get(str(progress))
        if cached is None or cached[0] != mtime:
            try:
                cached = (mtime, load_progress(progress), None)
            except BadDocument as exc:
                log.warning("%s", exc)
                cached = (mtime, None, str(exc))
            self._progress[str(progress)] = cached
        return cached[1], cached[2]

    def _reports(self, run: Run, job: JobView | None) -> dict[str, CheckpointReport]:
        """The trainer's own save reports by checkpoint path: the job's progress, else <run>/progress.json."""
        entries = list(job.reports) if job is not None else []
        doc, run.problem = self._run_progress(run.path)
        if doc is not None:
            entries += doc.checkpoints
        return {e.path: e for e in entries}

    def _wall_s(self, path: Path, job: JobView | None, now: float) -> float | None:
        if job is not None:
            return round(max(0.0, (job.ended_at or now) - job.started_at), 1)
        doc, _ = self._run_progress(path)
        return doc.elapsed_s if doc is not None else None
