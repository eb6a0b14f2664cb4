"""The Queue view (`:queue`): the lab queue live, as its keeper's agent pushes it: what runs where, what waits and
why, in the order it would start; hold (h), release (u), cancel (ctrl+x)."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Static

from agents.wire.catalogue.queue import QUEUE_CANCEL, QUEUE_HOLD, QUEUE_RELEASE, EntryParams
from agents.wire.lab.queue import scheduler_machine
from agents.wire.sections.queue import EntryState, QueueEntry, QueueSection
from console.tui.screens.base import LabScreen
from widgets.lab_header import LabHeader
from widgets.live_table import LiveTable
from widgets.wire import esc, shown, text

COLUMNS = [
    ("#", "id", 5),
    ("state", "state", 9),
    ("pri", "priority", 4),
    ("recipe", "recipe", 16),
    ("who", "user", 18),
    ("submitted", "submitted", 9),
    ("needs", "need", 24),
    ("where / why", "why", None),
]
DROP = ("submitted", "needs", "who", "pri")  # narrow: these go, in this order
STATE_STYLE = {
    EntryState.RUNNING: "green",
    EntryState.STARTING: "cyan",
    EntryState.QUEUED: "yellow",
    EntryState.HELD: "magenta",
    EntryState.CANCELLED: "dim",
}


def _clock(t: float | None) -> str:
    return time.strftime("%H:%M", time.localtime(t)) if t is not None else ""


def where_or_why(entry: QueueEntry) -> str:
    """Where it runs (or ran), or its place in line and why it waits: the agent's words, shown as text."""
    if entry.machine and entry.state in (EntryState.RUNNING, EntryState.STARTING, EntryState.ENDED):
        said = f"{entry.machine} GPU {','.join(map(str, entry.gpus)) or '-'}" + (f" · job {entry.job_id}" if entry.job_id else "")
        if entry.state is EntryState.ENDED:
            said += f" · {entry.job_state or 'ended'}" + (f": {entry.reason}" if entry.reason else "")
        return said
    said = (f"#{entry.position} " if entry.position else "") + (entry.reason or "")
    return said + (f" (start about {_clock(entry.expected_start)})" if entry.expected_start else "")


def queue_cells(entry: QueueEntry) -> tuple[str | Text, ...]:
    state = entry.state if entry.state is not EntryState.ENDED else (entry.job_state or "ended")
    style = STATE_STYLE.get(entry.state) or ("red" if entry.job_state in ("failed", "lost") else "")
    return (
        str(entry.id),
        text(str(state), style) if style else str(state),
        str(entry.priority),
        entry.recipe,
        entry.user,
        _clock(entry.submitted_at),
        entry.need,
        where_or_why(entry),
    )


class QueueScreen(LabScreen):
    VIEW_NAME = "queue"
    SECTIONS = ("queue", "link")  # redrawn only when these change
    ACTING = frozenset({"hold", "release", "cancel"})
    BINDINGS = [
        Binding("h", "hold", "Hold"),
        Binding("u", "release", "Release"),
        Binding("ctrl+x", "cancel", "Cancel"),  # not a plain key: a slip must not drop someone's place in line
    ]
    DEFAULT_CSS = """
    QueueScreen #queue-summary { height: auto; padding: 0 1; }
    QueueScreen #queue-table { height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield LabHeader()
        yield Static("", id="queue-summary")
        yield LiveTable(COLUMNS, queue_cells, DROP, id="queue-table")
        yield Footer()

    @property
    def keeper(self) -> str:
        return scheduler_machine(self.lab_app.lab)

    def section(self) -> QueueSection | None:
        view = self.lab_app.state.machines.get(self.keeper)
        return view.queue if view is not None else None

    def refresh_data(self) -> None:
        section = self.section()
        summary = self.query_one("#queue-summary", Static)
        if section is None:
            summary.update(shown(f"the lab queue on [b]{esc(self.keeper)}[/b]: no data yet (is its agent online?)"))
            section = QueueSection(machine=self.keeper)
        else:
            summary.update(
                shown(
                    f"the lab queue on [b]{esc(section.machine)}[/b]: {section.running} running · {section.waiting} waiting"
                    " · [b]cetlab train RECIPE[/b] queues one · [b]h[/b] hold · [b]u[/b] release · [b]ctrl+x[/b] cancel"
                )
            )
        self.query_one("#queue-table", LiveTable).show({str(e.id): e for e in section.entries})

    def _entry(self) -> QueueEntry | None:
        entry = self.query_one("#queue-table", LiveTable).selected()
        return entry if isinstance(entry, QueueEntry) else None

    def action_hold(self) -> None:
        if (entry := self._entry()) is not None:
            self.act(self.keeper, QUEUE_HOLD, EntryParams(id=entry.id), f"entry {entry.id} held")

    def action_release(self) -> None:
        if (entry := self._entry()) is not None:
            self.act(self.keeper, QUEUE_RELEASE, EntryParams(id=entry.id), f"entry {entry.id} released")

    def action_cancel(self) -> None:
        if (entry := self._entry()) is not None:
            chosen = entry
            self.confirm(
                f"Take entry {chosen.id} ({chosen.recipe}, {chosen.user}) out of the queue?",
                lambda: self.act(self.keeper, QUEUE_CANCEL, EntryParams(id=chosen.id), f"entry {chosen.id} cancelled"),
            )
