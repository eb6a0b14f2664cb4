"""The header every view shows: lab, machines online, GPUs, VRAM, SIM, cost, view name."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

from widgets.format import GIB


def header_text(lab: str, view: str, online: int, machines: int, gpus: int, vram_bytes: int,
                simulated: bool, readonly: bool, now: float, cost: Text | str | None = None) -> Text:
    line = Text()
    line.append(" cetlab ", style="bold black on cyan")
    line.append(f" {lab} ", style="bold")
    line.append(f"· {view} ", style="italic")
    line.append(f"· {online}/{machines} machines online ", style="green" if online == machines else "bold red")
    line.append(f"· {gpus} GPUs · {vram_bytes / GIB:.0f} GiB VRAM ")
    if simulated:
        line.append(" SIM ", style="bold black on yellow")
    if readonly:
        line.append(" READ-ONLY ", style="bold white on blue")
    if cost:
        line.append("  ")
        line.append(cost if isinstance(cost, Text) else Text(cost))
    line.append(f"  {time.strftime('%H:%M:%S', time.localtime(now))}", style="dim")
    return line


class LabHeader(Static):
    DEFAULT_CSS = "LabHeader { height: 1; background: $boost; }"

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.text: Text | None = None  # the line shown now

    def show(self, text: Text) -> None:
        if text != self.text:
            self.text = text
            self.update(text, layout=False)  # one line, always
