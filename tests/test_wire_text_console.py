"""Remote text is shown as text: markup (`[/x]`, `[@click=...]`), terminal escapes and bidi overrides that real agents
send in every field a view shows crash nothing, appear literally (control characters visibly), and link to nothing."""

from __future__ import annotations

import json
import sys

import pytest
from textual.geometry import Region
from textual.widgets import DataTable, Log, OptionList, Static

from agents.wire.catalogue.alerts import ALERTS_ACK, AckParams
from agents.wire.lab.model import load_lab
from agents.wire.protocol import RemoteError
from console.tui.app import CetlabApp
from console.tui.screens.jobs import JobsScreen
from console.tui.screens.logs import LogScreen
from console.tui.screens.machine import MachineScreen
from console.tui.views import VIEWS
from tests.conftest import HOUR_S, age, until_drawn, wait_for
from tests.hardening_fixtures import connected
from widgets.wire import visible

SIZE = (200, 60)
# markup that crashes a parser ([/x]), a live action link, a style; a terminal escape (clear screen, set the title) and a
# right-to-left override
MARKUP = "[/x] [@click=app.quit]x[/] [bold]b [bold red]r[/] [link=https://evil.example]l[/link]"
MARKUP_HEAD = MARKUP[:26]  # what a refusal quoting the text (cut at 80 characters) keeps of it
# a clipboard write (OSC 52), a title set, a screen clear, a terminal query (its answer would be typed as input)
ESCAPES = "\x1b]52;c;cm0gLXJmIH4=\x07 \x1b[2J\x1b]0;pwn\x07 \x1b[6n\x1b[c"
HOSTILE = MARKUP + " " + ESCAPES + " \u202eevil"
GPU = {"name": HOSTILE, "memory_gib": 8, "tdp_w": 75, "profile": "training"}
FILE_HOSTILE = HOSTILE.replace("/", "|")  # the same, as a folder name
SHOWN = visible(HOSTILE)  # what the console shows: the text as typed, control characters as visible stand-ins
FILE_SHOWN = visible(FILE_HOSTILE)
TRAINER = "import sys\nprint(sys.argv[1:], flush=True)\nprint(sys.argv[-1] * 70, flush=True)\nprint(sys.argv[-1], file=sys.stderr, flush=True)\nsys.exit(3)"


def shown_text(app: CetlabApp) -> str:
    """Every string the screen shows now (tables' cells, statics, logs, option lists), the toasts left out."""
    parts: list[str] = []
    toasts = set(app.screen.query("Toast"))  # by its CSS type name: the class lives in a private module
    for widget in app.screen.query("*"):
        if widget in toasts:
            continue
        if isinstance(widget, DataTable):
            parts += [str(cell) for i in range(widget.row_count) for cell in widget.get_row_at(i)]
        elif isinstance(widget, Log):
            parts += list(widget.lines)
        elif isinstance(widget, OptionList):
            parts += [str(widget.get_option_at_index(i).prompt) for i in range(widget.option_count)]
        elif isinstance(widget, Static):
            rendered = widget.render()  # a markup string is parsed here: `[/x]` raised, `[@click]` became a link
            parts.append(getattr(rendered, "plain", str(rendered)))
    return "\n".join(parts)


def check_screen(app: CetlabApp) -> str:
    """The screen renders, shows no control character, and its screenshot carries no link; returns its text."""
    text = shown_text(app)
    toasts = "".join(f"{n.title} {n.message}" for n in app.notices)
    assert "\x1b" not in toasts and "\u202e" not in toasts
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert "\ue000" not in text and "\ue001" not in text  # esc()'d text shown without shown(): its brackets would be lost
    svg = app.export_screenshot()  # renders every visible widget, as the terminal would get it
    assert "\u202e" not in svg and "\x1b" not in svg
    assert "app.quit" not in "".join(str(meta) for meta in _metas(app)), "a live action link"
    return text


def _metas(app: CetlabApp) -> list[dict]:
    """The meta (where @click lives) of every segment each shown widget of the screen renders now."""
    metas = []
    for widget in app.screen.query("*"):
        width, height = widget.region.size
        if not widget.display or not width or not height:
            continue
        for strip in widget.render_lines(Region(0, 0, width, height)):
            metas += [segment.style.meta for segment in strip if segment.style is not None]
    return [m for m in metas if m]


