"""Per-section versions (issue 22 item 8): a view redraws only when a section it shows changed, not at every tick."""

from __future__ import annotations

from console.lab.client import FleetClient
from console.lab.state import LabState
from console.tui.app import CetlabApp
from console.tui.screens.jobs import JobsScreen
from tests.support.console import FROZEN_NOW, frozen_jobs, frozen_state
from tests.support.waits import until_drawn
from widgets.jobs_table import JobsTable


def busy_tick(state: LabState, machine: str, i: int, jobs: list[dict]) -> None:
    """One diff tick as an agent sends it: the GPUs and the host moved; `jobs` is sent along (the same or not)."""
    view = state.machines[machine]
    gpus = [g.model_copy(update={"util_pct": float(i % 100)}).model_dump(mode="json") for g in view.gpus.values()]
    host = view.host.model_copy(update={"cpu_pct": float(i % 100)}).model_dump(mode="json")
    state.apply_tick(machine, {"t": FROZEN_NOW + i, "full": False, "changed": {"gpus": gpus, "host": host, "jobs": jobs}})


def test_a_section_version_moves_only_when_its_data_changed():
    state = frozen_state()
    m5 = state.machines["m5"]
    busy_tick(state, "m5", 1, frozen_jobs())
    jobs_version, lab_version = state.sections_version(["jobs"]), state.version
    busy_tick(state, "m5", 2, frozen_jobs())  # the same jobs again, the GPUs moved
    assert state.sections_version(["jobs"]) == jobs_version and state.version > lab_version
    assert m5.section_versions["gpus"] > 1
    changed = frozen_jobs()
    changed[0]["step"] = 241
    busy_tick(state, "m5", 3, changed)
    assert state.sections_version(["jobs"]) == jobs_version + 1
    state.set_link("m5", "offline", "gone")
    assert state.sections_version(["link"]) > 0


async def test_an_unchanged_jobs_view_does_not_redraw_on_ticks_that_change_nothing_it_shows():
    state = frozen_state()
    state.machines["m5"].apply_section("jobs", frozen_jobs())
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    async with app.run_test(size=(160, 50)) as pilot:
        await until_drawn(pilot)
        await pilot.press("colon", *"jobs", "enter")
        await until_drawn(pilot, JobsScreen)
        screen = app.screen
        assert isinstance(screen, JobsScreen)
        redraws = screen.redraws
        for i in range(10):  # every machine ticks; the GPUs and hosts move; no job does
            for machine in ("m5", "irina"):
                busy_tick(state, machine, i, frozen_jobs() if machine == "m5" else [])
            await until_drawn(pilot, JobsScreen)  # the view caught up with this state
        assert screen.redraws == redraws

        changed = frozen_jobs()
        changed[0]["step"] = 241
        busy_tick(state, "m5", 11, changed)
        await until_drawn(pilot, JobsScreen)
        assert screen.redraws == redraws + 1
        assert str(screen.query_one(JobsTable).get_cell("m5-4", "step")).startswith("241/400")
