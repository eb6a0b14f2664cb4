"""Every dialog of the console in one place: confirm, ask a number, pick a model or a recipe, the start form, help, jump."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, cast

from rich.console import Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Input, Label, OptionList, Select, Static, Switch
from textual.widgets.option_list import Option

from agents.wire.catalogue.checkpoints import CHECKPOINTS_RESUME, ResumeParams
from agents.wire.catalogue.jobs import JOBS_START, RecipeInfo, RecipeParam, StartParams
from agents.wire.catalogue.method import request
from agents.wire.protocol import RemoteError
from agents.wire.sections.base import ParamValue
from agents.wire.sections.jobs import JobDetail
from agents.wire.sections.models import ModelInfo
from console.tui.views import VIEWS
from widgets.format import fmt_gib, fmt_limit, placement
from widgets.orchestra_table import state_cell
from widgets.wire import esc, safe_text, shown, text

if TYPE_CHECKING:
    from console.tui.app import CetlabApp

InputType = Literal["integer", "number", "text"]
INPUT_TYPES: dict[str, InputType] = {"int": "integer", "float": "number"}  # a recipe param's type -> its field's (else text)


class ConfirmScreen(ModalScreen[bool]):
    """y / enter: go ahead; n / escape: leave it. The question is markup: its callers esc() every agent's string in it."""

    BINDINGS = [Binding("y,enter", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Static { width: 72; max-width: 100%; padding: 1 2; border: thick $warning; background: $surface; }
    """

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        yield Static(shown(f"{self.question}\n\n[b]y[/b] yes   [b]n[/b] no"), id="confirm-question")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class PickModelScreen(ModalScreen[str | None]):
    """Choose the model to bring in on the selected one's GPUs."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    PickModelScreen { align: center middle; }
    PickModelScreen > Vertical { width: 96; max-width: 100%; height: auto; max-height: 24; border: thick $accent; background: $surface; }
    PickModelScreen OptionList { height: auto; max-height: 18; }
    """

    def __init__(self, title: str, models: list[ModelInfo], notes: dict[str, tuple[str, str | None]] | None = None) -> None:
        """`notes`: per model, where it would come up and why it cannot (None: it can); one that cannot is shown, not offered."""
        super().__init__()
        self.title_text = title
        self.models = models
        self.notes = notes or {}

    def _option(self, model: ModelInfo) -> Option:
        where, why = self.notes.get(model.name, ("", None))
        text = Text.assemble(f"{model.name:<22}", state_cell(model), f"  {fmt_gib(model.vram_bytes)}  {where}")
        if why:
            text.append(f"  cannot: {why}", style="red")
        return Option(safe_text(text), id=model.name, disabled=why is not None)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(text(self.title_text), classes="title")
            yield OptionList(*[self._option(m) for m in self.models], id="pick-model")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)


class AskNumberScreen(ModalScreen[int | None]):
    """A whole number, or None on escape."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    AskNumberScreen { align: center middle; }
    AskNumberScreen > Vertical { width: 72; max-width: 100%; height: auto; padding: 1 2; border: thick $warning; background: $surface; }
    """

    def __init__(self, question: str, default: int) -> None:
        super().__init__()
        self.question, self.default = question, default

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(text(self.question))
            yield Input(str(self.default), type="integer", id="ask-number")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            value = int(event.value)
        except ValueError:
            self.notify("a whole number, please", severity="warning")
            return
        if value >= 0:
            self.dismiss(value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class AskTextScreen(ModalScreen[str | None]):
    """A line of text (enter), or None on escape."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    AskTextScreen { align: center middle; }
    AskTextScreen > Vertical { width: 72; max-width: 100%; height: auto; padding: 1 2; border: thick $accent; background: $surface; }
    """

    def __init__(self, question: str, default: str = "") -> None:
        super().__init__()
        self.question, self.default = question, default

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(text(self.question))
            yield Input(self.default, id="ask-text")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class PickRecipeScreen(ModalScreen[RecipeInfo | None]):
    """Choose the recipe to start."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    PickRecipeScreen { align: center middle; }
    PickRecipeScreen > Vertical { width: 80; max-width: 100%; height: auto; max-height: 24; border: thick $accent; background: $surface; }
    PickRecipeScreen OptionList { height: auto; max-height: 18; }
    """

    def __init__(self, recipes: list[RecipeInfo]) -> None:
        super().__init__()
        self.recipes = recipes

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("start which recipe?", classes="title")
            yield OptionList(
                *[
                    Option(text(f"{r.name:<20} {placement(r.machine, r.gpus, r.nodes):<24} {r.launcher}"), id=str(i))
                    for i, r in enumerate(self.recipes)
                ],
                id="pick-recipe",
            )

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option.id is not None:
            self.dismiss(self.recipes[int(event.option.id)])

    def action_cancel(self) -> None:
        self.dismiss(None)


def param_hint(param: RecipeParam) -> str:
    parts: list[str] = [param.type]
    if param.min is not None or param.max is not None:
        low, high = ("" if limit is None else fmt_limit(limit) for limit in (param.min, param.max))  # an open end stays empty
        parts.append(f"{low}..{high}")
    line = f"[b]{esc(param.name)}[/b] ({esc(', '.join(parts))}) {esc(param.flag or '')}"
    return line + (f"  [dim]{esc(param.help)}[/]" if param.help else "")


RESUME_PARAM = "resume_from_checkpoint"  # filled in by the agent on a resume (agents/checkpoints/actions.py)


class StartJobScreen(ModalScreen[JobDetail | None]):
    """The recipe's params with their defaults; enter starts it, the agent's verdict stays on the form."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "start", "Start")]
    DEFAULT_CSS = """
    StartJobScreen { align: center middle; }
    StartJobScreen > VerticalScroll { width: 90; max-width: 100%; height: auto; max-height: 90%; border: thick $accent; background: $surface; padding: 0 1; }
    StartJobScreen Label { margin-top: 1; width: 100%; }  /* a param's help wraps: width auto cut it at the border */
    StartJobScreen #start-error { color: $error; height: auto; }
    """

    def __init__(self, recipe: RecipeInfo) -> None:
        super().__init__()
        self.recipe = recipe
        self.params: list[RecipeParam] = recipe.params  # the fields of the form

    def heading(self) -> str:
        r = self.recipe
        return f"start [b]{esc(r.name)}[/b] on {esc(placement(r.machine, r.gpus, r.nodes))}" + (
            f" (torchrun x{r.nproc_per_node})" if r.launcher == "torchrun" else ""
        )

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(shown(self.heading()), classes="title")
            for p in self.params:
                yield Label(shown(param_hint(p)))
                default = p.default
                if p.type == "bool":
                    yield Switch(value=bool(default), id=f"param-{p.name}")
                elif p.type == "choice":
                    yield Select(
                        [(text(c), c) for c in p.choices],
                        value=default if isinstance(default, str) and default in p.choices else Select.BLANK,
                        id=f"param-{p.name}",
                    )
                else:
                    kind = INPUT_TYPES.get(p.type, "text")
                    yield Input(value="" if default is None else str(default), type=kind, id=f"param-{p.name}")
            if not self.params:
                yield Label("no params: it runs as lab.yaml says")
            yield Static("", id="start-error")
            yield Static("[b]enter[/b] / ctrl+s start   [b]esc[/b] cancel", classes="dim")

    def on_mount(self) -> None:
        inputs = self.query(Input)
        if inputs:
            inputs.first().focus()

    def values(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for p in self.params:
            widget = self.query_one(f"#param-{p.name}")
            if isinstance(widget, Switch):
                values[p.name] = widget.value
            elif isinstance(widget, Select):
                if widget.value is not Select.BLANK:
                    values[p.name] = widget.value
            elif isinstance(widget, Input) and widget.value.strip():
                values[p.name] = widget.value.strip()  # the agent parses and checks it
        return values

    def on_input_submitted(self, _event: Input.Submitted) -> None:
        self.action_start()

    def action_start(self) -> None:
        self.start()

    def cleared(self) -> list[RecipeParam]:
        """The params with a default whose field was emptied: the agent would run the default, unasked."""
        return [
            p
            for p in self.params
            if p.default is not None
            and p.type not in ("bool", "choice")
            and not self.query_one(f"#param-{p.name}", Input).value.strip()
        ]

    @work(exclusive=True, group="start-job")
    async def start(self) -> None:
        error = self.query_one("#start-error", Static)
        if self.lab_app.readonly:  # the form calls the agent itself, not through LabScreen.act: the same switch, here too
            error.update("read-only console: actions are disabled")
            return
        if cleared := self.cleared():
            error.update(
                text("; ".join(f"{p.name} is empty: it would run with its default {p.default}; type a value" for p in cleared))
            )
            return
        error.update("starting ...")
        try:
            job = await self.submit(self.values())
        except RemoteError as exc:
            error.update(text(f"{exc.code}: {exc.message}"))
            return
        self.dismiss(job)

    @property
    def lab_app(self) -> CetlabApp:
        return cast("CetlabApp", self.app)

    async def submit(self, values: dict[str, Any]) -> JobDetail:
        return await request(
            self.lab_app.client, self.recipe.machine, JOBS_START, StartParams(recipe=self.recipe.name, params=values)
        )

    def action_cancel(self) -> None:
        self.dismiss(None)


class ResumeJobScreen(StartJobScreen):
    """Resume a run from a checkpoint: its recipe's params, filled with the run's own, to change (max_steps ...) before it starts."""

    def __init__(self, recipe: RecipeInfo, machine: str, run: str, step: int, previous: dict[str, ParamValue]) -> None:
        super().__init__(recipe)
        self.machine, self.run, self.step = machine, run, step
        # the agent fills in the checkpoint itself; every other field starts at what the run ran with
        self.params = [
            p.model_copy(update={"default": previous.get(p.name, p.default)}) for p in recipe.params if p.name != RESUME_PARAM
        ]

    def heading(self) -> str:
        return (
            f"resume run [b]{esc(self.run)}[/b] from step [b]{self.step}[/b]: a new job of {esc(self.recipe.name)} "
            f"on {esc(self.machine)}"
        )

    async def submit(self, values: dict[str, Any]) -> JobDetail:
        return await request(
            self.lab_app.client, self.machine, CHECKPOINTS_RESUME, ResumeParams(run=self.run, step=self.step, params=values)
        )


GLOBAL_KEYS = [
    ("j / k", "down / up (the arrows too)"),
    ("g / G", "first / last row"),
    ("/", "filter the rows (every table, the fleet's machines)"),
    ("?", "this help"),
    (":", "jump to a view by name (:fleet, :jobs, :models ...)"),
    ("esc", "back"),
    ("q", "quit"),
]


class HelpScreen(ModalScreen[None]):
    """`?`: every key of the current view and every view reachable with `:`."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 80; max-width: 100%; height: auto; max-height: 90%; border: thick $accent; background: $surface; padding: 1 2; }
    """

    def __init__(self, bindings: list[tuple[str, str]], cli_line: str | None = None):
        """`cli_line`: the CLI line that reaches the demo lab shown, when it is one."""
        super().__init__()
        self.view_bindings = bindings
        self.cli_line = cli_line

    def compose(self) -> ComposeResult:
        parts: list[Any] = [
            Text("Keys of this view", style="b"),
            keys_grid(self.view_bindings or [("", "(none)")]),
            Text(""),
            Text("Everywhere", style="b"),
            keys_grid(GLOBAL_KEYS),
            Text(""),
            Text.assemble(("Views", "b"), " (type : then the name)"),
            keys_grid([(f":{name}", desc) for name, (_, _, desc) in VIEWS.items()]),
        ]
        if self.cli_line:
            parts += [Text(""), Text("The CLI on this demo lab", style="b"), Padding(Text(self.cli_line), (0, 0, 0, 2))]
        with VerticalScroll():
            yield Static(Group(*parts))


def keys_grid(rows: list[tuple[str, str]]) -> Padding:
    """Keys and what they do in two columns: a long description wraps within its own column, not back to the margin."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="b cyan", no_wrap=True, min_width=10)
    grid.add_column(overflow="fold")
    for key, desc in rows:
        grid.add_row(Text(key), Text(desc))
    return Padding(grid, (0, 0, 0, 2))


class JumpScreen(ModalScreen[str | None]):
    """`:`: type a view's name (with completion) and jump there, k9s style."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    JumpScreen { align: center top; }
    JumpScreen > Input { width: 76; max-width: 100%; margin-top: 2; border: tall $accent; }
    JumpScreen > Static { width: 76; max-width: 100%; color: $text-muted; }
    """

    def compose(self) -> ComposeResult:
        yield Input(
            placeholder="view: " + " ".join(VIEWS), suggester=SuggestFromList(list(VIEWS), case_sensitive=False), id="jump"
        )
        yield Static("", id="jump-error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        name = event.value.strip().lstrip(":").lower()
        matches = [v for v in VIEWS if v.startswith(name)] if name else []
        if len(matches) == 1 or name in VIEWS:
            self.dismiss(name if name in VIEWS else matches[0])
        else:
            self.query_one("#jump-error", Static).update(text(f"no view {name!r}; views: {', '.join(VIEWS)}"))

    def action_cancel(self) -> None:
        self.dismiss(None)
