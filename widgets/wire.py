"""Text that came off the wire (an agent's job error, a param, an audit row, a GPU name) shown as text: never as
Textual markup, never as terminal control sequences or bidi overrides."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.content import Content

from widgets.terminal import TABLE

# each character that must not reach the terminal maps to ONE visible character, so a Text's spans stay where they were:
# the CLI's table (widgets/terminal.py: C0 controls as their control pictures, DEL as ␡, C1 and bidi/line format
# characters as the replacement character; newline and tab stay).
_TABLE = dict(TABLE)
# esc() hides a wire string's `[` and `\` in a markup string as two private-use characters (so neither markup parser,
# Rich's or Textual's, can read a tag, an escape or an @click in it); shown() parses the markup, then puts them back
_OPEN, _SLASH = "\ue000", "\ue001"
_TABLE.update({ord(_OPEN): 0xFFFD, ord(_SLASH): 0xFFFD})  # never in wire text: they would come back as `[` and `\`
_BAD = frozenset(chr(c) for c in _TABLE)
_HIDE = str.maketrans({"[": _OPEN, "\\": _SLASH})
_UNHIDE = str.maketrans({_OPEN: "[", _SLASH: "\\"})


def visible(value: Any) -> str:
    """`value` as a string with every control character and bidi override replaced by a visible one (same length)."""
    s = value if isinstance(value, str) else str(value)
    return s.translate(_TABLE) if not _BAD.isdisjoint(s) else s


def esc(value: Any) -> str:
    """`value` for a place inside a markup string that shown() renders: visible, its `[` and `\\` hidden from the parser.

    Not rich.markup.escape: Textual's parser reads some escaped strings back with a stray backslash (`['a', '\\[/x]`),
    and a string ending in a backslash escapes the markup's next closing tag.
    """
    return visible(value).translate(_HIDE)


def shown(markup: str) -> Content:
    """A markup string (ours, with the wire's strings in it through esc()) as Textual content: tags applied as Textual
    applies them, the wire's strings literal."""
    parsed = Content.from_markup(markup)
    return Content(parsed.plain.translate(_UNHIDE), list(parsed.spans))  # one character for one: the spans stay where they were


def unhide(value: str) -> str:
    """A string with esc()'d parts, shown as plain text (a toast)."""
    return value.translate(_UNHIDE)


def text(value: Any, style: str = "") -> Text:
    """`value` as a Rich Text (never parsed as markup), visible."""
    return Text(visible(value), style=style, end="")


def safe_cell(cell: Any) -> Any:
    """A table cell as shown: a string that a DataTable would parse as markup (one with a `[`) or that holds a control
    character becomes a Text, a Text has its control characters made visible (its spans kept); anything else as it is."""
    if isinstance(cell, str):
        return text(cell) if "[" in cell or not _BAD.isdisjoint(cell) else cell
    if isinstance(cell, Text) and not _BAD.isdisjoint(cell.plain):
        cell = cell.copy()
        cell.plain = visible(cell.plain)
    return cell


def safe_text(value: Text) -> Text:
    """A Rich Text built from wire strings, with its control characters made visible (its spans kept)."""
    out = safe_cell(value)
    assert isinstance(out, Text)
    return out
