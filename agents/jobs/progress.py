"""A job's progress, taken in from its trainer's progress file and newest checkpoint; a bad document is reported on the job."""

from __future__ import annotations

import logging
from pathlib import Path

from agents.jobs.job import Job
from agents.wire.documents import BadDocument, load_progress, load_trainer_state
from agents.wire.sections.jobs import CheckpointReport

log = logging.getLogger("cetlab.jobs")

LOSS_POINTS = 120  # loss history kept per job, for the sparkline


def update_progress(job: Job, raw: bytes | OSError | None = None) -> bool:
    """Take in the trainer's progress file (or what reading it off the loop gave, `raw`); a bad one is reported on
    the job, never raised."""
    try:
        doc = load_progress(Path(job.job_dir) / "progress.json", raw)
    except BadDocument as exc:
        return _progress_problem(job, str(exc))
    previous = job.progress
    if doc is None or (previous is not None and doc.updated_at == previous.updated_at):
        return False
    job.progress = doc.kept()
    job.progress_problem = None
    _diverged(job, doc.diverged_step)
    points = dict(job.loss_points)
    if doc.loss is not None and doc.step is not None and (previous is None or doc.loss != previous.loss):
        points[doc.step] = round(doc.loss, 5)  # a new logged loss, seen at this tick's step
    newest = doc.checkpoints[-1] if doc.checkpoints else None
    if newest is not None and (previous is None or not previous.checkpoints or newest != previous.checkpoints[-1]):
        points = _points_from_checkpoint(job, newest, points)
    job.loss_points = [(s, points[s]) for s in sorted(points)][-LOSS_POINTS:]
    return True


def _points_from_checkpoint(job: Job, newest: CheckpointReport, points: dict[int, float]) -> dict[int, float]:
    """The newest checkpoint's log_history has every logged step up to it, at its true step."""
    try:
        state = load_trainer_state(Path(newest.path) / "trainer_state.json")
    except BadDocument as exc:
        _progress_problem(job, str(exc))
        return points
    if state is None:
        return points
    if state.diverged_at_step is not None:
        _diverged(job, state.diverged_at_step)
    rows = {r.step: round(r.loss, 5) for r in state.log_history if r.step is not None and r.loss is not None}
    if not rows:
        return points
    return {**{s: v for s, v in points.items() if s > newest.step}, **rows}


def _progress_problem(job: Job, problem: str) -> bool:
    if job.progress_problem == problem:
        return False
    log.warning("job %s: %s", job.id, problem)
    job.progress_problem = problem
    return True


def _diverged(job: Job, step: int | None) -> None:
    if job.diverged_at_step is None and step is not None:
        job.diverged_at_step = step
        log.warning("job %s: loss is NaN or infinite: the run diverged at step %s", job.id, step)
