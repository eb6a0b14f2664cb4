"""The Textual console: Pilot against the live demo agents, and snapshots of a frozen lab."""

from __future__ import annotations

import time

import yaml

from agents.wire.lab.model import load_lab
from console.tui.app import CetlabApp
from console.tui.screens.fleet import FleetScreen
from console.tui.screens.machine import MachineScreen
from console.tui.screens.modals import HelpScreen
from tests.support.lab_view import SIZE, card_text, header_of
from tests.support.waits import until_drawn, wait_for
from widgets.machine_card import MachineCard


async def test_fleet_shows_every_gpu_live_and_navigates(demo_lab):
    app = CetlabApp(load_lab(demo_lab.lab_path))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: all(v.online for v in app.state.machines.values()), timeout=30)
        await wait_for(lambda: app.state.gpu_totals() == (9, 156 * 1024**3))
        await until_drawn(pilot, FleetScreen)
        header = await wait_for(lambda: "4/4 machines online" in header_of(app) and header_of(app))
        assert "9 GPUs" in header and "156 GiB VRAM" in header and "SIM" in header
        assert "SIM" in card_text(app, "m5") and "online" in card_text(app, "m5")
        lines = app.screen.query_one("#card-m5", MachineCard).gpu_lines
        assert len(lines) == 5 and "Tesla V100" in lines[0].plain

        await pilot.press("enter")  # the focused card is m5
        assert isinstance(app.screen, MachineScreen) and app.screen.machine == "m5"
        # the simulated background load shows as a process
        await wait_for(lambda: isinstance(app.screen, MachineScreen) and app.screen.query_one("#procs").row_count >= 1)
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen)

        await pilot.press("j", "enter")  # j: the next card, as down does
        assert isinstance(app.screen, MachineScreen) and app.screen.machine == "irina"
        await pilot.press("escape")
        await pilot.press("G", "k", "enter")  # the last card, then one up
        assert isinstance(app.screen, MachineScreen) and app.screen.machine == list(app.state.machines)[-2]
        await pilot.press("escape")

        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")

        await pilot.press("colon")
        await pilot.press(*"fleet", "enter")
        await wait_for(lambda: isinstance(app.screen, FleetScreen))
        await pilot.press("q")
    assert app.return_code in (0, None)


async def test_an_offline_machine_is_shown_with_its_last_seen_time(small_demo):
    data = yaml.safe_load(small_demo.lab_path.read_text())
    data["machines"].append({"name": "ghost", "host": "127.0.0.1", "port": 9, "gpus": "none"})
    path = small_demo.dir / "with-ghost.yaml"
    path.write_text(yaml.safe_dump(data))
    app = CetlabApp(load_lab(path))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: app.state.machines["box"].online and app.state.machines["ghost"].link == "offline", timeout=30)
        await until_drawn(pilot)
        assert "OFFLINE" in card_text(app, "ghost") and "last seen never" in card_text(app, "ghost")
        assert "connection refused" in card_text(app, "ghost")
        assert "online" in card_text(app, "box")
        await wait_for(lambda: "1/2 machines online" in header_of(app))
        # the machine that was online goes away: the card says so, with when it was last seen
        small_demo.stop()
        await wait_for(lambda: app.state.machines["box"].link == "offline", timeout=30)
        await until_drawn(pilot)
        assert "OFFLINE" in card_text(app, "box")
        assert time.strftime("%H:%M", time.localtime(app.state.machines["box"].last_seen)) in card_text(app, "box")


async def test_the_help_screen_shows_the_cli_line_of_a_demo_lab(tmp_path):
    from agents.shell.demo.lab import DemoLab
    from tests.support.cli_labs import saver_lab

    with DemoLab(tmp_path / "d", source=saver_lab(tmp_path / "src")) as demo:
        app = CetlabApp(load_lab(demo.lab_path))
        async with app.run_test(size=(160, 50)) as pilot:
            await until_drawn(pilot, FleetScreen)
            await pilot.press("question_mark")
            help_screen = await wait_for(lambda: isinstance(app.screen, HelpScreen) and app.screen)
            from rich.console import Console

            console = Console(width=200, record=True, color_system=None)
            for shown in help_screen.query("Static"):
                console.print(shown.content)
            text = console.export_text()
            assert "The CLI on this demo lab" in text and f"--lab {demo.lab_path} status" in text, text
