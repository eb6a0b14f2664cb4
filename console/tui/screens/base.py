"""LabScreen: what every console view shares: the scheduler's tick, one key language, one way to act."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel
from textual.binding import Binding
from textual.screen import Screen

from agents.wire.catalogue.method import Method, request
from agents.wire.protocol import RemoteError
from widgets.format import Thresholds

if TYPE_CHECKING:
    from agents.wire.sections.base import SectionFault
    from console.tui.app import CetlabApp
    from widgets.lab_header import LabHeader

P = TypeVar("P", bound=BaseModel)  # a method's params
R = TypeVar("R", bound=BaseModel)  # ... and its reply


class LabScreen(Screen[None]):
    """A view of the lab. The app's scheduler calls tick() while it is shown; it fetches and redraws what is due."""

    VIEW_NAME = ""  # its name for `:` and the header
    FETCH_S: float | None = None  # fetch() runs this often while the view is shown (data the stream does not carry)
    CLOCK_S: float | None = None  # redraw at least this often without new data: the view shows ages or countdowns
    # The parts of each machine's state this view draws (tick sections, "link", "hello", "series"): it redraws only when
    # one of them changed (or its clock is due). None: every change. A failing section among them is shown on the view.
    SECTIONS: tuple[str, ...] | None = None
    # Actions that change the lab. A read-only console does not bind them: no footer hint, no help line, the key is free.
    ACTING: frozenset[str] = frozenset()

    # One key language: j/k (and the arrows) move, g/G go to the top and the bottom, in every view.
    BINDINGS = [
        Binding("j", "move(1)", "Down", show=False),
        Binding("k", "move(-1)", "Up", show=False),
        Binding("g", "move_to_end(False)", "Top", show=False),
        Binding("G", "move_to_end(True)", "Bottom", show=False),
        Binding("question_mark", "app.help", "Help"),  # here, not only on the app: first in the key bar, never cut at 80 columns
        Binding("slash", "filter", "Filter"),
    ]

    def __init__(self, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name, id, classes)
        self.ready = False  # True once mounted: refresh_data may run
        self.drawn_version = -1  # LabState.version the view last caught up with (redrawn, or nothing it shows changed)
        self.drawn_key = -1  # the version of what it shows (LabState.sections_version of SECTIONS) at the last redraw
        self.redraws = 0  # refresh_data calls from the scheduler, for benchmarks and tests
        self._faults: list[tuple[str, SectionFault]] | None = None  # shown under the header (None: not mounted yet)
        self.drawn_at = 0.0  # monotonic time of the last redraw
        self.fetched_at: float | None = None  # monotonic time of the last scheduled fetch
        self._headers: list[LabHeader] | None = None

    @property
    def lab_app(self) -> CetlabApp:
        return self.app  # type: ignore[return-value]

    # -- the scheduler's side

    def tick(self, version: int, now: float) -> None:
        """Called by the app's one scheduler: fetch what is due, redraw if the data or the clock moved."""
        if self.FETCH_S is not None and (self.fetched_at is None or now - self.fetched_at >= self.FETCH_S):
            self.fetched_at = now
            self.fetch()
        if version == self.drawn_version and (self.CLOCK_S is None or now - self.drawn_at < self.CLOCK_S):
            return
        forced = self.drawn_version == -1  # the first draw, or a view that set it back to -1 to be drawn again
        self.drawn_version = version
        key = version if self.SECTIONS is None else self.lab_app.state.sections_version((*self.SECTIONS, "faults"))
        if forced or key != self.drawn_key or (self.CLOCK_S is not None and now - self.drawn_at >= self.CLOCK_S):
            self.drawn_key, self.drawn_at = key, now
            self.redraws += 1
            self.refresh_faults()
            self.refresh_data()

    def shown_faults(self) -> list[tuple[str, SectionFault]]:
        """(machine, SectionFault) of the failing sections this view draws (none for a view of every section)."""
        if self.SECTIONS is None:
            return []
        return self.lab_app.state.faults(self.SECTIONS)

    def refresh_faults(self) -> None:
        """Show the failing sections of this view, with their errors, under its header; hidden when none fails."""
        from widgets.lab_header import LabHeader
        from widgets.section_faults import SectionFaults

        faults = self.shown_faults()
        if self._faults is None:  # mounted under the header at the first redraw: the views' compose stays as it is
            if not faults:
                return
            headers = list(self.query(LabHeader))
            self._faults = []
            self.mount(SectionFaults(id="section-faults"), **({"after": headers[0]} if headers else {}))
            self.call_after_refresh(self.refresh_faults)  # once mounted
            return
        if faults != self._faults:
            self._faults = faults
            self.query_one(SectionFaults).show(faults)

    def fetch(self) -> None:
        """Start fetching what this view shows beyond the stream (a worker); it calls refresh_data when it has it."""

    def refresh_header(self) -> None:
        from widgets.lab_header import HeaderFigures, LabHeader

        if self._headers is None:  # found once: a query walks every widget of the view, each time
            self._headers = list(self.query(LabHeader))
        for header in self._headers:
            app = self.lab_app
            state = app.state
            gpus, vram = state.gpu_totals()
            online = sum(v.online for v in state.machines.values())
            simulated = any(v.simulated for v in state.machines.values())
            header.show(
                HeaderFigures(
                    state.lab.lab,
                    self.VIEW_NAME,
                    online,
                    len(state.machines),
                    gpus,
                    vram,
                    simulated,
                    app.readonly,
                    app.clock(),
                    app.header_cost(),
                    failed=len(state.faults()),
                )
            )

    def refresh_data(self) -> None:
        """Read app.state and update widgets that changed; never fetch here."""

    def on_mount(self) -> None:
        # Textual runs this after the subclass's on_mount (handlers run up the MRO): the view is set up.
        self.ready = True

    def on_screen_resume(self) -> None:
        if self.ready:
            self.refresh_data()

    def thresholds(self) -> Thresholds:
        alerts = self.lab_app.lab.alerts
        return Thresholds(
            temp_warn_c=alerts.temp_c - 10,
            temp_alert_c=alerts.temp_c,
            vram_warn_pct=min(alerts.vram_pct, 85.0),
            vram_alert_pct=alerts.vram_pct,
        )

    # -- keys

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in self.ACTING and self.lab_app.readonly:
            return False  # unbound: Textual hides it and lets the key fall through
        return True

    def visible_bindings(self) -> list[tuple[str, str]]:
        """(key, description) of this view's keys that are bound now, for the help screen."""
        out = []
        for binding in self.BINDINGS:
            if isinstance(binding, Binding) and binding.description and self.check_action(binding.action.split("(")[0], ()):
                out.append((binding.key_display or binding.key, binding.description))
        return out

    def action_move(self, step: int) -> None:
        """j / k: the focused table's cursor (or the focused scroller) one row down or up."""
        target = self.focused
        for name in ("cursor_down", "scroll_down") if step > 0 else ("cursor_up", "scroll_up"):
            action = getattr(target, f"action_{name}", None)
            if action is not None:
                action()
                return

    def action_move_to_end(self, bottom: bool) -> None:
        """g / G: the first or the last row."""
        target = self.focused
        for name in ("scroll_bottom", "scroll_end") if bottom else ("scroll_top", "scroll_home"):
            action = getattr(target, f"action_{name}", None)
            if action is not None:
                action()
                return

    def action_filter(self) -> None:
        """`/`: ask for the text every table of this view filters its rows by (empty: all rows)."""
        from console.tui.screens.modals import AskTextScreen

        current = getattr(self, "filter_text", "")
        self.app.push_screen(AskTextScreen("show only the rows holding (empty: every row):", current), self._filter_answered)

    def _filter_answered(self, text: str | None) -> None:
        if text is not None:
            self.filter_text = text.strip()
            self.apply_filter(self.filter_text)
            self.notify(f"filter: {self.filter_text}" if self.filter_text else "filter cleared")

    def apply_filter(self, text: str) -> None:
        """Filter this view's tables; a view of something other than tables overrides it."""
        from widgets.live_table import LiveTable

        for table in self.query(LiveTable):
            table.set_filter(text)

    # -- acting on the lab

    def require_operator(self) -> bool:
        """False (with a notification) when this console may not act (a row's enter in a read-only console)."""
        if self.lab_app.readonly:
            self.notify("read-only console: actions are disabled", severity="warning")
            return False
        return True

    def confirm(self, question: str, then: Callable[[], None]) -> None:
        """Ask y/n in a modal; run `then` on yes."""
        from console.tui.screens.modals import ConfirmScreen

        self.app.push_screen(ConfirmScreen(question), lambda yes: then() if yes else None)

    def act(
        self,
        machine: str,
        method: Method[P, R],
        params: P,
        done: str | Callable[[R], str],
        *,
        timeout: float | None = None,
        then: Callable[[R], object] | None = None,
    ) -> None:
        """Call `method` on `machine` as the operator and say how it went; `then(result)` runs on success."""
        if not self.require_operator():
            return
        self.run_worker(self._act(machine, method, params, done, timeout, then), group="lab-actions")

    async def _act(
        self,
        machine: str,
        method: Method[P, R],
        params: P,
        done: str | Callable[[R], str],
        timeout: float | None,
        then: Callable[[R], object] | None,
    ) -> None:
        try:
            result = await request(self.lab_app.client, machine, method, params, timeout)
        except RemoteError as exc:
            self.notify(exc.message, severity="error", timeout=10)
            return
        self.notify(done(result) if callable(done) else done)
        if then is not None:
            then(result)
