"""The Fleet view: one card per machine, one row per GPU, live."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Static

from agents.runtime.view import MachineView
from agents.wire.catalogue.verbs import lacking_said
from agents.wire.lab.replicas import models_on
from console.tui.screens.base import LabScreen
from widgets.lab_header import LabHeader
from widgets.machine_card import MachineCard
from widgets.wire import esc


def alert_badges(view: MachineView, workstation_lab: str | None = None) -> list[str]:
    failed = [f"✖ {f.section} failed" for f in view.faults.failed if view.online]  # a component that fails: its section is stale
    drift = [f"lab.yaml {view.lab_version} ≠ {workstation_lab}"] if view.online and view.lab_differs(workstation_lab) else []
    return failed + drift + [f"⚠ {a.rule}" for a in view.alerts.active if not a.acked][:3]


def card_note(view: MachineView) -> str | None:
    """The card's note line (markup): the GPU backend's status, then each failing section with its error: the agent's text."""
    lines = [esc(view.gpu_status.status)] if view.gpu_status and view.gpu_status.status else []
    if view.online:  # an offline card says so, not what failed before
        lines += [esc(f"{f.section} failed ({f.phase}): {f.error}") for f in view.faults.failed]
        if view.lab is not None and view.lab.restart_pending:
            lines.append(esc(f"lab.yaml at the next start: {', '.join(view.lab.restart_pending)}"))
        lacks = view.lacking()
        lines += [esc(lacking_said(view.agent_version, lacks))] if lacks else []
    return "\n".join(lines) or None


class FleetScreen(LabScreen):
    VIEW_NAME = "fleet"
    CLOCK_S = 1.0  # an offline card's "last seen ... ago"
    BINDINGS = [
        Binding("enter", "open_machine", "Machine"),
        Binding("down", "move(1)", "Next", show=False),  # j / k / g / G come with every view
        Binding("up", "move(-1)", "Previous", show=False),
    ]

    def compose(self) -> ComposeResult:
        yield LabHeader()
        self.cards = [MachineCard(name, id=f"card-{name}") for name in self.lab_app.state.machines]
        self.nothing = Static("", id="fleet-nothing")
        self.nothing.display = False
        self.scroll = VerticalScroll(self.nothing, *self.cards, id="fleet")
        yield self.scroll
        yield Footer()

    aligning = False  # an align_cards is scheduled (after the cards' resizes)

    def on_mount(self) -> None:
        self.refresh_data()
        if self.cards:
            self.cards[0].focus()

    def apply_filter(self, text: str) -> None:
        """`/` on the fleet: only the cards of machines whose name, role, GPUs, models or jobs hold the text."""
        needle = text.casefold()
        for card in self.cards:
            card.display = needle in self.searched(card.machine).casefold()
        self.nothing.display = bool(needle) and not self._cards()
        self.nothing.update(Text(f"no machine matches {text!r} (name, role, GPU, model, job); / and enter on nothing shows all"))

    def searched(self, machine: str) -> str:
        """What `/` looks in for one machine: name, role, its GPUs' names, its lab.yaml models, what holds its GPUs."""
        view = self.lab_app.state.machines[machine]
        models = [m.name for m in models_on(self.lab_app.lab, machine)]
        return " ".join(
            [machine, view.config.role or "", *(g.name for g in view.gpus.values()), *models, *view.gpu_owners().values()]
        )

    def refresh_data(self) -> None:
        state = self.lab_app.state
        limits = self.thresholds()
        scroll = self.scroll
        top, bottom = scroll.scroll_offset.y, scroll.scroll_offset.y + scroll.size.height
        for card in self.cards:  # kept from compose: a query walks every widget of the fleet, each time
            region = card.virtual_region
            if card.shown_version is not None and (region.bottom < top or region.y > bottom):
                continue  # off screen: drawn when scrolled into view (its version is still behind)
            view = state.machines[card.machine]
            if card.shown_version == view.version and view.online:
                continue  # offline cards still tick: "last seen ... ago" moves
            card.show(
                version=view.version,
                role=view.config.role,
                link=view.link,
                error=view.error,
                last_seen=view.last_seen,
                host=view.host,
                gpus=view.gpus,
                util_history={i: view.spark(f"gpu{i}.util_pct") for i in view.gpus},
                owners=view.gpu_owners(),
                simulated=view.simulated,
                gpu_status=card_note(view),
                limits=limits,
                now=self.lab_app.clock(),
                badges=alert_badges(view, state.lab_version),
                agent_version=view.agent_version,
            )

        self.align_cards()

    def align_cards(self) -> None:
        """One name column and one layout for every card's GPU lines: the longest name, the narrowest layout any needs."""
        wanted = [card.wanted_columns() for card in self.cards]
        if not wanted:
            return
        name_cap = max(name for name, _ in wanted)
        for card in self.cards:  # the name column first: each card's own layout is found for it
            card.align_columns(name_cap, 0)
        layout = max(card.wanted_columns()[1] for card in self.cards)
        for card in self.cards:
            card.align_columns(name_cap, layout)

    def on_machine_card_refitted(self) -> None:
        # every card fits itself on a resize, one message each: the fleet lines them up once, after them all
        if not self.aligning:
            self.aligning = True
            self.call_after_refresh(self._align_now)

    def _align_now(self) -> None:
        self.aligning = False
        self.align_cards()

    @property
    def aligned(self) -> bool:
        """Every shown card fitted to its width and lined up with the others (no alignment pending)."""
        return not self.aligning and all(card.fitted for card in self._cards())

    def _cards(self) -> list[MachineCard]:
        return [card for card in self.cards if card.display]

    def action_move(self, step: int) -> None:
        """j / k: the next or the previous machine's card."""
        cards = self._cards()
        if not cards:
            return
        current = self.focused if isinstance(self.focused, MachineCard) else None
        index = cards.index(current) if current in cards else -step
        self._focus(cards[(index + step) % len(cards)])

    def action_move_to_end(self, bottom: bool) -> None:
        """g / G: the first or the last machine."""
        cards = self._cards()
        if cards:
            self._focus(cards[-1] if bottom else cards[0])

    def _focus(self, card: MachineCard) -> None:
        card.focus()
        card.scroll_visible()

    def action_open_machine(self) -> None:
        if isinstance(self.focused, MachineCard):
            from console.tui.screens.machine import MachineScreen

            self.app.push_screen(MachineScreen(self.focused.machine))
