"""The header every view shows: lab, machines online, GPUs, VRAM, SIM, cost, view name, and the clock."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.events import Resize
from textual.widgets import Static

from agents.wire.words import plural
from widgets.format import GIB
from widgets.wire import safe_text


@dataclass(frozen=True)
class HeaderFigures:
    """What the header says, before it is fitted to a width."""

    lab: str
    view: str
    online: int
    machines: int
    gpus: int
    vram_bytes: int
    simulated: bool
    readonly: bool
    now: float
    cost: Text | str | None = None
    failed: int = 0  # sections failing on the agents now (a component raising in its tick)


def header_text(figures: HeaderFigures, width: int | None = None) -> Text:
    """The header line; in a narrow terminal the cost keeps only its rate, then the figures shorten, then the cost goes,
    then the lab's name: the clock stays."""
    clock = time.strftime("%H:%M:%S", time.localtime(figures.now))
    # the cost stays longest in its short form (the rate per hour): at 100 columns the header still says what the lab costs.
    # Its notes ("missing: ...", "not counted: m2") go before the figures' words: they come and go with the agents' costs
    # sections, and the count of machines online changed its words with them (at 160 columns, "1/2 machines online"
    # until the first costs section arrived, "1/2 online" after: what the header said depended on a race)
    for cost, short, lab in (
        ("full", False, True),
        ("short", False, True),
        ("short", True, True),
        (None, True, True),
        (None, True, False),
    ):
        line = _left(figures, cost, short, lab)
        if width is None or line.cell_len + len(clock) + 2 <= width:
            break
    line.append(f"  {clock}", style="dim")
    return safe_text(line)


def _short_cost(cost: Text | str) -> Text:
    """The cost counter's first figure (the rate, `0.19 USD/h`, or `cost -`), and SIM where its power is simulated."""
    text = cost if isinstance(cost, Text) else Text(cost)
    plain = text.plain
    cut = plain.find(" · ")
    if cut < 0:
        cut = plain.find(" (")
    short = text[:cut] if cut > 0 else text.copy()
    if "SIM power" in plain:
        short.append(" SIM", style="black on yellow")
    return short


def _left(figures: HeaderFigures, cost: str | None, short: bool, lab: bool) -> Text:
    line = Text()
    line.append(" cetlab ", style="bold black on cyan")
    if lab:
        line.append(f" {figures.lab} ", style="bold")
    line.append(f"· {figures.view} ", style="italic")
    online, machines = figures.online, figures.machines
    line.append(
        f"· {online}/{machines} {'online' if short else 'machines online'} ", style="green" if online == machines else "bold red"
    )
    vram = f"{figures.vram_bytes / GIB:.0f}"
    gpus = plural(figures.gpus, "GPU")
    line.append(f"· {gpus} {vram}G " if short else f"· {gpus} · {vram} GiB VRAM ")
    if figures.simulated:
        line.append(" SIM ", style="bold black on yellow")
    if figures.failed:
        line.append(
            f" {figures.failed} FAILED " if short else f" {figures.failed} SECTION{'S' if figures.failed > 1 else ''} FAILED ",
            style="bold white on red",
        )
    if figures.readonly:
        line.append(" RO " if short else " READ-ONLY ", style="bold white on blue")
    if cost and figures.cost:
        line.append("  ")
        if cost == "short":
            line.append(_short_cost(figures.cost))
        else:
            line.append(figures.cost if isinstance(figures.cost, Text) else Text(figures.cost))
    return line


class LabHeader(Static):
    DEFAULT_CSS = "LabHeader { height: 1; background: $boost; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self.text: Text | None = None  # the line shown now
        self._figures: HeaderFigures | None = None

    def show(self, figures: HeaderFigures) -> None:
        """Show these figures, fitted to the header's width."""
        self._figures = figures
        self._draw()

    def on_resize(self, _event: Resize) -> None:
        self._draw()

    def _draw(self) -> None:
        if self._figures is None:
            return
        text = header_text(self._figures, self.size.width or None)
        if text != self.text:
            self.text = text
            self.update(text, layout=False)  # one line, always