@pytest.mark.timeout(240)
async def test_hostile_wire_text_in_every_view(run_pool, tmp_path):
    checkpoints = tmp_path / "hand"
    run = checkpoints / FILE_HOSTILE
    (run / "checkpoint-1").mkdir(parents=True)
    (run / "checkpoint-1" / "trainer_state.json").write_text(
        json.dumps({"global_step": 1, "epoch": 1.0, "log_history": [{"step": 1, "loss": 1.5}]})
    )
    (run / "checkpoint-1" / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    age(run / "checkpoint-1", HOUR_S)
    data = {
        "lab": "hostile",
        "machines": [{"name": "box", "role": HOSTILE, "gpus": {"sim": [GPU, GPU]}}],
        "alerts": {"temp_c": 1, "temp_for_s": 0},  # the sim GPU's temperature fires at once: an alert about a hostile name
        "models": [
            {
                "name": "m1",
                "path": str(tmp_path / "m1"),
                "engine": "sim",
                "machine": "box",
                "gpus": [0],
                "vram_gib": 1,
                "served_name": "m1-served",  # a model name by type (ModelName): every view over hostile ticks is
                # tests/test_wire_text_every_section.py's
                "sim": {"load_s": 0.1, "cold_factor": 1, "warmup_s": 0.1, "wake_s": 0.1, "placeholder_mib": 1},
            }
        ],
        "orchestra": {"warm": ["m1"]},
        "trainers": [
            {
                "name": "evil",
                "machine": "box",
                "gpus": [1],
                "command": [sys.executable, "-c", TRAINER],
                "output_dir": str(tmp_path / "runs" / "{job_id}"),
                "params": [{"name": "note", "type": "str", "help": HOSTILE}],
            }
        ],
        "checkpoints": {"dirs": [{"machine": "box", "path": str(checkpoints)}], "poll_s": 1},
        "notify": {"routes": [{"name": "pager", "kind": "command", "argv": [sys.executable, "-c", f"# {HOSTILE}"]}]},
        "gateway": {"machine": "box"},
    }
    demo = run_pool(data)
    actor = await connected(demo.lab_path)
    try:
        with pytest.raises(RemoteError):  # an audit row holding it: its params and the refusal's message
            await actor.call("box", "alerts.ack", {"id": HOSTILE})
        app = CetlabApp(load_lab(demo.lab_path))
        async with app.run_test(size=SIZE) as pilot:
            state = app.state
            await wait_for(lambda: state.machines["box"].online and state.machines["box"].gpus, timeout=30)
            # started while the console watches: its failure (with the trainer's last line) comes as a toast too
            job = await actor.call("box", "jobs.start", {"recipe": "evil", "params": {"note": HOSTILE}})
            await wait_for(lambda: any(j.id == job["id"] and j.state == "failed" for j in state.machines["box"].jobs), timeout=60)
            await wait_for(lambda: state.machines["box"].checkpoints, timeout=30)
            await wait_for(lambda: state.machines["box"].alerts.active, timeout=30)
            seen: dict[str, str] = {}
            for name in VIEWS:
                await app.switch_mode(name)
                await until_drawn(pilot, type(app.screen))
                if name == "audit":  # fetched: the row of the refused ack (its params are JSON: control characters escaped)
                    await wait_for(lambda: MARKUP in shown_text(app), timeout=20)
                if name == "alerts":
                    await wait_for(lambda: "pager" in shown_text(app), timeout=20)
                if name == "models":
                    await wait_for(lambda: "m1-served" in shown_text(app), timeout=30)  # its detail: the served name, once warm
                if name == "checkpoints":
                    await wait_for(lambda: FILE_SHOWN in shown_text(app), timeout=20)
                seen[name] = check_screen(app)
                assert app.is_running
            # the job's detail (params, its error, its last lines), its log, the machine's detail
            await app.switch_mode("jobs")
            screen = app.screen
            assert isinstance(screen, JobsScreen)
            await until_drawn(pilot, JobsScreen)
            seen["job detail"] = check_screen(app)
            await pilot.press("l")
            await wait_for(lambda: isinstance(app.screen, LogScreen) and app.screen.lines, timeout=20)
            await wait_for(lambda: SHOWN in shown_text(app), timeout=20)
            seen["log"] = check_screen(app)
            await app.switch_mode("fleet")
            await until_drawn(pilot)
            await pilot.press("enter")
            await wait_for(lambda: isinstance(app.screen, MachineScreen), timeout=20)
            await until_drawn(pilot, MachineScreen)
            seen["machine"] = check_screen(app)
            screen = app.screen
            assert isinstance(screen, MachineScreen)
            # an id no client of this version builds (AckParams refuses it): the agent refuses it too, quoting it, as a toast
            screen.act("box", ALERTS_ACK, AckParams.model_construct(id=HOSTILE), "acknowledged")
            # the refusal quotes the id cut to its start (80 characters): markup and a live link among them
            await wait_for(lambda: any(MARKUP_HEAD in n.message for n in app.notices), timeout=20)
            await pilot.pause()
            check_screen(app)
            assert app.is_running
        # literally: the markup as typed (Rich drops BEL from a Text it appends to: the rest shows, ESC as ␛, U+202E as �)
        for name in ("fleet", "jobs", "audit", "alerts", "costs", "job detail", "log", "machine"):
            assert MARKUP in seen[name], f"{name}: the hostile text is not shown literally:\n{seen[name][:3000]}"
            assert "␛[2J" in seen[name] or "\\x1b[2J" in seen[name] or "\\u001b[2J" in seen[name], name  # the escape, inert
        assert FILE_SHOWN in seen["checkpoints"]  # the run's folder name
        assert f"note={SHOWN}" in seen["job detail"]  # the param, as the agent holds it
        assert SHOWN in seen["log"]  # a trainer's line
        assert any(MARKUP_HEAD in n.message and not n.markup for n in app.notices)  # a toast, as text
    finally:
        await actor.stop()


async def test_hostile_gateway_section_is_shown_as_text():
    """Gateway keys, models and providers are names the agents check (NAME_RE), so no real agent sends these: a
    gateway section holding them anyway (an older or a hostile agent) is still shown as text."""
    from console.lab.client import FleetClient
    from console.tui.screens.gateway import GatewayScreen
    from tests.console_fixtures import FROZEN_NOW, frozen_state

    state = frozen_state(offline=())
    machine = state.lab.gateway.machine
    state.machines[machine].apply_section(
        "gateway",
        {
            "url": f"http://127.0.0.1:1/{HOSTILE}",
            "machine": machine,
            "error": HOSTILE,
            "peers": {HOSTILE: HOSTILE},
            "models": [
                {"name": HOSTILE, "tier": "local", "where": HOSTILE, "state": HOSTILE, "errors": 3}
            ],  # a tier is a Literal
            "providers": [{"name": HOSTILE, "spend_today": 1.0, "monthly_budget": 10.0, "budget_pct": 10.0, "key_set": False}],
            "keys": [{"name": HOSTILE, "requests": 2}],
        },
    )
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    async with app.run_test(size=SIZE) as pilot:
        await until_drawn(pilot)
        await app.switch_mode("gateway")
        await until_drawn(pilot, GatewayScreen)
        text = check_screen(app)
        assert app.is_running
    # the summary's url, error, peer and its state; the table's name, where and state; the provider; the key
    assert text.count(SHOWN) == 9, text


async def test_hostile_costs_report_is_refused_on_the_wire_and_shown_as_text_by_the_view():
    """Hardening IV, R9: `:costs` put an agent's `since.day` in its markup and parsed it as a date: two strings crashed
    every console that opened it. The wire checks a day (Day); the view shows what an older agent sent as text."""
    from console.lab.client import FleetClient
    from console.lab.costs import LabCosts, LabDay, lab_costs
    from console.tui.screens.costs import CostsScreen
    from tests.console_fixtures import FROZEN_NOW, frozen_state

    day = {"day": "2026-11-01", "cost": 1.0}
    for bad in (MARKUP, "[/b]", "2026-02-30", HOSTILE):
        costs = lab_costs("EUR", {"box": {"machine": "box", "currency": "EUR", "timezone": "UTC", "since": {**day, "day": bad}}})
        assert costs.offline and costs.since is None, bad  # refused where the reply enters, said as the machine's problem
    crafted = LabCosts.model_validate(
        {
            **{f: None for f in LabCosts.model_fields if f not in ("currency", "since", "by_kind")},
            "currency": "EUR",
            "since": HOSTILE,
            "by_kind": "machine",
            "api_providers": [{"provider": HOSTILE, "month": 1.0}],
            "by": [{"machine": HOSTILE, "label": HOSTILE, "cost": 1.0}],
            "days": [LabDay(day=HOSTILE, cost=1.0, cloud_equivalent=None, kwh=None, api=None)],
            "missing": [HOSTILE],
            "offline": {HOSTILE: HOSTILE},
            "simulated": False,
        }
    )
    state = frozen_state(offline=())
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    async with app.run_test(size=SIZE) as pilot:
        await until_drawn(pilot)
        await app.switch_mode("costs")
        screen = await wait_for(lambda: isinstance(app.screen, CostsScreen) and app.screen)
        screen.report = crafted
        screen.refresh_data()
        await pilot.pause()
        text = check_screen(app)
        assert app.is_running
    assert text.count(SHOWN) >= 5, text  # since (twice), the provider, the missing price, the offline machine and why
