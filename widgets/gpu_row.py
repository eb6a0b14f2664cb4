"""One GPU as one line: utilisation with its sparkline, VRAM, temperature, power, owner; fitted to the width it has."""

from __future__ import annotations

from rich.text import Text

from agents.wire.protocol import GpuSample
from widgets.format import Thresholds, bar, fmt, fmt_bytes, level_colour, spark
from widgets.wire import safe_text

SPARK_WIDTH = 16
NAME_WIDTH = 24
OWNER_MIN = 12  # an owner cut shorter than this says nothing: the line gives up its bars for it first
OWNER_FULL = 20  # an owner this long ("model llama-3.1-8b…") is worth the GPU name's width and the sparkline, not the bars
# (sparkline, bar, GPU name) widths, widest first: a narrow line drops the sparkline, then shortens the name (the owner
# comes before the name's full width), then shrinks the bars; utilisation %, VRAM, temperature and power always stay
LAYOUTS = (
    (SPARK_WIDTH, 8, NAME_WIDTH),
    (0, 8, NAME_WIDTH),
    (0, 8, 16),
    (0, 6, 16),
    (0, 6, 12),
    (0, 4, 12),
    (0, 0, 12),
    (0, 0, 10),
)
# vendor words a shortened name drops before it is cut: "NVIDIA GeForce RTX 3050" in 12 cells is "RTX 3050"
NAME_NOISE = ("NVIDIA ", "GeForce ")


def gpu_line(
    gpu: GpuSample,
    util_history: list[float],
    owner: str | None,
    limits: Thresholds,
    stale: bool = False,
    width: int | None = None,
    layout: int | None = None,
    name_cap: int = NAME_WIDTH,
) -> Text:
    """One GPU as a line of at most `width` cells (None: as wide as it likes); `stale` (its machine is offline) greys it out.

    `layout` (an index into LAYOUTS) forces one, so that a card's lines keep their columns aligned; by default the
    widest that fits. The owner comes last and takes what is left, cut with an ellipsis. `name_cap`: the widest the
    name column need be (a card's longest GPU name): the room it does not need goes to the bars and the owner.
    """
    owner_part = f"  {owner}" if owner else ""
    if width is None:
        line = _line(gpu, util_history, limits, *_capped(LAYOUTS[0], name_cap))
    else:
        chosen = fit_layout(gpu, owner, width, name_cap) if layout is None else layout
        line = _line(gpu, util_history, limits, *_capped(LAYOUTS[chosen], name_cap))
        if line.cell_len + _owner_room(owner) > width:
            line.rstrip()  # the power column's padding can go at the end of a line
        room = width - line.cell_len
        if room < _owner_room(owner):
            owner_part = ""
        elif len(owner_part) > room:
            owner_part = owner_part[: room - 1] + "…"
    if owner_part and not gpu.failed:
        line.append(owner_part, style="magenta")
    if width is not None:
        line.truncate(width)
    if stale:
        line.stylize("grey50")
    return safe_text(line)  # the GPU's name, its failure and its owner are the agent's: control characters shown visibly


def _owner_room(owner: str | None) -> int:
    """The fewest cells worth giving the owner: an owner cut shorter than OWNER_MIN says nothing."""
    return min(len(owner) + 2, OWNER_MIN + 2) if owner else 0


def _capped(layout: tuple[int, int, int], name_cap: int) -> tuple[int, int, int]:
    spark_width, bar_width, name_width = layout
    return spark_width, bar_width, max(1, min(name_width, name_cap))


