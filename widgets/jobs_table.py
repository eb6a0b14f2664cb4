"""Training runs as a live table: one row per job, loss sparkline, figures updated cell by cell."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from agents.wire.sections.jobs import JobInfo
from agents.wire.states import JOB_ACTIVE, JobState
from widgets.format import NA, fmt, fmt_duration, machines_text, spark
from widgets.live_table import Cells, LiveTable

STATE_STYLES = {
    JobState.STARTING: "yellow",
    JobState.RUNNING: "bold green",
    JobState.STOPPING: "bold yellow",
    JobState.EXITED: "dim",
    JobState.FAILED: "bold red",
    JobState.LOST: "bold magenta",
}
SPARK_WIDTH = 8
COLUMNS = [
    ("job", "JOB", 8),
    ("recipe", "RECIPE", 12),
    ("machine", "MACHINE", 10),
    ("gpus", "GPUS", 11),
    ("precision", "PREC", 4),
    ("state", "STATE", 11),  # "failed(137)"; a badge (GPU starved, re-adopted) is cut before LOSS goes
    ("step", "STEP", 14),  # "1230/100000 1%"
    ("loss", "LOSS", SPARK_WIDTH + 8),
    ("speed", "SAMPLES/S", 9),
    ("eta", "ETA", 7),
    ("elapsed", "ELAPSED", 8),
]
# narrow: these go, in this order (100 columns keep the recipe, where a job runs, its loss and ETA, 80 all but the recipe;
# 160 every column)
DROP = ("precision", "gpus", "elapsed", "speed", "recipe", "eta", "loss", "machine")


def state_cell(job: JobInfo, offline: bool = False) -> Text:
    state = job.state
    text = Text(state, style=STATE_STYLES.get(state, ""))
    if state in (JobState.EXITED, JobState.FAILED) and job.exit_code is not None:
        text.append(f"({job.exit_code})", style=STATE_STYLES[state])
    if job.starved:
        text.append(" GPU starved", style="bold black on yellow")
    if job.adopted and state in JOB_ACTIVE:
        text.append(" re-adopted", style="italic dim")
    if offline:
        text.append(" (agent offline)", style="italic red")
    return text


def step_cell(job: JobInfo) -> str:
    if job.step is None:
        return NA
    return f"{job.step}/{job.max_steps} {job.step / job.max_steps:.0%}" if job.max_steps else str(job.step)


def loss_cell(job: JobInfo) -> Text:
    history = [v for v in job.loss_history if v is not None]
    text = Text(spark(history, SPARK_WIDTH, lo=min(history, default=0.0)) if history else " " * SPARK_WIDTH, style="cyan")
    text.append(" " + fmt(job.loss, ".4f"))
    return text


def job_cells(job: JobInfo, offline: bool = False) -> tuple[Any, ...]:
    """The row of one job (its typed section in, Rich text out); `offline`: its agent is not reachable now."""
    gpus = ",".join(map(str, job.gpus)) or NA
    return (
        Text(job.id, style="bold"),
        job.recipe,
        machines_text(job.machine, [node.machine for node in job.nodes]),  # a multi-node job: every node
        Text.assemble(gpus, (" SIM", "bold magenta") if job.simulated and job.gpus else ""),
        job.precision or NA,
        state_cell(job, offline),
        step_cell(job),
        loss_cell(job),
        fmt(job.samples_per_s, ".1f"),
        fmt_duration(job.eta_s) if job.state in JOB_ACTIVE else NA,
        fmt_duration(job.elapsed_s),
    )


class JobsTable(LiveTable):
    """Give it the jobs (the typed jobs sections); rows are keyed by job id, newest first."""

    DEFAULT_CSS = "JobsTable { height: 1fr; }"
    COLUMNS = COLUMNS
    DROP = DROP

    offline: frozenset[str] = frozenset()  # machines whose agent is not reachable now: their jobs say so

    def cells(self, item: JobInfo) -> Cells:
        return job_cells(item, item.machine in self.offline)

    def show_jobs(self, jobs: list[JobInfo], offline: frozenset[str] = frozenset()) -> None:
        self.offline = offline
        # a node of a multi-node job is shown in its coordinator's row (nodes), not as a row of its own
        self.show({job.id: job for job in sorted(jobs, key=lambda job: -job.started_at) if not job.node_rank})
