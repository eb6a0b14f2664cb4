"""A job's log, followed live from the agent, with `/` search (n / N for the next and previous match)."""

from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Input, Log, Static

from agents.wire.catalogue.jobs import JOBS_LOGS, LogsParams
from agents.wire.catalogue.method import request
from agents.wire.protocol import RemoteError
from agents.wire.words import plural
from console.tui.screens.base import LabScreen
from widgets.format import NA
from widgets.lab_header import LabHeader
from widgets.wire import esc, shown, visible

FIRST_LINES = 1000  # the tail shown on open; then every new line
MAX_LINES = 20000  # kept on screen; older ones scroll out


class LogScreen(LabScreen):
    VIEW_NAME = "logs"
    FETCH_S = 1.0  # the log's new lines (jobs.logs from the offset reached)
    BINDINGS = [
        Binding("slash", "search", "Search"),
        Binding("n", "next_match(1)", "Next"),
        Binding("N", "next_match(-1)", "Previous"),
        Binding("f", "follow", "Follow"),
        Binding("escape", "back", "Back"),
    ]
    DEFAULT_CSS = """
    LogScreen #log-status { height: 1; padding: 0 1; background: $panel; }
    LogScreen #log-search { display: none; }
    LogScreen #log-search.visible { display: block; }
    """

    def __init__(self, machine: str, job_id: str):
        super().__init__()
        self.machine, self.job_id = machine, job_id
        self.log_offset: int | None = None  # None until the tail came back
        self.lines: list[str] = []
        self.job_state = NA
        self.pattern = ""
        self.match_at: int | None = None
        self.error: str | None = None

    def compose(self) -> ComposeResult:
        yield LabHeader()
        yield Static("", id="log-status")
        yield Log(id="log", max_lines=MAX_LINES, auto_scroll=True)
        yield Input(placeholder="search (enter: find, esc: close)", id="log-search")
        yield Footer()

    def on_mount(self) -> None:
        self._show_status()

    @property
    def following(self) -> bool:
        return self.query_one(Log).auto_scroll

    def refresh_data(self) -> None:
        self._show_status()

    def _show_status(self) -> None:
        parts = [
            f"[b]{esc(self.job_id)}[/b] on {esc(self.machine)}",
            esc(self.job_state),
            plural(len(self.lines), "line"),
            "[green]following[/]" if self.following else "[yellow]paused[/] (f follows)",
        ]
        if self.pattern:
            matches = self.matches()
            where = (
                f"{matches.index(self.match_at) + 1}/{len(matches)} (line {self.match_at + 1})"
                if self.match_at in matches
                else f"{len(matches)} matches"
            )
            parts.append(f"/{esc(self.pattern)}: {where}")
        if self.error:
            parts.append(f"[red]{esc(self.error)}[/]")
        self.query_one("#log-status", Static).update(shown(" · ".join(parts)))

    def fetch(self) -> None:
        self._fetch_log()

    @work(exclusive=True, group="log-fetch")
    async def _fetch_log(self) -> None:
        params = (
            LogsParams(id=self.job_id, tail_lines=FIRST_LINES)
            if self.log_offset is None
            else LogsParams(id=self.job_id, offset=self.log_offset)
        )
        try:
            logs = await request(self.lab_app.client, self.machine, JOBS_LOGS, params)
        except RemoteError as exc:
            self.error = exc.message
            return
        self.error = None
        self.log_offset, self.job_state = logs.offset, logs.state
        if logs.lines:
            self.lines = (self.lines + logs.lines)[-MAX_LINES:]
            self.query_one(Log).write_lines([visible(line) for line in logs.lines])  # no terminal escapes from a trainer
        self._show_status()

    # -- search

    def matches(self) -> list[int]:
        needle = self.pattern.lower()
        return [i for i, line in enumerate(self.lines) if needle in line.lower()]

    def action_search(self) -> None:
        box = self.query_one("#log-search", Input)
        box.add_class("visible")
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.pattern = event.value
        event.input.remove_class("visible")
        self.query_one(Log).focus()
        self.match_at = None
        self.action_next_match(-1)  # the newest match first

    def action_next_match(self, step: int) -> None:
        matches = self.matches() if self.pattern else []
        if not matches:
            if self.pattern:
                self.notify(f"no line matches {self.pattern!r}", severity="warning")
            return
        if self.match_at is None:
            target = matches[-1] if step < 0 else matches[0]
        else:
            later = [i for i in matches if (i > self.match_at if step > 0 else i < self.match_at)]
            target = (later[0] if step > 0 else later[-1]) if later else (matches[0] if step > 0 else matches[-1])
        self.match_at = target
        log = self.query_one(Log)
        log.auto_scroll = False  # stay on the match while new lines arrive
        # Log keeps the last MAX_LINES lines, as self.lines does: the same index is the same line
        log.scroll_to(y=max(0, target - log.size.height // 2), animate=False)
        self._show_status()

    def action_follow(self) -> None:
        log = self.query_one(Log)
        log.auto_scroll = True
        log.scroll_end(animate=False)
        self.match_at = None
        self._show_status()

    def action_back(self) -> None:
        box = self.query_one("#log-search", Input)
        if box.has_class("visible"):
            box.remove_class("visible")
            self.query_one(Log).focus()
            return
        self.app.pop_screen()
