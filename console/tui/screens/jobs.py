"""The Jobs view (`:jobs`): training runs live; start a recipe (n), stop (s), kill (ctrl+k), follow its log (l)."""

from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Static

from agents.wire.catalogue.jobs import JOBS_KILL, JOBS_RECIPES, JOBS_STOP, JobParams, RecipeInfo, StopParams
from agents.wire.catalogue.method import request_all
from agents.wire.sections.jobs import JobDetail, JobInfo
from agents.wire.states import JOB_ACTIVE, JobState
from console.lab.replies import Answers
from console.tui.screens.base import LabScreen
from console.tui.screens.checkpoints import CheckpointsScreen
from console.tui.screens.modals import AskNumberScreen, PickRecipeScreen, StartJobScreen
from widgets.format import machines_text
from widgets.jobs_table import JobsTable
from widgets.lab_header import LabHeader
from widgets.wire import esc, shown


def detail_text(job: JobInfo | None) -> str:
    if job is None:
        return "no jobs yet: [b]n[/b] starts a recipe from lab.yaml"
    # every string of the job is the agent's: shown as text (esc), never as markup
    params = " ".join(f"{esc(k)}={esc(v)}" for k, v in job.params.items())
    lines = [
        f"[b]{esc(job.id)}[/b] {esc(job.recipe)} on {esc(machines_text(job.machine, [n.machine for n in job.nodes]))}  {params}"
    ]
    figures = [f"precision {esc(job.precision)}"] if job.precision else []
    if job.learning_rate is not None:
        figures.append(f"lr {job.learning_rate:.3g}")
    if job.tokens_per_s is not None:
        figures.append(f"{job.tokens_per_s:.0f} tokens/s")
    if job.checkpoints:
        last = job.checkpoints[-1]
        figures.append(f"checkpoints {', '.join(str(c.step) for c in job.checkpoints)} (last save {last.save_s or 0:.2f}s)")
    if job.starved:
        figures.append(
            "[b black on yellow] GPU starved [/] its GPUs sit under the lab's starved_util_pct: check dataloader workers and I/O"
        )
    if job.simulated and job.gpus:
        figures.append("[b magenta]SIM[/] GPU figures")
    if figures:
        lines.append(" · ".join(figures))
    lines += [f"note: {esc(note)}" for note in job.notes]
    lines.append(f"[dim]log {esc(job.log_path)} · output {esc(job.output_dir)}[/]")
    lines += [
        f"node {i} [b]{esc(node.machine)}[/b] GPU {','.join(map(str, node.gpus)) or '-'}: {esc(node.state)}"
        + (f" ({node.exit_code})" if node.exit_code is not None else "")
        for i, node in enumerate(job.nodes)
    ]
    if job.state in (JobState.FAILED, JobState.LOST):
        lines.append(f"[b red]{esc(job.state)}:[/] {esc(job.error or '')}")
        lines += [f"[dim]{esc(line)}[/]" for line in job.last_lines[-3:]]
    return "\n".join(lines)


