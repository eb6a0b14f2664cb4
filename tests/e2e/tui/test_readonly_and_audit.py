"""Console hardening: --readonly acts on nothing in any view (the agents' audit trails prove it); the :audit view; `cetlab audit`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from textual.binding import Binding

from agents.wire.lab.model import load_lab
from agents.wire.protocol import RemoteError
from console.tui.app import CetlabApp
from console.tui.screens.audit import AuditScreen
from console.tui.screens.base import LabScreen
from console.tui.views import VIEWS
from tests.support.agent_process import connected
from tests.support.waits import until_drawn, wait_for

SIZE = (160, 50)


NOT_ACTIONS = {"escape", "question_mark", "colon", "q"}  # leave, help, jump, quit


def view_keys(screen: LabScreen) -> list[str]:
    keys = []
    for binding in screen.BINDINGS:
        key = (binding.key if isinstance(binding, Binding) else binding[0]).split(",")[0]
        if key not in NOT_ACTIONS:
            keys.append(key)
    return keys


async def audit_totals(lab_path) -> dict[str, int]:
    client = await connected(lab_path)
    try:
        results = await client.call_all("audit.list", {"limit": 1})
        return {m: r["total"] for m, r in results.items()}
    finally:
        await client.stop()


@pytest.mark.timeout(180)
async def test_readonly_console_acts_on_nothing_in_any_view(demo_lab):
    lab = load_lab(demo_lab.lab_path)
    before = await audit_totals(demo_lab.lab_path)
    app = CetlabApp(lab, readonly=True)
    acting_keys: dict[str, set[str]] = {}  # view -> its keys that act
    bound_acting: dict[str, set[str]] = {}  # view -> those of them bound in this read-only console
    called: list[str] = []
    async with app.run_test(size=SIZE) as pilot:
        real_call, real_call_all = app.client.call, app.client.call_all

        async def spy_call(machine, method, params=None, timeout=None):
            called.append(method)
            return await real_call(machine, method, params, timeout)

        async def spy_call_all(method, params=None, timeout=None):
            called.append(method)
            return await real_call_all(method, params, timeout)

        app.client.call, app.client.call_all = spy_call, spy_call_all
        await wait_for(lambda: all(v.online for v in app.state.machines.values()), timeout=30)
        await wait_for(lambda: app.state.machines["m5"].model_list, timeout=30)
        operator_methods = {m["name"] for m in await real_call("m5", "methods") if m["role"] == "operator"}
        for name in VIEWS:
            await app.switch_mode(name)
            view = app.screen
            assert isinstance(view, LabScreen), name
            await until_drawn(pilot, type(view))
            acting = {b.key for b in view.BINDINGS if isinstance(b, Binding) and b.action.split("(")[0] in view.ACTING}
            acting_keys[name], bound_acting[name] = acting, acting & set(view.active_bindings)
            for key in view_keys(view):
                await pilot.press(key)
                await pilot.pause()  # no delay: only what the key queued runs
                for answer in ("y", "escape", "escape"):  # a modal that opened anyway: say yes, then leave
                    if app.screen is view:
                        break
                    await pilot.press(answer)
                    await pilot.pause()
    acted = sorted(set(called) & operator_methods - {"audit.list"})
    assert not acted, f"a read-only console called operator methods: {acted}"
    # the views that act have acting keys, and a read-only console binds none of them
    assert all(acting_keys[name] for name in ("jobs", "models", "checkpoints", "alerts")), acting_keys
    assert not any(bound_acting.values()), bound_acting
    assert await audit_totals(demo_lab.lab_path) == before  # and the agents agree: nothing was done


@pytest.mark.timeout(120)
async def test_audit_view_shows_operator_actions_live(demo_lab):
    lab = load_lab(demo_lab.lab_path)
    actor = await connected(demo_lab.lab_path)
    app = CetlabApp(lab)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(lambda: all(v.online for v in app.state.machines.values()), timeout=30)
            await app.switch_mode("audit")
            screen = app.screen
            assert isinstance(screen, AuditScreen)
            await actor.call("irina", "set_interval", {"interval_s": 1})
            with pytest.raises(RemoteError):
                await actor.call("irina", "models.warm", {"model": "no-such-model"})

            def rows() -> list[list[str]]:
                table = screen.query_one("#audit-table")
                return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]

            await wait_for(lambda: any(r[1] == "irina" and r[4] == "models.warm" for r in rows()), timeout=20)
            newest = rows()[0]
            assert newest[1:5] == ["irina", "demo-console", "operator", "models.warm"] and "not_found" in newest[6]
            assert any(r[4] == "set_interval" and r[6] == "ok" and '"interval_s":1' in r[5] for r in rows())
            await pilot.press("e")
            await wait_for(lambda: rows() and all("ok" != r[6] for r in rows()))  # errors only
            summary = str(screen.query_one("#audit-summary").render())
            assert "operator actions" in summary and "errors only" in summary
    finally:
        await actor.stop()


def test_cli_audit_json(demo_lab):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "console.cli.main",
            "--lab",
            str(demo_lab.lab_path),
            "--json",
            "audit",
            "--machine",
            "pharaoh",
            "--limit",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    before = json.loads(result.stdout)["entries"] if result.returncode == 0 else None
    assert before is not None, result.stderr
    subprocess.run(
        [
            sys.executable,
            "-m",
            "console.cli.main",
            "--lab",
            str(demo_lab.lab_path),
            "--json",
            "alerts",
            "--ack",
            "pharaoh#999999",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "console.cli.main",
            "--lab",
            str(demo_lab.lab_path),
            "--json",
            "audit",
            "--machine",
            "pharaoh",
            "--method",
            "alerts.ack",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    entry = data["entries"][0]
    assert entry["machine"] == "pharaoh" and entry["method"] == "alerts.ack" and entry["outcome"] != "ok"
    assert json.loads(entry["params"]) == {"id": "pharaoh#999999"} and data["unavailable"] == {}
    assert set(entry) >= {"t", "who", "role", "method", "params", "outcome", "message", "duration_s"}
