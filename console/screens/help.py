"""`?`: every key of the current view and every view reachable with `:`."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from console.views import VIEWS

GLOBAL_KEYS = [
    ("?", "this help"),
    (":", "jump to a view by name (:fleet, :jobs, :models ...)"),
    ("esc", "back"),
    ("q", "quit"),
]


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 80; height: auto; max-height: 90%; border: thick $accent; background: $surface; padding: 1 2; }
    """

    def __init__(self, bindings: list[tuple[str, str]]):
        super().__init__()
        self.view_bindings = bindings

    def compose(self) -> ComposeResult:
        lines = ["[b]Keys of this view[/b]"]
        lines += [f"  [b cyan]{key:<10}[/] {desc}" for key, desc in self.view_bindings] or ["  (none)"]
        lines += ["", "[b]Everywhere[/b]"] + [f"  [b cyan]{key:<10}[/] {desc}" for key, desc in GLOBAL_KEYS]
        lines += ["", "[b]Views[/b] (type : then the name)"] + [f"  [b cyan]:{name:<9}[/] {desc}" for name, (_, _, desc) in VIEWS.items()]
        with VerticalScroll():
            yield Static("\n".join(lines))
