"""The running cost counter: the lab's rate per hour and today's total, or which price is missing."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from widgets.format import NA, fmt_money


def cost_text(totals: dict[str, Any] | None) -> Text:
    """One line for the header; `totals` as console.lab.costs.live_totals returns it (None: nothing yet)."""
    if totals is None:
        return Text("cost …", style="dim")
    currency = totals["currency"]
    line = Text()
    if totals["per_hour"] is None or totals["today"] is None:
        line.append(f"cost {NA} ({'; '.join(totals['missing']) or 'no figure yet'})", style="bold yellow")
    else:
        line.append(f"{fmt_money(totals['per_hour'], currency)}/h", style="bold")
        line.append(f" · today {fmt_money(totals['today'], currency)}")
        if totals["missing"]:
            line.append(f" ({'; '.join(totals['missing'])})", style="yellow")
    if totals["simulated"]:
        line.append(" SIM power", style="black on yellow")
    if totals["not_counted"]:
        line.append(f" (not counted: {', '.join(totals['not_counted'])})", style="red")
    return line


class CostCounter(Static):
    """The counter as a widget, for views that show it outside the header."""

    DEFAULT_CSS = "CostCounter { height: 1; width: auto; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self._shown: Text | None = None

    def show(self, totals: dict[str, Any] | None) -> None:
        text = cost_text(totals)
        if text != self._shown:
            self._shown = text
            self.update(text)
