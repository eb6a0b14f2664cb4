"""The text of the console's screen as lines, read through Textual's public screenshot export (no private attributes)."""

from __future__ import annotations

import html
import re
from typing import Any

from textual.app import App

# Rich's SVG export: one <text> per run of styled cells, at x = column * char_width, clipped to its line
_TEXT = re.compile(r'<text [^>]*?x="([0-9.]+)"[^>]*?clip-path="url\(#[^)]*-line-(\d+)\)"[^>]*>(.*?)</text>', re.S)
_CHAR_WIDTH = 20 * 0.61  # rich.console.Console.export_svg: char_height 20, font_aspect_ratio 0.61


def screen_lines(app: App[Any]) -> list[str]:
    """Each line of the current screen as plain text, as `app.export_screenshot()` draws it (blank runs are spaces)."""
    rows: dict[int, list[str]] = {}
    for x, line, text in _TEXT.findall(app.export_screenshot()):
        cells = rows.setdefault(int(line), [])
        column = round(float(x) / _CHAR_WIDTH)
        text = html.unescape(text).replace("\xa0", " ")  # the export writes every space as &#160;
        if len(cells) < column + len(text):
            cells.extend(" " * (column + len(text) - len(cells)))
        cells[column : column + len(text)] = text
    return ["".join(rows.get(y, [])).rstrip() for y in range(max(rows, default=-1) + 1)]
