"""Machine-detail charts on fixed, labelled scales (issue 13 item 15): 20-40% draws low, not as a full block."""

from __future__ import annotations

from console.lab.client import FleetClient
from console.tui.app import CetlabApp
from console.tui.screens.fleet import FleetScreen
from console.tui.screens.machine import MachineScreen
from tests.support.console import FROZEN_NOW, frozen_state
from tests.support.waits import until_drawn
from widgets.charts import ScaleChart, chart_rows, chart_text


def test_a_chart_scales_from_zero_to_its_stated_top_not_to_its_data():
    low = [20.0, 30.0, 40.0, 30.0]
    top_line, bottom_line = chart_rows(low, 4, rows=2, top=100.0)
    assert top_line.strip() == ""  # 40% of 100 stays in the bottom half
    assert "█" not in bottom_line and bottom_line == "▃▅▆▅"
    assert chart_rows([50.0, 100.0, 150.0], 3, rows=2, top=100.0) == [" ██", "███"]  # full at the top, clipped above it
    assert chart_rows([0.0, 1.0], 4, rows=1, top=100.0) == ["   ▁"]  # newest at the right; a little above 0 shows
    text = chart_text(low, 12, 2, 100.0, "100%", "0%").plain.split("\n")
    assert text[0].startswith("100%┤") and text[1].startswith("  0%┤") and len(text[0]) == 12


async def test_the_machine_view_charts_util_vram_and_power_on_their_fixed_scales():
    state = frozen_state()
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    async with app.run_test(size=(160, 50)) as pilot:
        await until_drawn(pilot, FleetScreen)
        await pilot.press("enter")  # m5
        await until_drawn(pilot, MachineScreen)
        await pilot.pause()
        gpu = state.machines["m5"].gpus[1]  # a P40 idling at a few %
        panel = app.screen.query_one("#gpu-1")

        def chart(key: str) -> list[str]:
            widget = panel.query_one(f"#chart-{key}", ScaleChart)
            return chart_text(widget.values, widget.size.width, widget.size.height, widget.top, *widget.labels).plain.split("\n")

        util, vram, power = chart("util_pct"), chart("mem_used_bytes"), chart("power_w")
        assert util[0].startswith("100%┤") and util[-1].lstrip().startswith("0%┤")
        assert vram[0].startswith("24.0G┤") and power[0].startswith("250W┤")
        assert gpu.util_pct < 10 and set(util[0].split("┤")[1]) <= {" "}  # a few % never reaches the top line
        assert set(util[-1].split("┤")[1]) - {" "}  # but it is drawn
