"""The Jobs view (`:jobs`): training runs live; start a recipe (n), stop (s), kill (k), follow its log (l)."""

from __future__ import annotations

from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Label, OptionList, Select, Static, Switch
from textual.widgets.option_list import Option

from agents.protocol import RemoteError
from console.screens.base import LabScreen
from console.screens.models import ConfirmScreen
from widgets.jobs_table import ACTIVE, JobsTable
from widgets.lab_header import LabHeader


class PickRecipeScreen(ModalScreen[dict | None]):
    """Choose the recipe to start."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    PickRecipeScreen { align: center middle; }
    PickRecipeScreen > Vertical { width: 80; height: auto; max-height: 24; border: thick $accent; background: $surface; }
    PickRecipeScreen OptionList { height: auto; max-height: 18; }
    """

    def __init__(self, recipes: list[dict[str, Any]]) -> None:
        super().__init__()
        self.recipes = recipes

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("start which recipe?", classes="title")
            yield OptionList(*[Option(f"{r['name']:<20} {r['machine']:<12} GPU {','.join(map(str, r['gpus'])) or '-':<8} {r['launcher']}", id=str(i))
                               for i, r in enumerate(self.recipes)], id="pick-recipe")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.recipes[int(event.option.id)])

    def action_cancel(self) -> None:
        self.dismiss(None)


def param_hint(param: dict[str, Any]) -> str:
    parts = [param["type"]]
    if param.get("min") is not None or param.get("max") is not None:
        parts.append(f"{param.get('min', '')}..{param.get('max', '')}".replace("None", ""))
    text = f"[b]{param['name']}[/b] ({', '.join(parts)}) {param['flag']}"
    return text + (f"  [dim]{param['help']}[/]" if param.get("help") else "")


