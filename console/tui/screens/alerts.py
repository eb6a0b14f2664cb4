"""The Alerts view: what is wrong now across the lab (offline machines included), the history, acknowledgement."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Static

from agents.wire.catalogue.alerts import ALERTS_ACK, ALERTS_LIST, AckParams, AlertListParams
from agents.wire.catalogue.method import request_all
from agents.wire.sections.notify import RouteStatus
from console.lab.alerts import AlertRow, active_alerts, offline_history
from console.lab.notify import route_line, route_statuses, troubled_first
from console.lab.replies import Answers
from console.tui.screens.base import LabScreen
from widgets.format import fmt_time
from widgets.lab_header import LabHeader
from widgets.live_table import LiveTable
from widgets.wire import text

FETCH_S = 5.0  # history comes from alerts.list this often while it is shown
COLUMNS = [
    ("state", "state", 8),
    ("level", "level", 9),
    ("machine", "machine", 12),
    ("target", "target", 18),
    ("rule", "rule", 16),
    ("fired", "fired", 19),
    ("message", "message", None),
]
DROP = ("level", "fired", "target")  # narrow: these go, in this order
MESSAGE_MIN = 40  # the message gets this much before the level, the time and the target go ("gpu0" alone at 100 columns before)
LEVEL_STYLE = {"critical": "bold red", "warning": "yellow"}


def alert_cells(alert: AlertRow) -> tuple[str | Text, ...]:
    state = "cleared" if alert.cleared_at else ("acked" if alert.acked_at else "ACTIVE")
    style = LEVEL_STYLE.get(alert.level, "") if state == "ACTIVE" else "dim"
    return (text(state, style), alert.level, alert.machine, alert.target, alert.rule, fmt_time(alert.fired_at), alert.message)


class AlertsScreen(LabScreen):
    VIEW_NAME = "alerts"
    SECTIONS = ("alerts", "link")  # redrawn only when these change
    FETCH_S = FETCH_S
    CLOCK_S = 1.0  # a machine becomes an offline alert after a while, with no new data
    ACTING = frozenset({"ack"})
    BINDINGS = [
        Binding("a", "ack", "Acknowledge"),
        Binding("h", "toggle_history", "History"),
    ]
    DEFAULT_CSS = """
    AlertsScreen #alerts-summary { height: auto; padding: 0 1; }
    AlertsScreen #alerts-routes { height: auto; max-height: 45%; padding: 0 1; }  /* 8 lines hid the last of four wrapped routes */
    AlertsScreen #alerts-table { height: 1fr; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.history = False
        self.past: list[AlertRow] = []
        self.routes: list[tuple[str, RouteStatus]] = []  # notification routes, from notify.status (lab.yaml notify.routes)

    def compose(self) -> ComposeResult:
        yield LabHeader()
        yield Static("", id="alerts-summary")
        yield Static("", id="alerts-routes", markup=False)
        yield LiveTable(COLUMNS, alert_cells, DROP, rest_min=MESSAGE_MIN, id="alerts-table")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_data()

    def fetch(self) -> None:
        self._fetch_history()
        if self.lab_app.state.lab.notify.routes:
            self._fetch_routes()

    @work(exclusive=True, group="alerts-routes")
    async def _fetch_routes(self) -> None:
        self.routes = route_statuses(await self.lab_app.client.call_all("notify.status"))
        self.refresh_data()

    def rows(self) -> dict[str, AlertRow]:
        """Alert id -> alert: the active ones live from the stream, then (with history) the cleared ones."""
        alerts = {a.id: a for a in active_alerts(self.lab_app.state, self.lab_app.clock())}
        if self.history:
            past = [*self.past, *offline_history(self.lab_app.state)]
            for alert in sorted(past, key=lambda a: -(a.fired_at or 0)):
                alerts.setdefault(alert.id, alert)
        return alerts

    def refresh_data(self) -> None:
        rows = self.rows()
        active = [a for a in rows.values() if not a.cleared_at]
        unacked = sum(1 for a in active if not a.acked_at)
        mode = "active and cleared" if self.history else "active"
        self.query_one("#alerts-summary", Static).update(
            f"[b]{len(active)} active[/b] ({unacked} not acknowledged) · showing {mode} · "
            "[b]a[/b] acknowledges the selected alert · [b]h[/b] toggles the history"
        )
        self.query_one("#alerts-table", LiveTable).show(rows)
        now = self.lab_app.clock()
        routes = self.query_one("#alerts-routes", Static)
        routes.display = bool(self.routes)  # a lab without notify routes keeps the view as it was
        routes.update(
            text(
                "\n".join(
                    ["notification routes:", *(route_line(machine, route, now) for machine, route in troubled_first(self.routes))]
                )
            )
        )

    def action_toggle_history(self) -> None:
        self.history = not self.history
        if self.history:
            self._fetch_history()
        self.refresh_data()

    @work(exclusive=True, group="alerts-history")
    async def _fetch_history(self) -> None:
        if not self.history:
            return
        answers = Answers.of(
            await request_all(self.lab_app.client, self.lab_app.state.machines, ALERTS_LIST, AlertListParams(limit=200))
        )
        self.past = sorted(
            (AlertRow.of(a) for reply in answers.replies.values() for a in reply.alerts), key=lambda a: -(a.fired_at or 0)
        )
        self.refresh_data()

    def selected(self) -> AlertRow | None:
        selected: AlertRow | None = self.query_one("#alerts-table", LiveTable).selected()
        return selected

    def action_ack(self) -> None:
        alert = self.selected()
        if alert is None:
            return
        if alert.rule == "offline":
            self.notify("an offline machine clears itself when it is back", severity="warning")
            return
        self.act(
            alert.machine,
            ALERTS_ACK,
            AckParams(id=alert.id),
            f"acknowledged {alert.id}",
            then=lambda _result: self._fetch_history(),
        )
