"""The Checkpoints view (`:checkpoints`): a run's loss with a marker per checkpoint; resume, serve, delete, keep and prune by key."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Static

from agents.wire.catalogue.checkpoints import (
    CHECKPOINTS_DELETE,
    CHECKPOINTS_KEEP,
    CHECKPOINTS_LIST,
    CHECKPOINTS_PRUNE,
    CHECKPOINTS_SERVE,
    Curves,
    DeleteParams,
    KeepParams,
    PruneParams,
    RunCheckpoints,
    RunParams,
    ServeParams,
)
from agents.wire.catalogue.jobs import JOBS_GET, JOBS_RECIPES, JobParams
from agents.wire.catalogue.method import Method, request
from agents.wire.protocol import RemoteError
from agents.wire.sections.checkpoints import CheckpointInfo, RunSummary
from agents.wire.sections.jobs import JobDetail
from agents.wire.served import is_served, serve_failed, serve_moving
from agents.wire.states import JOB_ACTIVE
from console.lab.runs import RunKey, one_row_per_run
from console.tui.screens.base import LabScreen
from console.tui.screens.modals import AskNumberScreen, ResumeJobScreen
from widgets.checkpoint_timeline import CheckpointTimeline
from widgets.format import NA, fmt, fmt_bytes, fmt_duration, fmt_secs, plural
from widgets.lab_header import LabHeader
from widgets.live_table import LiveTable
from widgets.wire import esc, shown

ACTIVE_REFETCH_S = (
    3.0  # while the run's job trains or one of its checkpoints is being served, its listing is fetched again this often
)
COLUMNS = [
    ("step", "STEP", 7),
    ("epoch", "EPOCH", 6),
    ("loss", "LOSS", 8),
    ("eval", "EVAL", 8),
    ("size", "SIZE", 7),
    ("save", "SAVE", 7),
    ("kind", "KIND", 17),
    ("age", "WRITTEN", 12),
    ("flags", "", None),  # what is left: a fixed 60 ran past 80 columns (a sideways scrollbar on the empty row)
]
DROP = ("epoch", "save", "kind", "eval", "size")  # narrow: these go, in this order
FLAGS_MIN = 30  # BEST newest kept and a served model's name: the columns above go before these are cut
P = TypeVar("P", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)


def loss_text(value: float | None) -> str:
    return fmt(value, ".4f")


def flags_text(ckpt: CheckpointInfo) -> Text:
    text = Text()
    for label, on, style in (
        ("BEST", ckpt.is_best, "bold green"),
        ("newest", ckpt.newest, "bold"),
        ("kept", ckpt.kept, "magenta"),
    ):
        if on:
            text.append(f"{label} ", style=style)
    serving = ckpt.serving
    if serving is not None and is_served(serving):
        text.append(f"served:{serving.model} ({serving.state}) ", style="cyan")
    elif serving is not None and serve_failed(serving):
        text.append(f"serve-failed:{serving.model} ", style="red")
    if not ckpt.complete:
        text.append(f"INCOMPLETE: {ckpt.problem}", style="bold red")
    return text


def checkpoint_cells(ckpt: CheckpointInfo, now: float) -> tuple[Any, ...]:
    kind = ckpt.kind + ("+optimizer" if ckpt.has_optimizer else "")
    save = NA if ckpt.save_s is None else f"{ckpt.save_s:.2f}s" + ("" if ckpt.save_s_from == "trainer" else "~")
    age = NA if ckpt.written_at is None else fmt_duration(max(0.0, now - ckpt.written_at)) + " ago"
    return (
        Text(str(ckpt.step), style="bold" if ckpt.is_best else ""),
        fmt(ckpt.epoch, ".2f"),
        loss_text(ckpt.loss),
        loss_text(ckpt.eval_loss),
        fmt_bytes(ckpt.size_bytes),
        save,
        kind,
        age,
        flags_text(ckpt),
    )


def serving_moves(checkpoints: list[CheckpointInfo]) -> bool:
    """Whether a checkpoint of this listing is on its way to being served (its state will change without the run's)."""
    return any(serve_moving(c.serving) for c in checkpoints)


def run_line(run: RunSummary, index: int, total: int) -> str:
    share = f" ({run.save_share_pct:.2f}% of {fmt_duration(run.wall_s)})" if run.save_share_pct is not None else ""
    job = f" · job {esc(run.job)} ({esc(run.job_state)})" if run.job else " · not started by cetlab"
    return (
        f"[b]{esc(run.run)}[/b] on {esc(run.machine)}{job} · {plural(run.count, 'checkpoint')}"
        + (f" + [red]{run.incomplete} incomplete[/]" if run.incomplete else "")
        + f" · {fmt_bytes(run.disk_bytes)} on disk · saves {fmt_secs(run.save_s_total)}{share}"
        + f"   [dim]run {index + 1}/{total}: [ ] to switch[/]"
    )


def detail_text(ckpt: CheckpointInfo | None) -> str:
    if ckpt is None:
        return ""
    lines = [f"[b]step {esc(ckpt.step)}[/b] · {esc(ckpt.path)}"]
    save_from = {"trainer": "reported by the trainer", "file_times": "from file times"}.get(ckpt.save_s_from or "", "")
    if ckpt.save_s is not None:
        lines[0] += f" · saved in {ckpt.save_s:.2f}s ({save_from})"
    if ckpt.problem:
        lines.append(f"[b red]incomplete:[/] {esc(ckpt.problem)} (never deleted automatically; ctrl+d deletes it)")
    if ckpt.in_use:
        lines.append(f"[b yellow]in use:[/] {esc(ckpt.in_use)}")
    serving = ckpt.serving
    if serving is not None:
        lines.append(
            esc(
                f"serving: {serving.mode} on model {serving.model}, {serving.state}"
                + (f": {serving.error}" if serving.error else "")
            )
        )
    return "\n".join(lines)


class CheckpointsScreen(LabScreen):
    VIEW_NAME = "checkpoints"
    SECTIONS = ("checkpoints", "link")  # redrawn only when these change
    CLOCK_S = 1.0  # "written ... ago"
    ACTING = frozenset({"resume", "serve", "delete", "keep", "prune"})
    BINDINGS = [
        Binding("r", "resume", "Resume"),
        Binding("v", "serve", "Serve"),
        Binding("ctrl+d", "delete", "Delete"),  # destructive: not a bare letter
        Binding("p", "keep", "Keep"),  # p as in pin: prune leaves it (k moves up, as everywhere)
        Binding("P", "prune", "Prune"),
        Binding("right_square_bracket", "next_run(1)", "Next run"),
        Binding("left_square_bracket", "next_run(-1)", "Prev run", show=False),
    ]
    DEFAULT_CSS = """
    CheckpointsScreen #ckpt-run { height: auto; padding: 0 1; }
    CheckpointsScreen #ckpt-timeline { height: 2fr; min-height: 8; }
    CheckpointsScreen #ckpt-table { height: 1fr; min-height: 6; }  /* at 80x24 five rows, not one */
    CheckpointsScreen #ckpt-detail { height: auto; min-height: 2; padding: 0 1; border-top: solid $panel; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.run_key: tuple[str, str] | None = None  # (machine, run) shown
        self.detail: RunCheckpoints | None = None  # checkpoints.list of the shown run
        self._fetched: tuple[Any, float] | None = None  # (summary it was fetched for, when)

    def compose(self) -> ComposeResult:
        yield LabHeader()
        yield Static(
            "no runs with checkpoints yet: start one with `cetlab train` or point lab.yaml checkpoints.dirs at your runs",
            id="ckpt-run",
        )
        yield CheckpointTimeline(id="ckpt-timeline")
        yield LiveTable(
            COLUMNS, lambda ckpt: checkpoint_cells(ckpt, self.lab_app.clock()), DROP, rest_min=FLAGS_MIN, id="ckpt-table"
        )
        yield Static("", id="ckpt-detail")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_data()

    def table(self) -> LiveTable:
        return self.query_one("#ckpt-table", LiveTable)

    # -- data

    def runs(self) -> list[RunSummary]:
        runs = [run for view in self.lab_app.state.machines.values() for run in view.checkpoints]
        return one_row_per_run(runs, lambda r: RunKey(r.machine, r.run, r.job, r.count))  # a multi-node run once

    def summary(self) -> RunSummary | None:
        return next((r for r in self.runs() if self.run_key == (r.machine, r.run)), None)

    def show_run(self, machine: str, run: str) -> None:
        """Open this run (from another view, e.g. `c` on a job)."""
        if self.run_key != (machine, run):
            self.run_key, self.detail, self._fetched = (machine, run), None, None
        self.refresh_data()

    def refresh_data(self) -> None:
        runs = self.runs()
        if runs and self.run_key is None:
            active = [r for r in runs if r.job_state in JOB_ACTIVE]
            pick = (active or runs)[-1]
            self.run_key = (pick.machine, pick.run)
        summary = self.summary()
        if summary is None and self.run_key is not None:
            self.query_one("#ckpt-run", Static).update(
                shown(f"[b]{esc(self.run_key[1])}[/b] on {esc(self.run_key[0])}: no checkpoints yet   [dim][ ] to switch runs[/]")
            )
        if summary is not None:
            index = runs.index(summary)
            self.query_one("#ckpt-run", Static).update(shown(run_line(summary, index, len(runs))))
            moving = summary.job_state in JOB_ACTIVE or serving_moves(self.checkpoints)  # a serve changes no summary: ask again
            stale = (
                self._fetched is None
                or self._fetched[0] != summary
                or (moving and time.monotonic() - self._fetched[1] > ACTIVE_REFETCH_S)
            )
            if stale and self.lab_app.connect:
                self._fetched = (summary, time.monotonic())
                self.fetch_run(summary.machine, summary.run)
        self.render_detail()

    @work(exclusive=True, group="checkpoints-fetch")
    async def fetch_run(self, machine: str, run: str) -> None:
        try:
            detail = await request(self.lab_app.client, machine, CHECKPOINTS_LIST, RunParams(run=run))
        except RemoteError as exc:
            self.notify(exc.message, severity="warning")
            return
        if self.run_key == (machine, run):
            self.show_detail(detail)

    def show_detail(self, detail: RunCheckpoints) -> None:
        self.detail = detail
        self.render_detail()

    @property
    def checkpoints(self) -> list[CheckpointInfo]:
        """The shown run's checkpoints, oldest first."""
        return self.detail.checkpoints if self.detail is not None else []

    def render_detail(self) -> None:
        detail = self.detail
        table = self.table()
        checkpoints = self.checkpoints
        with self.app.batch_update():
            before = table.selected_key()
            table.show({str(c.step): c for c in checkpoints})
            if checkpoints and (before is None or before not in table.items):  # a run newly shown: the cursor on its best
                best = next((c for c in checkpoints if c.is_best), checkpoints[-1])
                table.select_key(str(best.step))
            selected = self.selected()
            curves = detail.curves if detail is not None else Curves()
            title = f"{detail.run}: loss by step, one marker per checkpoint" if detail else "no run shown"
            self.query_one(CheckpointTimeline).show(
                title, curves.loss, curves.eval_loss, checkpoints, selected.step if selected else None
            )
            self.query_one("#ckpt-detail", Static).update(shown(detail_text(selected)))

    def selected(self) -> CheckpointInfo | None:
        selected: CheckpointInfo | None = self.table().selected()
        return selected

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self.render_detail()

    def action_next_run(self, delta: int) -> None:
        runs = self.runs()
        if not runs:
            return
        summary = self.summary()
        index = (runs.index(summary) + delta) % len(runs) if summary in runs else 0
        self.show_run(runs[index].machine, runs[index].run)

    # -- actions

    def _target(self) -> tuple[str, str, CheckpointInfo] | None:
        ckpt = self.selected()
        if ckpt is None or self.run_key is None:
            self.notify("no checkpoint selected", severity="warning")
            return None
        return self.run_key[0], self.run_key[1], ckpt

    def _act_and_refetch(
        self, machine: str, method: Method[P, R], params: P, done: Callable[[R], str], timeout: float | None = None
    ) -> None:
        """Act, then fetch the listing again at once (it changed)."""
        self.act(machine, method, params, done, timeout=timeout, then=lambda _result: self._refetch())

    def _refetch(self) -> None:
        self._fetched = None
        self.refresh_data()

    def action_resume(self) -> None:
        target = self._target()
        if target is None:
            return
        machine, run, ckpt = target
        self.open_resume(machine, run, ckpt.step)

    @work(exclusive=True, group="checkpoints-resume")
    async def open_resume(self, machine: str, run: str, step: int) -> None:
        """The resume form: the run's recipe with the params it ran with, to change before the new job starts (as `--set` does)."""
        summary = self.summary()
        client = self.lab_app.client
        try:
            recipes = await request(client, machine, JOBS_RECIPES)
            previous = (
                (await request(client, machine, JOBS_GET, JobParams(id=summary.job))).params if summary and summary.job else {}
            )
        except RemoteError as exc:
            self.notify(exc.message, severity="warning")
            return
        recipe = next((r for r in recipes.root if summary is not None and r.name == summary.recipe), None)
        if recipe is None:
            self.notify(
                f"run {run} was not started from a recipe of {machine}: resume it with its own trainer", severity="warning"
            )
            return

        def resumed(job: JobDetail | None) -> None:
            if job:
                self.notify(f"resumed {run} from step {step} as job {job.id}")
                self._refetch()

        self.app.push_screen(ResumeJobScreen(recipe, machine, run, step, previous), resumed)

    def action_serve(self) -> None:
        target = self._target()
        if target is None:
            return
        machine, run, ckpt = target
        self._act_and_refetch(
            machine,
            CHECKPOINTS_SERVE,
            ServeParams(run=run, step=ckpt.step),
            lambda r: f"step {ckpt.step}: {r.mode} on model {r.model} ({r.state}); see :models",
            timeout=30.0,
        )

    def action_keep(self) -> None:
        target = self._target()
        if target is None:
            return
        machine, run, ckpt = target
        kept = not ckpt.kept
        self._act_and_refetch(
            machine,
            CHECKPOINTS_KEEP,
            KeepParams(run=run, step=ckpt.step, kept=kept),
            lambda r: f"step {ckpt.step} {'kept: prune leaves it' if kept else 'no longer kept'}",
        )

    def action_delete(self) -> None:
        target = self._target()
        if target is None:
            return
        machine, run, ckpt = target
        special = [w for w, on in (("the BEST", ckpt.is_best), ("the NEWEST", ckpt.newest)) if on]

        def delete() -> None:
            self._act_and_refetch(
                machine,
                CHECKPOINTS_DELETE,
                DeleteParams(run=run, step=ckpt.step, confirm_special=bool(special)),
                lambda r: f"deleted step {ckpt.step} of {run}, freed {fmt_bytes(r.freed_bytes)}",
            )

        first = (
            f"Delete checkpoint [b]{esc(ckpt.step)}[/b] of {esc(run)} ({fmt_bytes(ckpt.size_bytes)})? This removes its folder."
        )
        if special:
            second = f"Step {esc(ckpt.step)} is {' and '.join(special)} checkpoint of {esc(run)}. Really delete it?"
            self.confirm(first, lambda: self.confirm(second, delete))
        else:
            self.confirm(first, delete)

    def action_prune(self) -> None:
        if self.run_key is None:
            return
        machine, run = self.run_key

        def asked(n: int | None) -> None:
            if n is not None:
                self.confirm(
                    f"Prune [b]{esc(run)}[/b]: keep the best, the last {n} and the kept checkpoints, delete the rest?",
                    lambda: self._act_and_refetch(
                        machine,
                        CHECKPOINTS_PRUNE,
                        PruneParams(run=run, keep_last=n),
                        lambda r: f"pruned {run}: deleted {len(r.deleted)}, freed {fmt_bytes(r.freed_bytes)}",
                    ),
                )

        self.app.push_screen(
            AskNumberScreen(f"Prune {run}: how many of the newest checkpoints to keep (besides the best and the kept)?", 2), asked
        )
