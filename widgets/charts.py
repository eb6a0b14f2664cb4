"""A history chart on a fixed scale (0 to a stated top), its scale written beside it: 20-40% draws low, not full."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

_EIGHTHS = " ▁▂▃▄▅▆▇█"


def chart_rows(values: list[float], width: int, rows: int, top: float) -> list[str]:
    """The last `width` values as `rows` lines of blocks (top line first), 0 at the bottom edge and `top` at the top;
    newest at the right, values above `top` clipped to it."""
    values = values[-width:] if width > 0 else []
    levels = [_level(v, top, rows) for v in values]
    lines = []
    for row in range(rows):  # row 0 is the top line
        floor = (rows - 1 - row) * 8
        lines.append("".join(_EIGHTHS[max(0, min(8, level - floor))] for level in levels).rjust(width))
    return lines


def _level(value: float, top: float, rows: int) -> int:
    """How many eighths of the chart's height `value` fills; anything above 0 shows at least one."""
    if top <= 0 or value <= 0:
        return 0
    return max(1, round(min(1.0, value / top) * rows * 8))


def chart_text(values: list[float], width: int, rows: int, top: float, top_label: str, zero_label: str) -> Text:
    """The chart with its scale on the left: `top_label` by the top line, `zero_label` by the bottom one."""
    label_width = max(len(top_label), len(zero_label))
    lines = chart_rows(values, max(0, width - label_width - 1), rows, top)
    text = Text()
    for row, line in enumerate(lines):
        label = top_label if row == 0 else zero_label if row == rows - 1 else ""
        text.append(f"{label:>{label_width}}┤", style="dim")
        text.append(line, style="cyan")
        if row < rows - 1:
            text.append("\n")
    return text


class ScaleChart(Widget):
    """A chart of one series on a fixed scale; give it values, the top of its scale and how to label both ends."""

    DEFAULT_CSS = "ScaleChart { height: 2; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.values: list[float] = []
        self.top = 1.0
        self.labels = ("", "0")
        self._shown: tuple[tuple[float, ...], float, str, str] | None = None

    def show(self, values: list[float], top: float | None, top_label: str, zero_label: str = "0") -> None:
        """Chart `values` from 0 to `top` (None: not known yet, then the largest value so far, so nothing overflows)."""
        top = top if top else max(values, default=0.0) or 1.0
        shown = (tuple(values), top, top_label, zero_label)
        if shown != self._shown:
            self._shown = shown
            self.values, self.top, self.labels = list(values), top, (top_label, zero_label)
            self.refresh()

    def render(self) -> Text:
        return chart_text(self.values, self.size.width, max(1, self.size.height), self.top, *self.labels)
