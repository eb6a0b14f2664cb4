"""`:`: type a view's name (with completion) and jump there, k9s style."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Input, Static

from console.views import VIEWS


class JumpScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    JumpScreen { align: center top; }
    JumpScreen > Input { width: 60; margin-top: 2; border: tall $accent; }
    JumpScreen > Static { width: 60; color: $text-muted; }
    """

    def compose(self) -> ComposeResult:
        yield Input(placeholder="view name: " + " ".join(VIEWS), suggester=SuggestFromList(list(VIEWS), case_sensitive=False), id="jump")
        yield Static("", id="jump-error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        name = event.value.strip().lstrip(":").lower()
        matches = [v for v in VIEWS if v.startswith(name)] if name else []
        if len(matches) == 1 or name in VIEWS:
            self.dismiss(name if name in VIEWS else matches[0])
        else:
            self.query_one("#jump-error", Static).update(f"no view {name!r}; views: {', '.join(VIEWS)}")

    def action_cancel(self) -> None:
        self.dismiss(None)
