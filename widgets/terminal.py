"""Text that came off the wire, for a plain terminal (the CLI's human output): no terminal control sequence, no bidi override.

The same characters as the console hides (widgets/wire.py), without Textual: each maps to ONE visible character. C0 controls
(ESC, CR, BEL ...) as their control pictures (␛ ␍ ␇), DEL as ␡, C1 controls and bidi/line format characters as the replacement
character. Newline and tab stay: a multi-line error keeps its lines.
"""

from __future__ import annotations

import logging

_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"  # marks, embeddings, overrides, isolates
_LINES = "\u2028\u2029"  # Unicode line and paragraph separators
_TABLE = {c: 0x2400 + c for c in range(0x20) if chr(c) not in "\n\t"}
_TABLE[0x7F] = 0x2421
_TABLE.update({c: 0xFFFD for c in range(0x80, 0xA0)})
_TABLE.update({ord(c): 0xFFFD for c in _BIDI + _LINES})
_BAD = frozenset(chr(c) for c in _TABLE)
TABLE: dict[int, int] = dict(_TABLE)  # the console's table starts from this one (widgets/wire.py)


def visible(value: object) -> str:
    """`value` as a string with every control character and bidi override replaced by a visible one (same length)."""
    s = value if isinstance(value, str) else str(value)
    return s.translate(_TABLE) if not _BAD.isdisjoint(s) else s


class VisibleFormatter(logging.Formatter):
    """A log line as `visible` shows it: a message logged from the wire (an error reply's text, a peer's name) reaches
    the terminal with its control characters as pictures, whichever logger and whatever arguments carried it."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))


def log_visibly(level: int = logging.WARNING) -> logging.Handler:
    """Route the process's logging to stderr through VisibleFormatter (Python's last-resort handler writes raw)."""
    handler = logging.StreamHandler()
    handler.setFormatter(VisibleFormatter("%(message)s"))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h.formatter, VisibleFormatter)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
