"""What tests/e2e/tui/test_remote_text.py, tests/fast/tui/test_hostile_every_view.py,
tests/fast/tui/test_remote_text.py share: SIZE, MARKUP, ESCAPES, HOSTILE, SHOWN, shown_text, check_screen."""

from __future__ import annotations

from textual.geometry import Region
from textual.widgets import DataTable, Log, OptionList, Static

from console.tui.app import CetlabApp
from widgets.wire import visible

SIZE = (200, 60)


# markup that crashes a parser ([/x]), a live action link, a style; a terminal escape (clear screen, set the title) and a
# right-to-left override
MARKUP = "[/x] [@click=app.quit]x[/] [bold]b [bold red]r[/] [link=https://evil.example]l[/link]"


# a clipboard write (OSC 52), a title set, a screen clear, a terminal query (its answer would be typed as input)
ESCAPES = "\x1b]52;c;cm0gLXJmIH4=\x07 \x1b[2J\x1b]0;pwn\x07 \x1b[6n\x1b[c"


HOSTILE = MARKUP + " " + ESCAPES + " \u202eevil"


SHOWN = visible(HOSTILE)  # what the console shows: the text as typed, control characters as visible stand-ins


def shown_text(app: CetlabApp) -> str:
    """Every string the screen shows now (tables' cells, statics, logs, option lists), the toasts left out."""
    parts: list[str] = []
    toasts = set(app.screen.query("Toast"))  # by its CSS type name: the class lives in a private module
    for widget in app.screen.query("*"):
        if widget in toasts:
            continue
        if isinstance(widget, DataTable):
            parts += [str(cell) for i in range(widget.row_count) for cell in widget.get_row_at(i)]
        elif isinstance(widget, Log):
            parts += list(widget.lines)
        elif isinstance(widget, OptionList):
            parts += [str(widget.get_option_at_index(i).prompt) for i in range(widget.option_count)]
        elif isinstance(widget, Static):
            rendered = widget.render()  # a markup string is parsed here: `[/x]` raised, `[@click]` became a link
            parts.append(getattr(rendered, "plain", str(rendered)))
    return "\n".join(parts)


def check_screen(app: CetlabApp) -> str:
    """The screen renders, shows no control character, and its screenshot carries no link; returns its text."""
    text = shown_text(app)
    toasts = "".join(f"{n.title} {n.message}" for n in app.notices)
    assert "\x1b" not in toasts and "\u202e" not in toasts
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert "\ue000" not in text and "\ue001" not in text  # esc()'d text shown without shown(): its brackets would be lost
    svg = app.export_screenshot()  # renders every visible widget, as the terminal would get it
    assert "\u202e" not in svg and "\x1b" not in svg
    assert "app.quit" not in "".join(str(meta) for meta in _metas(app)), "a live action link"
    return text


def _metas(app: CetlabApp) -> list[dict]:
    """The meta (where @click lives) of every segment each shown widget of the screen renders now."""
    metas = []
    for widget in app.screen.query("*"):
        width, height = widget.region.size
        if not widget.display or not width or not height:
            continue
        for strip in widget.render_lines(Region(0, 0, width, height)):
            metas += [segment.style.meta for segment in strip if segment.style is not None]
    return [m for m in metas if m]
