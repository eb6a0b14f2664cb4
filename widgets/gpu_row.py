"""One GPU as one line: utilisation with its sparkline, VRAM, temperature, power, owner."""

from __future__ import annotations

from rich.text import Text

from agents.protocol import GpuSample
from widgets.format import Thresholds, bar, fmt, fmt_bytes, level_colour, spark

SPARK_WIDTH = 16


def gpu_line(gpu: GpuSample, util_history: list[float], owner: str | None, limits: Thresholds, stale: bool = False) -> Text:
    """One GPU as a line; `stale` (its machine is offline) greys out the last known figures."""
    name = f"gpu{gpu.index} {gpu.name[:24]:<24}"
    line = Text()
    line.append(name, style="bold")
    if gpu.failed:
        line.append(f"  FAILED: {gpu.failed}", style="bold red")
        return line
    util = gpu.util_pct
    line.append(f" {bar(util, 8)} ", style="cyan")
    line.append(f"{fmt(util, '>3.0f', '%')} ", style="bold cyan")
    line.append(spark(util_history, SPARK_WIDTH, 0, 100), style="cyan")
    used, total = gpu.mem_used_bytes, gpu.mem_total_bytes
    vram_pct = used / total * 100 if used is not None and total else None
    vram_style = level_colour(vram_pct, limits.vram_warn_pct, limits.vram_alert_pct)
    line.append("  VRAM ", style="dim")
    line.append(bar(vram_pct, 8), style=vram_style)
    line.append(f" {fmt_bytes(used):>6}/{fmt_bytes(total):<6}{fmt(vram_pct, '>3.0f', '%')}", style=vram_style)
    temp = gpu.temp_c
    line.append(f"  {fmt(temp, '>3.0f', '°C')}", style=level_colour(temp, limits.temp_warn_c, limits.temp_alert_c))
    power, limit = gpu.power_w, gpu.power_limit_w
    power_style = "yellow" if power is not None and limit and power >= 0.9 * limit else "default"
    line.append(f"  {fmt(power, '>4.0f')}/{fmt(limit, '.0f', 'W'):<5}", style=power_style)
    if owner:
        line.append(f"  {owner}", style="magenta")
    if stale:
        line.stylize("grey50")
    return line


class GpuLines:
    """A machine's GPUs as lines, each rebuilt only when what it shows has changed."""

    def __init__(self) -> None:
        self._keys: dict[int, tuple] = {}
        self.lines: dict[int, Text] = {}

    def show(self, gpu: GpuSample, util_history: list[float], owner: str | None, limits: Thresholds, stale: bool = False) -> bool:
        """Update one GPU's line; True when it changed."""
        shown = (gpu.index, gpu.name, gpu.failed, gpu.util_pct, gpu.mem_used_bytes, gpu.mem_total_bytes, gpu.temp_c, gpu.power_w, gpu.power_limit_w)
        key = (shown, tuple(util_history[-SPARK_WIDTH:]), owner, limits, stale)
        if self._keys.get(gpu.index) == key:
            return False
        self._keys[gpu.index] = key
        self.lines[gpu.index] = gpu_line(gpu, util_history, owner, limits, stale)
        return True

    def keep(self, indices: set[int]) -> bool:
        """Forget GPUs no longer reported; True when one went."""
        gone = set(self.lines) - indices
        for index in gone:
            del self.lines[index], self._keys[index]
        return bool(gone)

    def text(self) -> Text:
        return Text("\n").join(self.lines[i] for i in sorted(self.lines))
