"""The Gateway view: traffic per model (rps, in flight, queued, latency, TTFT, wakes, errors), provider spend, keys."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Footer, Static

from agents.runtime.demo import GATEWAY_KEY_FILE
from agents.wire.protocol import LinkStatus
from agents.wire.sections.gateway import GatewayModelFigures, GatewaySection
from console.tui.screens.base import LabScreen
from widgets.format import NA, fmt, fmt_money, key_limits_text
from widgets.lab_header import LabHeader
from widgets.live_table import LiveTable
from widgets.wire import esc, shown, text

COLUMNS = [
    ("model", "model", 20),
    ("tier", "tier", 8),
    ("where", "where", 15),
    ("state", "state", 10),
    ("rps", "rps", 6),
    ("in_flight", "in flight", 9),
    ("queued", "queued", 6),
    ("p50", "p50 s", 7),
    ("p95", "p95 s", 7),
    ("ttft50", "TTFT p50", 8),
    ("ttft95", "TTFT p95", 8),
    ("wakes", "wakes", 5),
    ("errors", "errors", 6),
]
# narrow: these go, in this order (80 columns keep what a model is, where it runs and how it answers: tier and where)
DROP = ("ttft95", "ttft50", "p95", "queued", "in_flight", "wakes", "p50", "tier", "where")


def model_cells(m: GatewayModelFigures) -> tuple[str | Text, ...]:
    where = (m.where or "") + (" SIM" if m.simulated else "")
    errors = text(m.errors, "red") if m.errors else "0"
    return (
        m.name,
        m.tier,
        where,
        m.state or NA,
        f"{m.rps:.2f}",
        str(m.in_flight),
        str(m.queued),
        fmt(m.p50_latency_s, ".3f"),
        fmt(m.p95_latency_s, ".3f"),
        fmt(m.p50_ttft_s, ".3f"),
        fmt(m.p95_ttft_s, ".3f"),
        str(m.wakes),
        errors,
    )


def spend_text(section: GatewaySection) -> str:
    currency = section.currency
    lines = []
    for p in section.providers:
        pct = p.budget_pct
        colour = "red" if pct is not None and pct >= 100 else "yellow" if pct is not None and pct >= 80 else "green"
        budget = (
            f" of {esc(fmt_money(p.monthly_budget, currency))} [{colour}]{fmt(pct, '.0f', '%')}[/]"
            if p.monthly_budget is not None
            else ""
        )
        sim = " [b]SIM[/b]" if p.simulated else ""
        missing = "" if p.key_set else " [red]API key not set[/]"
        lines.append(
            f"[b]{esc(p.name)}[/b]{sim}: today {esc(fmt_money(p.spend_today, currency))} · month {esc(fmt_money(p.spend_month, currency))}{budget}{missing}"
        )
    for k in section.keys:
        over = k.budget_amount is not None and k.spent >= k.budget_amount
        state = " [red]revoked[/]" if k.revoked else " [red]expired[/]" if k.expired else " [red]over budget[/]" if over else ""
        lines.append(f"key [b]{esc(k.name)}[/b]{state}: {k.requests} req, {esc(key_limits_text(k, currency))}")
    return "\n".join(lines) or "no providers"


class GatewayScreen(LabScreen):
    VIEW_NAME = "gateway"
    SECTIONS = ("gateway", "link")  # redrawn only when these change
    DEFAULT_CSS = """
    GatewayScreen #gateway-summary { height: auto; padding: 0 1; }
    GatewayScreen #gateway-table { height: 1fr; }
    GatewayScreen #gateway-spend { height: auto; max-height: 12; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield LabHeader()
        yield Static("", id="gateway-summary")
        yield LiveTable(COLUMNS, model_cells, DROP, id="gateway-table")
        yield Static("", id="gateway-spend")
        yield Footer()

    def section(self) -> GatewaySection | None:
        gateway = self.lab_app.lab.gateway
        view = self.lab_app.state.machines.get(gateway.machine) if gateway else None
        return view.gateway if view else None

    def refresh_data(self) -> None:
        gateway = self.lab_app.lab.gateway
        section = self.section()
        summary = self.query_one("#gateway-summary", Static)
        if gateway is None:
            summary.update("this lab has no gateway: add [b]gateway: {machine: NAME}[/b] to lab.yaml (docs/gateway.md)")
            section = GatewaySection(machine="")
        elif section is None:
            summary.update(shown(f"gateway on [b]{esc(gateway.machine)}[/b]: no data yet (is its agent online?)"))
            section = GatewaySection(machine=gateway.machine)
        else:
            down = [f"{esc(m)} {esc(s)}" for m, s in section.peers.items() if s != LinkStatus.ONLINE]
            source = self.lab_app.lab.source
            key_file = source.parent / GATEWAY_KEY_FILE if source else None
            summary.update(
                shown(
                    f"[b]{esc(section.url or 'NOT SERVING')}[/b] on {esc(section.machine)}"
                    + (f" · [red]{esc(section.error)}[/]" if section.error else "")
                    + (f" · peers: [red]{', '.join(down)}[/]" if down else " · every peer online")
                    + (f" · demo key: {esc(key_file)}" if key_file is not None and key_file.exists() else "")
                )
            )
        self.query_one("#gateway-table", LiveTable).show({f"{m.tier}:{m.name}": m for m in section.models})
        self.query_one("#gateway-spend", Static).update(shown(spend_text(section)))
