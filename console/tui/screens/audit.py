"""The Audit view: every operator action on the lab's agents (who, what, params, outcome), newest first."""

from __future__ import annotations

import time

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Static

from agents.wire.catalogue.audit import AUDIT_LIST, AuditEntry, AuditListParams
from agents.wire.catalogue.method import request_all
from console.lab.audit import Trail, lab_trail, refusals_line
from console.tui.screens.base import LabScreen
from widgets.lab_header import LabHeader
from widgets.live_table import LiveTable
from widgets.wire import esc, shown, text

LIMIT = 500
COLUMNS = [
    ("when", "when", 19),
    ("machine", "machine", 12),
    ("who", "who", 22),
    ("role", "role", 8),
    ("method", "method", 20),
    ("params", "params", 36),
    ("outcome", "outcome", 10),
    ("message", "message", None),
]
DROP = ("params", "role", "who", "machine")  # narrow: these go, in this order (80 columns keep the machine)


def audit_cells(row: tuple[str, AuditEntry]) -> tuple[str | Text, ...]:
    machine, entry = row
    outcome = entry.outcome
    return (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.t)),
        machine,
        entry.who,
        entry.role,
        entry.method,
        entry.params or "",
        outcome if outcome == "ok" else text(outcome, "red"),
        entry.message or "",
    )


class AuditScreen(LabScreen):
    VIEW_NAME = "audit"
    SECTIONS = ("audit", "link")  # redrawn only when these change
    BINDINGS = [
        Binding("e", "toggle_errors", "Errors only"),
        Binding("r", "fetch", "Refresh"),
    ]
    DEFAULT_CSS = """
    AuditScreen #audit-summary { height: auto; padding: 0 1; }
    AuditScreen #audit-table { height: 1fr; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.errors_only = False
        self.trail = Trail()
        self._counts: dict[str, int] = {}

    def compose(self) -> ComposeResult:
        yield LabHeader()
        yield Static("", id="audit-summary")
        yield LiveTable(COLUMNS, audit_cells, DROP, id="audit-table")
        yield Footer()

    def on_mount(self) -> None:
        self.fetch()

    def refresh_data(self) -> None:
        # the agents push only a count; the trail itself is fetched when a count moves
        counts = {name: view.audit.count for name, view in self.lab_app.state.machines.items()}
        if counts != self._counts:
            self._counts = counts
            self.fetch()
        trail = self.trail
        entries = [(m, e) for m, e in trail.entries if not self.errors_only or e.outcome != "ok"]
        failed = sum(1 for _, e in trail.entries if e.outcome != "ok")
        unavailable = "".join(f" · {esc(m)}: {esc(why)}" for m, why in trail.unavailable.items())
        self.query_one("#audit-summary", Static).update(
            shown(
                f"[b]{len(trail.entries)} operator actions[/b] ({failed} failed) · "
                f"showing {'errors only' if self.errors_only else 'all'} · [b]e[/b] errors only · [b]r[/b] refresh{unavailable}\n"
                + esc(refusals_line(trail.refusals))
            )
        )
        self.query_one("#audit-table", LiveTable).show({f"{m}:{e.id}": (m, e) for m, e in entries})  # newest first

    def action_toggle_errors(self) -> None:
        self.errors_only = not self.errors_only
        self.refresh_data()

    def action_fetch(self) -> None:
        self.fetch()

    def fetch(self) -> None:
        self._fetch_trail()

    @work(exclusive=True, group="audit-fetch")
    async def _fetch_trail(self) -> None:
        self.trail = lab_trail(
            await request_all(self.lab_app.client, self.lab_app.state.machines, AUDIT_LIST, AuditListParams(limit=LIMIT)), LIMIT
        )
        self.refresh_data()