def fit_layout(gpu: GpuSample, owner: str | None, width: int, name_cap: int = NAME_WIDTH) -> int:
    """The widest layout (an index into LAYOUTS) that fits `width` with room for the owner, else without it.

    The whole owner (up to OWNER_FULL) first, in a layout that keeps the bars: the name is shortened for it; then the
    owner cut to OWNER_MIN, down to the last layout (the name in 10 cells); only then the line goes without it.
    """
    used = [len(_line(gpu, [], Thresholds(), *_capped(layout, name_cap)).plain.rstrip()) for layout in LAYOUTS]
    whole = min(len(owner) + 2, OWNER_FULL + 2) if owner else 0
    with_whole = next((i for i, layout in enumerate(LAYOUTS) if layout[1] and used[i] + whole <= width), None)
    if with_whole is not None:
        return with_whole
    with_owner = next((i for i in range(len(LAYOUTS)) if used[i] + _owner_room(owner) <= width), None)
    if with_owner is not None:
        return with_owner
    return next((i for i, cells in enumerate(used) if cells <= width), len(LAYOUTS) - 1)


def _line(
    gpu: GpuSample, util_history: list[float], limits: Thresholds, spark_width: int, bar_width: int, name_width: int
) -> Text:
    """The line without its owner, in one layout."""
    line = Text()
    name = short_name(gpu.name, name_width)
    line.append(f"gpu{gpu.index} {name:<{name_width}}", style="bold")
    if gpu.failed:
        line.append(f"  FAILED: {gpu.failed}", style="bold red")
        return line
    util = gpu.util_pct
    line.append(f" {bar(util, bar_width)} " if bar_width else " ", style="cyan")
    line.append(fmt(util, ">3.0f", "%") + (" " if spark_width else ""), style="bold cyan")
    if spark_width:
        line.append(spark(util_history, spark_width, 0, 100), style="cyan")
    used, total = gpu.mem_used_bytes, gpu.mem_total_bytes
    vram_pct = used / total * 100 if used is not None and total else None
    vram_style = level_colour(vram_pct, limits.vram_warn_pct, limits.vram_alert_pct)
    line.append("  VRAM ", style="dim")
    if bar_width:
        line.append(bar(vram_pct, bar_width), style=vram_style)
    line.append(
        f"{' ' if bar_width else ''}{fmt_bytes(used):>6}/{fmt_bytes(total):<6}{fmt(vram_pct, '>3.0f', '%')}", style=vram_style
    )
    temp = gpu.temp_c
    line.append(f"  {fmt(temp, '>3.0f', '°C')}", style=level_colour(temp, limits.temp_warn_c, limits.temp_alert_c))
    power, limit = gpu.power_w, gpu.power_limit_w
    power_style = "yellow" if power is not None and limit and power >= 0.9 * limit else "default"
    line.append(f"  {fmt(power, '>4.0f')}/{fmt(limit, '.0f', 'W'):<5}", style=power_style)
    return line


def short_name(name: str, width: int) -> str:
    """`name` in at most `width` cells: whole if it fits, else without its vendor words, else cut with an ellipsis."""
    if len(name) <= width:
        return name
    for noise in NAME_NOISE:
        name = name.replace(noise, "", 1)
        if len(name) <= width:
            return name
    return name[: width - 1] + "…"


