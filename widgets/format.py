"""Plain formatting shared by the console and the CLI (no Textual): sizes, times, money, one missing-value marker."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from agents.wire.catalogue.gateway import KeyRecord
from agents.wire.sections.gateway import KeyUse
from agents.wire.words import plural as plural  # the one plural rule (re-exported for the views)

NA = "-"  # the one marker for a value nobody measured (a table cell, a CLI column, a header figure)
GIB = 1024**3
_BLOCKS = "▁▂▃▄▅▆▇█"


def fmt(value: float | None, spec: str = ".0f", suffix: str = "") -> str:
    """`value` in format `spec` with `suffix`, or NA."""
    return NA if value is None else f"{value:{spec}}{suffix}"


def fmt_bytes(n: float | None) -> str:
    """Binary units, one decimal: 1.5G is 1.5 GiB."""
    if n is None:
        return NA
    for unit, size in (("T", 1024**4), ("G", GIB), ("M", 1024**2), ("K", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}B"


def fmt_gib(n: float | None) -> str:
    """A model's or a GPU's memory in GiB: one decimal under 10 G (4.5G), whole above (24G)."""
    if not n:
        return NA
    gib = n / GIB
    return f"{gib:.1f}G" if gib < 10 else f"{gib:.0f}G"


def fmt_gpus(gpus: list[int], empty: str = NA) -> str:
    """GPU indices as a narrow column shows them whole: a run of three or more is a range (`1,2,3,4` is `1-4`)."""
    runs: list[list[int]] = []
    for index in gpus:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    parts = [f"{r[0]}-{r[-1]}" if len(r) >= 3 else ",".join(map(str, r)) for r in runs]
    return ",".join(parts) or empty


def machines_text(machine: str, nodes: Sequence[str] = ()) -> str:
    """The machines a job or a recipe runs on, as every view says it: `m5`, or a multi-node one's nodes `m5+irina`."""
    return "+".join(nodes) or machine


def placement(machine: str, gpus: list[int], nodes: Sequence[str] = ()) -> str:
    """Where a job or a recipe runs: `m5 GPU 0,1`, or a multi-node one's `m5+irina` (each node's GPUs are its own)."""
    if len(nodes) > 1:
        return machines_text(machine, nodes)
    return f"{machine} GPU {','.join(map(str, gpus)) or NA}"


def fmt_limit(value: float) -> str:
    """A param's bound as a person writes it: 100000, not 100000.0."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return NA
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def fmt_secs(seconds: float | None) -> str:
    """Short operations (saves, loads): hundredths below a minute (they are often sub-second), else minutes and seconds."""
    if seconds is None:
        return NA
    return f"{seconds:.2f}s" if seconds < 60 else f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"


def fmt_ago(t: float | None, now: float | None = None) -> str:
    if t is None:
        return "never"
    return f"{fmt_duration((now or time.time()) - t)} ago ({time.strftime('%H:%M:%S', time.localtime(t))})"


def fmt_time(t: float | None, pattern: str = "%Y-%m-%d %H:%M:%S") -> str:
    """A wall time in local time, or NA."""
    return NA if t is None else time.strftime(pattern, time.localtime(t))


def fmt_money(value: float | None, currency: str) -> str:
    if value is None:
        return NA
    return f"{value:,.2f} {currency}" if abs(value) >= 0.01 or value == 0 else f"{value:.4f} {currency}"


def key_limits_text(k: KeyUse | KeyRecord, currency: str) -> str:
    """A gateway key's use against its limits, as `cetlab gateway`, `keys list` and :gateway show it."""
    parts = [f"{k.requests_last_minute}/{k.rpm} rpm"] if k.rpm else []
    parts.append(f"{k.tokens_today:,}" + (f"/{k.tokens_per_day:,}" if k.tokens_per_day else "") + " tokens today")
    if k.budget:
        parts.append(f"{fmt_money(k.spent, currency)} of {k.budget}")
    parts.append("models " + ",".join(k.models) if k.models else "every model")
    if k.expires:
        parts.append(("EXPIRED " if k.expired else "until ") + k.expires)
    return ", ".join(parts)


def fmt_pct(value: float | None) -> str:
    return fmt(value, ".0f", "%")


def fmt_saving(pct: float | None) -> str:
    """A saving against the cloud: `70%`, `-40%`; past -100% (a tiny cloud figure against idle power, e.g. -1276%)
    as how many times the cloud's cost it is: `14x cloud`."""
    if pct is None or pct > -100:
        return fmt_pct(pct)
    return f"{1 - pct / 100:.0f}x cloud"


def spark(values: list[float], width: int, lo: float = 0.0, hi: float | None = None) -> str:
    """A one-line sparkline of the last `width` values, scaled to lo..hi."""
    values = [v for v in values if v is not None][-width:]
    if not values:
        return " " * width
    top = hi if hi is not None else max(values) or 1.0
    span = max(top - lo, 1e-9)
    chars = [_BLOCKS[min(7, max(0, int((v - lo) / span * 7.999)))] for v in values]
    return "".join(chars).rjust(width)


def bar(pct: float | None, width: int) -> str:
    if pct is None:
        return "·" * width
    filled = round(max(0.0, min(100.0, pct)) / 100 * width)
    return "█" * filled + "░" * (width - filled)


@dataclass(frozen=True)
class Thresholds:
    """Colour limits, from lab.yaml `alerts:`; above warn is yellow, above alert red."""

    temp_warn_c: float = 75.0
    temp_alert_c: float = 85.0
    vram_warn_pct: float = 85.0
    vram_alert_pct: float = 95.0


def level_colour(value: float | None, warn: float, alert: float) -> str:
    if value is None:
        return "grey50"
    if value >= alert:
        return "bold red"
    if value >= warn:
        return "yellow"
    return "green"
