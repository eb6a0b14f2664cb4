"""The line a view shows while a section it draws is failing on an agent (or was refused as sent): which machine, which
section, the error."""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.widgets import Static

from agents.wire.sections.base import SectionFault
from widgets.wire import safe_text


def fault_line(machine: str, fault: SectionFault) -> Text:
    """`✖ box: jobs FAILED since 09:12:03 (update): RuntimeError: ...`: plain text, never markup (the error is the agent's)."""
    line = Text()
    # refused: this client refused what the agent sent of it (it does not fit its model); its error names where
    line.append(f"✖ {machine}: {fault.section} {'REFUSED' if fault.phase == 'refused' else 'FAILED'}", style="bold white on red")
    line.append(f" since {time.strftime('%H:%M:%S', time.localtime(fault.since))} ({fault.phase}): ", style="red")
    line.append(fault.error)
    line.append("  (shown as it was before)", style="dim")
    return safe_text(line)


def fault_lines(faults: list[tuple[str, SectionFault]]) -> Text:
    return Text("\n").join(fault_line(machine, fault) for machine, fault in faults)


class SectionFaults(Static):
    """Hidden while nothing fails; else one line per failing section of the view."""

    DEFAULT_CSS = "SectionFaults { height: auto; padding: 0 1; display: none; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self.faults: list[tuple[str, SectionFault]] = []

    def show(self, faults: list[tuple[str, SectionFault]]) -> None:
        if faults == self.faults and self.display == bool(faults):
            return
        self.faults = faults
        self.display = bool(faults)
        self.update(fault_lines(faults))
