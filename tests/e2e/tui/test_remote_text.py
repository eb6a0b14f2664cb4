"""Remote text is shown as text: markup (`[/x]`, `[@click=...]`), terminal escapes and bidi overrides that real agents
send in every field a view shows crash nothing, appear literally (control characters visibly), and link to nothing."""

from __future__ import annotations

import json
import sys

import pytest

from agents.wire.catalogue.alerts import ALERTS_ACK, AckParams
from agents.wire.lab.model import load_lab
from agents.wire.protocol import RemoteError
from console.tui.app import CetlabApp
from console.tui.screens.jobs import JobsScreen
from console.tui.screens.logs import LogScreen
from console.tui.screens.machine import MachineScreen
from console.tui.views import VIEWS
from tests.support.agent_process import connected
from tests.support.lab import HOUR_S, age
from tests.support.remote_text import HOSTILE, MARKUP, SHOWN, SIZE, check_screen, shown_text
from tests.support.waits import until_drawn, wait_for
from widgets.wire import visible

MARKUP_HEAD = MARKUP[:26]  # what a refusal quoting the text (cut at 80 characters) keeps of it


GPU = {"name": HOSTILE, "memory_gib": 8, "tdp_w": 75, "profile": "training"}


FILE_HOSTILE = HOSTILE.replace("/", "|")  # the same, as a folder name


FILE_SHOWN = visible(FILE_HOSTILE)


TRAINER = "import sys\nprint(sys.argv[1:], flush=True)\nprint(sys.argv[-1] * 70, flush=True)\nprint(sys.argv[-1], file=sys.stderr, flush=True)\nsys.exit(3)"


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
                # tests/fast/tui/test_hostile_every_view.py's
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
