"""Training runs as a live table: one row per job, loss sparkline, figures updated cell by cell."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from widgets.format import NA, fmt, fmt_duration, spark
from widgets.live_table import LiveTable

ACTIVE = ("starting", "running", "stopping")
STATE_STYLES = {
    "starting": "yellow",
    "running": "bold green",
    "stopping": "bold yellow",
    "exited": "dim",
    "failed": "bold red",
    "lost": "bold magenta",
}
SPARK_WIDTH = 16
COLUMNS = [
    ("job", "JOB", 8), ("recipe", "RECIPE", 14), ("machine", "MACHINE", 10), ("gpus", "GPUS", 11),
    ("state", "STATE", 32), ("step", "STEP", 13), ("loss", "LOSS", SPARK_WIDTH + 8), ("speed", "SAMPLES/S", 9),
    ("eta", "ETA", 7), ("elapsed", "ELAPSED", 8),
]


def state_cell(job: dict[str, Any]) -> Text:
    state = job["state"]
    text = Text(state, style=STATE_STYLES.get(state, ""))
    if state in ("exited", "failed") and job.get("exit_code") is not None:
        text.append(f"({job['exit_code']})", style=STATE_STYLES[state])
    if job.get("starved"):
        text.append(" GPU starved", style="bold black on yellow")
    if job.get("adopted") and state in ACTIVE:
        text.append(" re-adopted", style="italic dim")
    if job.get("offline"):
        text.append(" (agent offline)", style="italic red")
    return text


def step_cell(job: dict[str, Any]) -> str:
    step, total = job.get("step"), job.get("max_steps")
    if step is None:
        return NA
    return f"{step}/{total} {step / total:.0%}" if total else str(step)


def loss_cell(job: dict[str, Any]) -> Text:
    history = job.get("loss_history") or []
    loss = job.get("loss")
    text = Text(spark(history, SPARK_WIDTH, lo=min(history, default=0.0)) if history else " " * SPARK_WIDTH, style="cyan")
    text.append(" " + fmt(loss, ".4f"))
    return text


def job_cells(job: dict[str, Any]) -> tuple[Any, ...]:
    """The row of one job (plain data in, Rich text out)."""
    active = job["state"] in ACTIVE
    gpus = ",".join(map(str, job.get("gpus") or [])) or NA
    return (
        Text(job["id"], style="bold"),
        job["recipe"],
        job["machine"],
        Text.assemble(gpus, (" SIM", "bold magenta") if job.get("simulated") and job.get("gpus") else ""),
        state_cell(job),
        step_cell(job),
        loss_cell(job),
        fmt(job.get("samples_per_s"), ".1f"),
        fmt_duration(job.get("eta_s")) if active else NA,
        fmt_duration(job.get("elapsed_s")),
    )


class JobsTable(LiveTable):
    """Give it the jobs (dicts as `jobs.list` returns them); rows are keyed by job id, newest first."""

    DEFAULT_CSS = "JobsTable { height: 1fr; }"
    COLUMNS = COLUMNS

    def cells(self, item: dict[str, Any]) -> tuple:
        return job_cells(item)

    def show_jobs(self, jobs: list[dict[str, Any]]) -> None:
        self.show({job["id"]: job for job in sorted(jobs, key=lambda job: -job["started_at"])})