class GpuLines:
    """A machine's GPUs as lines fitted to one width in one layout (columns aligned), each rebuilt only when what it
    shows, the width or the card's layout has changed."""

    def __init__(self) -> None:
        self._keys: dict[int, tuple[object, ...]] = {}  # what each line shows: redrawn only when it changes
        # what each line was drawn from (gpu, its utilisation history, owner, limits, stale): redrawn as is on a new width
        self._args: dict[int, tuple[GpuSample, list[float], str | None, Thresholds, bool]] = {}
        self._layouts: dict[int, int] = {}  # the widest layout each line fits alone
        self._fitted_for: dict[
            int, tuple[str, str | None, str | None]
        ] = {}  # the (name, failed, owner) each line's layout was found for
        self.layout: int | None = None  # the card's: the narrowest any of its lines needs
        self.lines: dict[int, Text] = {}
        self.width: int | None = None  # None: lines as wide as they like (before the first layout)
        self.name_cap = NAME_WIDTH  # the longest GPU name (at most NAME_WIDTH) of the card, or of the fleet once aligned
        # set by `align` (the fleet): the longest name and the narrowest layout of every card, so columns line up across cards
        self.fleet_name_cap = 0
        self.fleet_layout = 0

    def show(self, gpu: GpuSample, util_history: list[float], owner: str | None, limits: Thresholds, stale: bool = False) -> bool:
        """Update one GPU's line; True when it (or, through the card's layout, another) changed."""
        shown = (
            gpu.index,
            gpu.name,
            gpu.failed,
            gpu.util_pct,
            gpu.mem_used_bytes,
            gpu.mem_total_bytes,
            gpu.temp_c,
            gpu.power_w,
            gpu.power_limit_w,
        )
        key = (shown, tuple(util_history[-SPARK_WIDTH:]), owner, limits, stale)
        if self._keys.get(gpu.index) == key:
            return False
        self._keys[gpu.index] = key
        self._args[gpu.index] = (gpu, util_history[-SPARK_WIDTH:], owner, limits, stale)
        name_cap = self._name_cap()
        if name_cap != self.name_cap:  # every line's fit moves with it
            self.name_cap = name_cap
            self.lines = {}  # all redrawn
            width, self.width = self.width, -1
            self.fit(width)
            return True
        fitted_for = self._fitted_for.get(gpu.index)
        if self.width is not None and fitted_for != (
            gpu.name,
            gpu.failed,
            owner,
        ):  # the figures are fixed-width: only these move it
            self._fitted_for[gpu.index] = (gpu.name, gpu.failed, owner)
            self._layouts[gpu.index] = fit_layout(gpu, owner, self.width, self.name_cap)
        if not self._relayout():
            self.lines[gpu.index] = self._draw(gpu.index)
        return True

    def _name_cap(self) -> int:
        own = max((len(args[0].name) for args in self._args.values()), default=0)
        return min(NAME_WIDTH, max(own, self.fleet_name_cap))

    def wanted(self) -> tuple[int, int]:
        """(the longest GPU name, the narrowest layout any line needs) of this card alone, for the fleet's `align`."""
        own = max((len(args[0].name) for args in self._args.values()), default=0)
        return min(NAME_WIDTH, own), max(self._layouts.values(), default=0)

    def align(self, name_cap: int, layout: int) -> bool:
        """Take the fleet's name column and layout (each at least this card's own); True when the lines changed."""
        changed = False
        if name_cap != self.fleet_name_cap:
            self.fleet_name_cap = name_cap
            if self._name_cap() != self.name_cap:
                self.name_cap = self._name_cap()
                width, self.width = self.width, -1  # every line's fit moves with the name column
                self.fit(width)
                changed = True
        if layout != self.fleet_layout:
            self.fleet_layout = layout
            changed |= self._relayout()
        return changed

    def fit(self, width: int | None) -> bool:
        """Redraw every line for a new width; True when the width changed."""
        if width == self.width:
            return False
        self.width = width
        self._layouts = (
            {} if width is None else {i: fit_layout(args[0], args[2], width, self.name_cap) for i, args in self._args.items()}
        )
        self._fitted_for = {i: (args[0].name, args[0].failed, args[2]) for i, args in self._args.items()}
        self.layout = None
        self._relayout()
        return True

    def _relayout(self) -> bool:
        """Redraw every line when the card's layout changes; True when it did."""
        layout = max([*self._layouts.values(), self.fleet_layout]) if self._layouts else None
        if layout == self.layout and len(self.lines) == len(self._args):  # the lines' keys are always among the args'
            return False
        self.layout = layout
        self.lines = {index: self._draw(index) for index in self._args}
        return True

    def _draw(self, index: int) -> Text:
        gpu, history, owner, limits, stale = self._args[index]
        return gpu_line(gpu, history, owner, limits, stale, width=self.width, layout=self.layout, name_cap=self.name_cap)

    def keep(self, indices: set[int]) -> bool:
        """Forget GPUs no longer reported; True when one went."""
        gone = set(self.lines) - indices
        for index in gone:
            del self.lines[index], self._keys[index], self._args[index]
            self._layouts.pop(index, None)
            self._fitted_for.pop(index, None)
        if gone:
            self._relayout()
        return bool(gone)

    def text(self) -> Text:
        return Text("\n").join(self.lines[i] for i in sorted(self.lines))
