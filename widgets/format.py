"""Plain formatting shared by widgets and the CLI: sizes, N/A, sparklines, threshold colours."""

from __future__ import annotations

import time
from dataclasses import dataclass

GIB = 1024**3
_BLOCKS = "▁▂▃▄▅▆▇█"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "N/A"
    for unit, size in (("T", 1024**4), ("G", GIB), ("M", 1024**2), ("K", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}B"


def fmt(value: float | None, spec: str = ".0f", suffix: str = "") -> str:
    return "N/A" if value is None else f"{value:{spec}}{suffix}"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "N/A"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def fmt_ago(t: float | None, now: float | None = None) -> str:
    if t is None:
        return "never"
    return f"{fmt_duration((now or time.time()) - t)} ago ({time.strftime('%H:%M:%S', time.localtime(t))})"


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
