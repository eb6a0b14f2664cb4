"""The Costs view: the running counter, the breakdown by machine, job or model, the saving vs cloud, spend per day."""

from __future__ import annotations

from datetime import date, timedelta

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Static
from textual_plotext import PlotextPlot

from agents.wire.catalogue.costs import COSTS_GET, CostsParams, PricedGroup
from agents.wire.catalogue.method import request_all
from console.lab.costs import Breakdown, LabCosts, LabDay, lab_costs
from console.lab.replies import Answers
from console.tui.screens.base import LabScreen
from widgets.format import fmt, fmt_money, fmt_pct, fmt_saving
from widgets.lab_header import LabHeader
from widgets.live_table import LiveTable
from widgets.wire import esc, shown

FETCH_S = 5.0  # the breakdown and the daily totals come from costs.get this often; the counter ticks with the stream
PLOT_DAYS = 30
BREAKDOWNS: tuple[Breakdown, ...] = ("machine", "job", "model")
COLUMNS = [
    ("name", "name", 34),
    ("kwh", "kWh", 10),
    ("cost", "cost", 14),
    ("cloud", "cloud equiv.", 14),
    ("saving", "saving", 10),
    ("gpu_h", "GPU-h", 8),
    ("busy_h", "busy GPU-h", 10),
    ("tokens", "tokens", 12),
]
DROP = ("busy_h", "gpu_h", "kwh", "cloud")  # narrow: the hours go, then kWh, then the cloud figure (saving % says it)


def breakdown_rows(groups: list[PricedGroup], by: str, currency: str) -> dict[str, tuple[str, ...]]:
    """Row key -> cells of the breakdown table: one row per machine, or per job or model of a machine (`costs.get` by)."""
    rows: dict[str, tuple[str, ...]] = {}
    for entry in groups:
        owner = (entry.job if by == "job" else entry.model if by == "model" else None) or entry.machine
        key = owner if by == "machine" else f"{entry.machine}/{owner}"
        label = entry.label or ""
        shown = owner if label in ("", owner) else f"{owner} {label}"  # a model's label is its own name: once
        name = owner if by == "machine" else f"{shown} @{entry.machine}"
        rows[key] = (
            name[:34],
            fmt(entry.kwh, ".3f"),
            fmt_money(entry.cost, currency),
            fmt_money(entry.cloud_equivalent, currency),
            fmt_saving(entry.saving_pct),
            fmt(entry.gpu_hours, ".2f"),
            fmt(entry.gpu_busy_hours, ".2f"),
            f"{entry.tokens:,}",
        )
    return rows


def first_day(since: str | None, today: date) -> date:
    """The plot's first day: the agents' (a wire string, checked as a Day there; an older agent's is parsed here, never
    trusted), else the window's."""
    try:
        return date.fromisoformat(since) if since else today - timedelta(days=PLOT_DAYS - 1)
    except ValueError:
        return today - timedelta(days=PLOT_DAYS - 1)


def plot_days(days: list[LabDay], since: date, today: date) -> list[tuple[str, float, float]]:
    """(MM-DD, cost, cloud equivalent) for every day of the window, 0 where nothing was counted: a one-day lab
    is one day of thirty, not two bars as wide as the plot."""
    by_day = {d.day: d for d in days}
    window = [since + timedelta(days=i) for i in range(max(1, (today - since).days + 1))][-PLOT_DAYS:]
    counted = [by_day.get(day.isoformat()) for day in window]
    return [
        (day.isoformat()[5:], (d.cost or 0.0) if d else 0.0, (d.cloud_equivalent or 0.0) if d else 0.0)
        for day, d in zip(window, counted)
    ]