class JobsScreen(LabScreen):
    VIEW_NAME = "jobs"
    SECTIONS = ("jobs", "link")  # redrawn only when these change
    ACTING = frozenset({"new", "stop", "kill"})
    BINDINGS = [
        Binding("n", "new", "New run"),
        Binding("s", "stop", "Stop"),
        Binding("ctrl+k", "kill", "Kill"),  # k moves up, as everywhere: a slip must not kill a run
        Binding("l", "logs", "Logs"),
        Binding("c", "checkpoints", "Checkpoints"),
    ]
    DEFAULT_CSS = """
    JobsScreen #jobs-detail { height: auto; min-height: 3; padding: 0 1; border-top: solid $panel; }
    """

    def compose(self) -> ComposeResult:
        yield LabHeader()
        yield JobsTable(id="jobs-table")
        yield Static("", id="jobs-detail")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_data()

    def refresh_data(self) -> None:
        machines = self.lab_app.state.machines.values()
        table = self.query_one(JobsTable)
        with self.app.batch_update():
            table.show_jobs([job for view in machines for job in view.jobs], frozenset(v.name for v in machines if not v.online))
            self.query_one("#jobs-detail", Static).update(shown(detail_text(table.selected())))

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self.query_one("#jobs-detail", Static).update(shown(detail_text(self.query_one(JobsTable).selected())))

    def on_data_table_row_selected(self, _event: DataTable.RowSelected) -> None:  # enter on a row: its log
        self.action_logs()

    def selected(self) -> JobInfo | None:
        job = self.query_one(JobsTable).selected()
        if job is None:
            self.notify("no job selected", severity="warning")
        return job

    # -- actions

    def action_new(self) -> None:
        self.pick_recipe()

    @work(exclusive=True, group="jobs-recipes")
    async def pick_recipe(self) -> None:
        answers = Answers.of(await request_all(self.lab_app.client, self.lab_app.state.machines, JOBS_RECIPES))
        found = [r for reply in answers.replies.values() for r in reply.root]
        if not found:
            offline = list(answers.errors)
            self.notify(
                "no recipes to start" + (f" (offline: {', '.join(offline)})" if offline else ": add trainers: to lab.yaml"),
                severity="warning",
            )
            return

        def started(job: JobDetail | None) -> None:
            if job:
                self.notify(f"started {job.id} ({job.recipe})")

        def picked(recipe: RecipeInfo | None) -> None:
            if recipe:
                self.app.push_screen(StartJobScreen(recipe), started)

        self.app.push_screen(PickRecipeScreen(found), picked)

    def _active_selected(self) -> JobInfo | None:
        """The selected job if it still runs."""
        job = self.selected()
        if job is not None and job.state not in JOB_ACTIVE:
            self.notify(f"{job.id} has already {job.state}", severity="warning")
            return None
        return job

    def action_stop(self) -> None:
        if job := self._active_selected():
            self.confirm(
                f"Stop job [b]{esc(job.id)}[/b] ({esc(job.recipe)}, step {job.step or 0})?\n"
                "SIGTERM now (a cetlab-train run saves a checkpoint), SIGKILL after the recipe's grace period.",
                lambda: self.act(job.machine, JOBS_STOP, StopParams(id=job.id), f"stopping {job.id}"),
            )

    def action_kill(self) -> None:
        if job := self._active_selected():
            self.confirm(
                f"Kill job [b]{esc(job.id)}[/b] ({esc(job.recipe)}) now with SIGKILL? Nothing is saved.",
                lambda: self.act(job.machine, JOBS_KILL, JobParams(id=job.id), f"killed {job.id}"),
            )

    def action_logs(self) -> None:
        job = self.selected()
        if job is not None:
            from console.tui.screens.logs import LogScreen

            if len(job.nodes) < 2:
                self.app.push_screen(LogScreen(job.machine, job.id))
                return

            def picked(rank: int | None) -> None:  # a multi-node job: any node's log (the same job id on its agent)
                if rank is not None and rank < len(job.nodes):
                    self.app.push_screen(LogScreen(job.nodes[rank].machine, job.id))

            names = ", ".join(f"{i} {node.machine}" for i, node in enumerate(job.nodes))
            self.app.push_screen(AskNumberScreen(f"Log of which node of {job.id}? ({names})", 0), picked)

    def action_checkpoints(self) -> None:
        job = self.selected()
        if job is not None:
            self.run_worker(self._open_checkpoints(job.machine, job.id))

    async def _open_checkpoints(self, machine: str, run: str) -> None:
        """The Checkpoints view on this job's run (runs of cetlab jobs are named by job id)."""
        await self.app.switch_mode("checkpoints")
        if isinstance(self.app.screen, CheckpointsScreen):
            self.app.screen.show_run(machine, run)
