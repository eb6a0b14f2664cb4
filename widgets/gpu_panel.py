"""One GPU in detail: its line, extra fields and sparklines of utilisation, power and temperature."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from agents.protocol import GpuSample
from widgets.format import NA, Thresholds, fmt
from widgets.gpu_row import gpu_line

SERIES = (("util_pct", "util %"), ("power_w", "power W"), ("temp_c", "temp °C"))


class GpuPanel(Vertical):
    DEFAULT_CSS = """
    GpuPanel { height: auto; border: round $panel-lighten-2; padding: 0 1; }
    GpuPanel > Horizontal { height: 3; }
    GpuPanel > Horizontal > Vertical { width: 1fr; height: 3; padding: 0 1 0 0; }
    GpuPanel Sparkline { height: 2; }
    GpuPanel .label { color: $text-muted; height: 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static("", classes="line")
        yield Static("", classes="extra")
        with Horizontal():
            for key, label in SERIES:
                with Vertical():
                    yield Static(label, classes="label")
                    yield Sparkline([], id=f"spark-{key.split('_')[0]}")

    def show(self, gpu: GpuSample, history: dict[str, list[float]], owner: str | None, limits: Thresholds) -> None:
        if not self.is_mounted or not self.children:
            return
        self.query_one(".line", Static).update(gpu_line(gpu, history.get("util_pct", []), owner, limits))
        self.query_one(".extra", Static).update(
            f"fan {fmt(gpu.fan_pct, '.0f', '%')}  SM clock {fmt(gpu.sm_clock_mhz, '.0f', ' MHz')}  "
            f"power limit {fmt(gpu.power_limit_w, '.0f', ' W')}  uuid {gpu.uuid or NA}"
            + ("  [black on yellow] SIM [/]" if gpu.simulated else "")
        )
        for key, _ in SERIES:
            for spark in self.query(f"#spark-{key.split('_')[0]}").results(Sparkline):
                spark.data = history.get(key, [])
