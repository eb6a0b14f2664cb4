"""One GPU in detail: its line, extra fields and charts of utilisation, VRAM, power and temperature on fixed, labelled scales."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from agents.wire.protocol import GpuSample
from agents.wire.sections.gpu_support import Verdict
from widgets.charts import ScaleChart
from widgets.format import NA, Thresholds, fmt, fmt_bytes
from widgets.gpu_row import gpu_line
from widgets.wire import esc, shown

SERIES = (("util_pct", "util %"), ("mem_used_bytes", "VRAM"), ("power_w", "power W"), ("temp_c", "temp °C"))
TEMP_TOP_C = 100.0  # a GPU throttles well below this: the scale every card shares


def chart_scale(key: str, gpu: GpuSample) -> tuple[float | None, str, str]:
    """(top, top label, zero label) of one series' chart: 0-100 %, 0 to the GPU's VRAM, 0 to its power limit, 0-100 °C."""
    if key == "util_pct":
        return 100.0, "100%", "0%"
    if key == "mem_used_bytes":
        return gpu.mem_total_bytes, fmt_bytes(gpu.mem_total_bytes), "0"
    if key == "power_w":
        return gpu.power_limit_w, fmt(gpu.power_limit_w, ".0f", "W"), "0W"
    return TEMP_TOP_C, f"{TEMP_TOP_C:.0f}°C", "0°C"


def support_line(gpu: GpuSample, support: list[Verdict]) -> str:
    """Which stacks this GPU can run: "compute 6.1  runs: trainer torch, llama-server  not: vLLM (vLLM 0.33 needs compute capability 7.0 or newer)"."""
    runs = [v.stack for v in support if v.runs]
    unknown = [v.stack for v in support if v.runs is None]
    parts = [f"compute {esc(gpu.compute_capability or NA)}"]
    if runs:
        parts.append("[green]runs:[/] " + esc(", ".join(runs)))
    for verdict in support:
        if verdict.runs is False:
            why = verdict.reason.split("; ", 1)[-1]
            parts.append(f"[red]not: {esc(verdict.stack)}[/] ({esc(why)})")
    if unknown:
        parts.append("unknown: " + esc(", ".join(unknown)))
    return "  ".join(parts)


class GpuPanel(Vertical):
    DEFAULT_CSS = """
    GpuPanel { height: auto; border: round $panel-lighten-2; padding: 0 1; }
    GpuPanel > Horizontal { height: 3; }
    GpuPanel > Horizontal > Vertical { width: 1fr; height: 3; padding: 0 1 0 0; }
    GpuPanel ScaleChart { height: 2; }
    GpuPanel .label { color: $text-muted; height: 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static("", classes="line")
        yield Static("", classes="extra")
        with Horizontal():
            for key, label in SERIES:
                with Vertical():
                    yield Static(label, classes="label")
                    yield ScaleChart(id=f"chart-{key}")

    def show(
        self,
        gpu: GpuSample,
        history: dict[str, list[float]],
        owner: str | None,
        limits: Thresholds,
        support: list[Verdict] | None = None,
    ) -> None:
        if not self.is_mounted or not self.children:
            return
        line = self.query_one(".line", Static)
        line.update(gpu_line(gpu, history.get("util_pct", []), owner, limits, width=line.size.width or None))
        self.query_one(".extra", Static).update(
            shown(
                f"fan {fmt(gpu.fan_pct, '.0f', '%')}  SM clock {fmt(gpu.sm_clock_mhz, '.0f', ' MHz')}  "
                f"power limit {fmt(gpu.power_limit_w, '.0f', ' W')}  uuid {esc(gpu.uuid or NA)}"
                + ("  [black on yellow] SIM [/]" if gpu.simulated else "")
                + (f"\n{support_line(gpu, support)}" if support else "")
            )
        )
        for key, _ in SERIES:
            self.query_one(f"#chart-{key}", ScaleChart).show(history.get(key, []), *chart_scale(key, gpu))
