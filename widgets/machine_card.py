"""A machine as a card: role, link state, CPU / RAM / disk, then one line per GPU (one widget for them all: a
fleet of 256 machines is ~800 widgets to lay out, not ~2,800)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.events import Resize
from textual.message import Message
from textual.widgets import Static

from agents.wire.protocol import GpuSample, HostSample, LinkStatus
from widgets.format import Thresholds, bar, fmt, fmt_ago, fmt_bytes
from widgets.gpu_row import GpuLines
from widgets.wire import safe_text, shown

# header_line's arguments but the width: (name, role, link, error, last_seen, host, simulated, badges, now, agent_version)
HeaderArgs = tuple[str, str, LinkStatus, str | None, float | None, HostSample, bool, list[str], float, str | None]


def header_line(
    name: str,
    role: str,
    link: LinkStatus,
    error: str | None,
    last_seen: float | None,
    host: HostSample,
    simulated: bool,
    badges: list[str],
    now: float,
    agent_version: str | None = None,
    width: int | None = None,
) -> Text:
    """The card's first line; the host figures that do not fit `width` (None: no limit) drop, load first, then disk, then RAM.
    Text, never markup; control characters in the agent's strings (role, error, badges) shown visibly."""
    line = Text()
    line.append(name, style="bold")
    if role:
        line.append(f"  {role}", style="dim")
    if simulated:
        line.append("  SIM", style="bold black on yellow")
    for badge in badges:
        line.append(f"  {badge}", style="bold white on red")
    if link != LinkStatus.ONLINE:
        label = {
            LinkStatus.CONNECTING: "CONNECTING",
            LinkStatus.UNTRUSTED: "UNTRUSTED HOST KEY",
            LinkStatus.REFUSED: "REFUSED",
        }.get(link, "OFFLINE")
        line.append(f"  {label}", style="bold red" if link != LinkStatus.CONNECTING else "yellow")
        line.append(f"  last seen {fmt_ago(last_seen, now)}", style="dim")
        if error:
            line.append(f"\n  {error}", style="red")
        return safe_text(line)
    line.append("  ● online", style="green")
    figures = [
        f"   CPU {bar(host.cpu_pct, 6)} {fmt(host.cpu_pct, '>3.0f', '%')}",
        f"   RAM {fmt_bytes(host.ram_used_bytes)}/{fmt_bytes(host.ram_total_bytes)}",
        f"   disk {fmt_bytes(host.disk_used_bytes)}/{fmt_bytes(host.disk_total_bytes)}",
    ]
    if host.load_1 is not None:
        figures.append(f"   load {host.load_1:.2f}")
    if agent_version:  # the cetlab its agent runs: the first to go where the card is narrow
        figures.append(f"   cetlab {agent_version}")
    room = None if width is None else width - line.cell_len
    for figure in figures:
        if room is not None and len(figure) > room:
            break  # in order of importance: what follows matters less
        line.append(
            figure,
            style="dim" if figure.startswith(("   load", "   cetlab")) else "default" if figure.startswith("   CPU") else "",
        )
        room = None if room is None else room - len(figure)
    return safe_text(line)


class MachineCard(Vertical, can_focus=True):
    DEFAULT_CSS = """
    MachineCard { height: auto; border: round $panel-lighten-2; padding: 0 0; margin: 0 0 0 0; }
    MachineCard:focus { border: round $accent; }
    MachineCard.offline { border: round $error; color: $text-muted; }
    MachineCard > .card-header { padding: 0 1; height: auto; }
    MachineCard > .card-note { padding: 0 1; color: $warning; height: auto; }
    MachineCard > .card-gpus { padding: 0 1; height: auto; }
    """

    def __init__(self, machine: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.machine = machine
        self._header = Static("", classes="card-header")
        self._note = Static("", classes="card-note")
        self._gpus = Static("", classes="card-gpus")
        self._lines = GpuLines()
        self._note_markup: str | None = None  # the note shown now (markup)
        self.header: Text | None = None  # the header line shown now
        self._header_args: HeaderArgs | None = None  # what the header was drawn from: redrawn as is when the width changes
        self._width: int | None = None  # the content width (None before the first layout)
        self.shown_version: int | None = None  # the machine's LabState version drawn last

    def compose(self) -> ComposeResult:
        yield self._header
        yield self._note
        yield self._gpus

    @property
    def gpu_lines(self) -> list[Text]:
        """The GPU lines shown, in GPU index order."""
        return [self._lines.lines[i] for i in sorted(self._lines.lines)]

    @property
    def fitted(self) -> bool:
        """The card has its width (a first resize) and its GPU lines are fitted to it."""
        return self._width is not None

    def wanted_columns(self) -> tuple[int, int]:
        """(longest GPU name, narrowest layout) this card's GPU lines need alone: the fleet aligns every card to the most."""
        return self._lines.wanted()

    def align_columns(self, name_cap: int, layout: int) -> None:
        """Draw the GPU lines with the fleet's name column and layout, so that columns line up across machines."""
        if self._lines.align(name_cap, layout):
            self._gpus.update(self._lines.text())

    def on_resize(self, event: Resize) -> None:
        """Fit the header and the GPU lines to the card's new width (a split pane, a resized terminal)."""
        width = event.size.width - self.styles.gutter.width - self._gpus.styles.gutter.width
        if width <= 0 or width == self._width:
            return
        self._width = width
        if self._header_args is not None:
            self._show_header(header_line(*self._header_args, width=width), relayout=True)  # it may have wrapped before
        if self._lines.fit(width):
            self._gpus.update(self._lines.text())  # lines that wrapped no longer do: the height changes
            self.post_message(self.Refitted())  # the fleet lines its cards up again

    class Refitted(Message):
        """The card's GPU lines were fitted to a new width: the layout it needs alone may have changed."""

    def _show_header(self, header: Text, relayout: bool = False) -> None:
        if header != self.header:
            lines_before = None if self.header is None else self.header.plain.count("\n")
            self.header = header
            self._header.update(
                header, layout=relayout or header.plain.count("\n") != lines_before
            )  # relayout only when its height changes

    def show(
        self,
        *,
        version: int | None = None,
        role: str,
        link: LinkStatus,
        error: str | None,
        last_seen: float | None,
        host: HostSample,
        gpus: dict[int, GpuSample],
        util_history: dict[int, list[float]],
        owners: dict[int, str],
        simulated: bool,
        gpu_status: str | None,
        limits: Thresholds,
        now: float,
        badges: list[str] | None = None,
        agent_version: str | None = None,
    ) -> None:
        self.shown_version = version
        self._header_args = (self.machine, role, link, error, last_seen, host, simulated, badges or [], now, agent_version)
        self._show_header(header_line(*self._header_args, width=self._width))
        down = link != LinkStatus.ONLINE
        if self.has_class("offline") != down:
            self.set_class(down, "offline")
        if self._note.display != bool(gpu_status):  # each of these, set even to the same value, costs a relayout
            self._note.display = bool(gpu_status)
        if gpu_status and self._note_markup != gpu_status:
            self._note_markup = gpu_status
            self._note.update(shown(gpu_status))  # markup, with the agent's text in it through esc()
        count_before = len(self._lines.lines)
        changed = self._lines.keep(set(gpus))
        for index in sorted(gpus):
            changed |= self._lines.show(gpus[index], util_history.get(index, []), owners.get(index), limits, stale=down)
        if changed:  # relayout only when the card's height changes
            self._gpus.update(self._lines.text(), layout=len(self._lines.lines) != count_before)