class StartJobScreen(ModalScreen[dict | None]):
    """The recipe's params with their defaults; enter starts it, the agent's verdict stays on the form."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "start", "Start")]
    DEFAULT_CSS = """
    StartJobScreen { align: center middle; }
    StartJobScreen > VerticalScroll { width: 90; height: auto; max-height: 90%; border: thick $accent; background: $surface; padding: 0 1; }
    StartJobScreen Label { margin-top: 1; }
    StartJobScreen #start-error { color: $error; height: auto; }
    """

    def __init__(self, recipe: dict[str, Any]) -> None:
        super().__init__()
        self.recipe = recipe

    def compose(self) -> ComposeResult:
        r = self.recipe
        with VerticalScroll():
            yield Static(f"start [b]{r['name']}[/b] on {r['machine']} GPU {','.join(map(str, r['gpus'])) or '-'}"
                         + (f" (torchrun x{r['nproc_per_node']})" if r["launcher"] == "torchrun" else ""), classes="title")
            for p in r["params"]:
                yield Label(param_hint(p))
                default = p.get("default")
                if p["type"] == "bool":
                    yield Switch(value=bool(default), id=f"param-{p['name']}")
                elif p["type"] == "choice":
                    yield Select([(c, c) for c in p["choices"]], value=default if default in p["choices"] else Select.BLANK,
                                 id=f"param-{p['name']}")
                else:
                    kind = {"int": "integer", "float": "number"}.get(p["type"], "text")
                    yield Input(value="" if default is None else str(default), type=kind, id=f"param-{p['name']}")
            if not r["params"]:
                yield Label("no params: it runs as lab.yaml says")
            yield Static("", id="start-error")
            yield Static("[b]enter[/b] / ctrl+s start   [b]esc[/b] cancel", classes="dim")

    def on_mount(self) -> None:
        inputs = self.query(Input)
        if inputs:
            inputs.first().focus()

    def values(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for p in self.recipe["params"]:
            widget = self.query_one(f"#param-{p['name']}")
            if isinstance(widget, Switch):
                values[p["name"]] = widget.value
            elif isinstance(widget, Select):
                if widget.value is not Select.BLANK:
                    values[p["name"]] = widget.value
            elif widget.value.strip():
                values[p["name"]] = widget.value.strip()  # the agent parses and checks it
        return values

    def on_input_submitted(self, _event: Input.Submitted) -> None:
        self.action_start()

    def action_start(self) -> None:
        self.start()

    @work(exclusive=True, group="start-job")
    async def start(self) -> None:
        error = self.query_one("#start-error", Static)
        error.update("starting ...")
        try:
            job = await self.app.client.call(self.recipe["machine"], "jobs.start", {"recipe": self.recipe["name"], "params": self.values()})
        except RemoteError as exc:
            error.update(f"{exc.code}: {exc.message}")
            return
        self.dismiss(job)

    def action_cancel(self) -> None:
        self.dismiss(None)


def detail_text(job: dict[str, Any] | None) -> str:
    if job is None:
        return "no jobs yet: [b]n[/b] starts a recipe from lab.yaml"
    params = " ".join(f"{k}={v}" for k, v in (job.get("params") or {}).items())
    lines = [f"[b]{job['id']}[/b] {job['recipe']} on {job['machine']}  {params}"]
    figures = []
    if job.get("learning_rate") is not None:
        figures.append(f"lr {job['learning_rate']:.3g}")
    if job.get("tokens_per_s") is not None:
        figures.append(f"{job['tokens_per_s']:.0f} tokens/s")
    checkpoints = job.get("checkpoints") or []
    if checkpoints:
        last = checkpoints[-1]
        figures.append(f"checkpoints {', '.join(str(c['step']) for c in checkpoints)} (last save {last.get('save_s') or 0:.2f}s)")
    if job.get("starved"):
        figures.append("[b black on yellow] GPU starved [/] its GPUs sit under the lab's starved_util_pct: check dataloader workers and I/O")
    if job.get("simulated") and job.get("gpus"):
        figures.append("[b magenta]SIM[/] GPU figures")
    if figures:
        lines.append(" · ".join(figures))
    lines.append(f"[dim]log {job['log_path']} · output {job.get('output_dir')}[/]")
    if job["state"] in ("failed", "lost"):
        lines.append(f"[b red]{job['state']}:[/] {job.get('error') or ''}")
        lines += [f"[dim]{line}[/]" for line in (job.get("last_lines") or [])[-3:]]
    return "\n".join(lines)


class JobsScreen(LabScreen):
    VIEW_NAME = "jobs"
    BINDINGS = [
        Binding("n", "new", "New run"),
        Binding("s", "stop", "Stop"),
        Binding("k", "kill", "Kill"),
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

    def all_jobs(self) -> list[dict[str, Any]]:
        jobs = []
        for view in self.lab_app.state.machines.values():
            for job in view.sections.get("jobs") or []:
                jobs.append({**job, "offline": not view.online})
        return jobs

    def refresh_data(self) -> None:
        table = self.query_one(JobsTable)
        with self.app.batch_update():
            table.show(self.all_jobs())
            self.query_one("#jobs-detail", Static).update(detail_text(table.selected()))

    def on_data_table_row_highlighted(self, _event) -> None:
        self.query_one("#jobs-detail", Static).update(detail_text(self.query_one(JobsTable).selected()))

    def on_data_table_row_selected(self, _event) -> None:  # enter on a row: its log
        self.action_logs()

    def selected(self) -> dict[str, Any] | None:
        job = self.query_one(JobsTable).selected()
        if job is None:
            self.notify("no job selected", severity="warning")
        return job

    # -- actions

    def action_new(self) -> None:
        if self.require_operator():
            self.pick_recipe()

    @work(exclusive=True, group="jobs-recipes")
    async def pick_recipe(self) -> None:
        answers = await self.lab_app.client.call_all("jobs.recipes")
        found = [r for answer in answers.values() if isinstance(answer, list) for r in answer]
        if not found:
            offline = [name for name, a in answers.items() if not isinstance(a, list)]
            self.notify("no recipes to start" + (f" (offline: {', '.join(offline)})" if offline else ": add trainers: to lab.yaml"), severity="warning")
            return

        def started(job: dict | None) -> None:
            if job:
                self.notify(f"started {job['id']} ({job['recipe']})")

        def picked(recipe: dict | None) -> None:
            if recipe:
                self.app.push_screen(StartJobScreen(recipe), started)

        self.app.push_screen(PickRecipeScreen(found), picked)

    def _ask(self, question: str, method: str, job: dict[str, Any], done: str) -> None:
        def answer(yes: bool | None) -> None:
            if yes:
                self._act(job["machine"], method, {"id": job["id"]}, done)

        self.app.push_screen(ConfirmScreen(question), answer)

    def _active_selected(self) -> dict[str, Any] | None:
        """The selected job if it still runs and this console may act on it."""
        job = self.selected()
        if job is None or not self.require_operator():
            return None
        if job["state"] not in ACTIVE:
            self.notify(f"{job['id']} has already {job['state']}", severity="warning")
            return None
        return job

    def action_stop(self) -> None:
        if job := self._active_selected():
            self._ask(f"Stop job [b]{job['id']}[/b] ({job['recipe']}, step {job.get('step') or 0})?\n"
                      "SIGTERM now (a cetlab-train run saves a checkpoint), SIGKILL after the recipe's grace period.",
                      "jobs.stop", job, f"stopping {job['id']}")

    def action_kill(self) -> None:
        if job := self._active_selected():
            self._ask(f"Kill job [b]{job['id']}[/b] ({job['recipe']}) now with SIGKILL? Nothing is saved.", "jobs.kill", job, f"killed {job['id']}")

    def action_logs(self) -> None:
        job = self.selected()
        if job is not None:
            from console.screens.logs import LogScreen

            self.app.push_screen(LogScreen(job["machine"], job["id"]))

    def action_checkpoints(self) -> None:
        job = self.selected()
        if job is not None:
            self.run_worker(self._open_checkpoints(job["machine"], job["id"]))

    async def _open_checkpoints(self, machine: str, run: str) -> None:
        """The Checkpoints view on this job's run (runs of cetlab jobs are named by job id)."""
        await self.app.switch_mode("checkpoints")
        self.app.screen.show_run(machine, run)

    @work(group="jobs-actions")
    async def _act(self, machine: str, method: str, params: dict[str, Any], done: str) -> None:
        try:
            await self.lab_app.client.call(machine, method, params)
        except RemoteError as exc:
            self.notify(exc.message, severity="error", timeout=10)
            return
        self.notify(done)