class CostsScreen(LabScreen):
    VIEW_NAME = "costs"
    SECTIONS = ("costs", "link")  # redrawn only when these change
    FETCH_S = FETCH_S
    BINDINGS = [
        Binding("b", "next_breakdown", "Breakdown"),
        Binding("r", "fetch", "Refresh"),
    ]
    DEFAULT_CSS = """
    CostsScreen #costs-summary { height: auto; padding: 0 1; }
    CostsScreen #costs-by { height: auto; max-height: 45%; }
    CostsScreen #costs-plot { height: 1fr; min-height: 8; border-top: solid $panel; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.by: Breakdown = "machine"
        self.report: LabCosts | None = None  # the lab's sums, with every machine's breakdown rows and API providers
        self._plotted: list[tuple[str, float, float]] | None = None

    def compose(self) -> ComposeResult:
        yield LabHeader()  # its cost figure is the live counter: the view's lines start with the month
        yield Static("loading costs …", id="costs-summary")
        # the table above the chart, each the full width: side by side, the table's last column ran into the axis
        yield LiveTable(COLUMNS, lambda cells: cells, DROP, id="costs-by")
        yield PlotextPlot(id="costs-plot")
        yield Footer()

    def fetch(self) -> None:
        self._fetch(self.by)

    def action_fetch(self) -> None:
        self.fetch()

    def action_next_breakdown(self) -> None:
        self.by = BREAKDOWNS[(BREAKDOWNS.index(self.by) + 1) % len(BREAKDOWNS)]
        self.query_one("#costs-by", LiveTable).show({})
        self.fetch()

    @work(exclusive=True, group="costs")
    async def _fetch(self, by: Breakdown) -> None:
        since = self.lab_app.lab.costs.day() - timedelta(days=PLOT_DAYS - 1)  # the lab's day, as the agents book
        results = await request_all(self.lab_app.client, self.lab_app.state.machines, COSTS_GET, CostsParams(by=by, since=since))
        answers = Answers.of(results)
        if by != self.by:  # the user switched breakdowns while this call ran
            return
        if not answers.replies and self.report is not None:
            return  # keep the last figures; the header says which machines are offline
        self.report = lab_costs(self.lab_app.lab.costs.currency, results, by)
        self.refresh_data()

    def refresh_data(self) -> None:
        report = self.report
        if report is None:
            return
        currency = report.currency
        sim = " [black on yellow] SIM [/] GPU power is simulated" if report.simulated else ""
        lines = [
            f"[b]this month[/b] {fmt_money(report.month, currency)}   cloud equivalent {fmt_money(report.cloud_equivalent_month, currency)}"
            f"   [b]saving {fmt_money(report.saving_month, currency)} ({fmt_saving(report.saving_pct_month)})[/b]{sim}",
            f"today {fmt_money(report.today, currency)}   cloud {fmt_money(report.cloud_equivalent_today, currency)}"
            f"   {report.kwh_today or 0:.2f} kWh today, {report.kwh_month or 0:.2f} kWh this month",
            f"by {report.by_kind} over the last {PLOT_DAYS} days, since {esc(report.since)} (as `cetlab costs --since {esc(report.since)}`)"
            "   ([b]b[/b] switches machine / job / model)",
        ]
        if report.api_providers:
            lines.append(
                f"[b]API[/b] today {fmt_money(report.api_today, currency)}   this month {fmt_money(report.api_month, currency)}"
                f"   lab total this month {fmt_money(report.total_month, currency)}"
            )
            lines += [
                f"  {esc(p.provider)}{' [black on yellow] SIM [/]' if p.simulated else ''}: this month {fmt_money(p.month, currency)}"
                + (
                    f" of {fmt_money(p.monthly_budget, currency)} ({fmt_pct(p.budget_pct)})"
                    if p.monthly_budget is not None
                    else ""
                )
                for p in report.api_providers
            ]
        lines += [f"[yellow]{esc(m)}[/]" for m in report.missing]
        lines += [f"[red]not counted, offline: {esc(name)}: {esc(why)}[/]" for name, why in report.offline.items()]
        self.query_one("#costs-summary", Static).update(shown("\n".join(lines)))
        self._refresh_table(report)
        self._refresh_plot(report)

    def _refresh_table(self, report: LabCosts) -> None:
        self.query_one("#costs-by", LiveTable).show(breakdown_rows(report.by, report.by_kind, report.currency))

    def _refresh_plot(self, report: LabCosts) -> None:
        today = self.lab_app.lab.costs.day()
        data = plot_days(report.days, first_day(report.since, today), today)
        if data == self._plotted:
            return
        self._plotted = data
        plot = self.query_one("#costs-plot", PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        if data:
            plt.multiple_bar([d[0] for d in data], [[d[1] for d in data], [d[2] for d in data]], labels=["here", "cloud"])  # type: ignore[call-arg]  # textual_plotext's stub says label; plotext takes labels
        plt.title(f"spend per day ({report.currency})" + (" SIM" if report.simulated else ""))
        plot.refresh()
