"""The `:queue` view: the lab queue as its keeper pushes it, each row saying where a job runs or why it waits."""

from __future__ import annotations

from console.lab.client import FleetClient
from console.tui.app import CetlabApp
from console.tui.screens.queue import QueueScreen
from tests.support.console import FROZEN_NOW, frozen_state
from tests.support.waits import until_drawn, wait_for
from widgets.live_table import LiveTable

WHY = "waiting for 1 GPU >= 24 GiB: m5 GPUs 1-4 hold model llama-3.1-70b-4bit (warm, pinned); m5 GPU 0 runs job m5-12 (sft)"


def queue_section() -> dict:
    base = {"user": "alice@ws", "submitted_at": FROZEN_NOW - 600, "need": "1 GPU >= 24 GiB"}
    return {
        "machine": "pharaoh",
        "waiting": 1,
        "running": 1,
        "entries": [
            {**base, "id": 3, "recipe": "sft", "state": "running", "machine": "m5", "gpus": [0], "job_id": "m5-12"},
            {**base, "id": 4, "recipe": "dpo", "state": "queued", "position": 1, "reason": WHY, "priority": 5},
            {
                **base,
                "id": 2,
                "recipe": "old",
                "state": "ended",
                "job_state": "failed",
                "reason": "exit code 3",
                "machine": "m5",
                "gpus": [1],
                "job_id": "m5-9",
            },
        ],
    }


async def test_the_queue_view_shows_what_runs_and_why_the_rest_waits():
    state = frozen_state(offline=())
    state.apply_tick("pharaoh", {"t": FROZEN_NOW, "full": False, "changed": {"queue": queue_section()}})
    assert state.machines["pharaoh"].queue is not None and not state.machines["pharaoh"].problems
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    async with app.run_test(size=(200, 30)) as pilot:
        await until_drawn(pilot)
        await pilot.press("colon", *"queue", "enter")
        table = await wait_for(lambda: app.screen.query(LiveTable).first() if isinstance(app.screen, QueueScreen) else None)
        await wait_for(lambda: table.row_count == 3)
        rows = {str(table.get_row_at(i)[0]): [str(c) for c in table.get_row_at(i)] for i in range(3)}
        assert rows["3"][1] == "running" and rows["3"][-1] == "m5 GPU 0 · job m5-12"
        assert rows["4"][1] == "queued" and rows["4"][2] == "5" and rows["4"][-1] == f"#1 {WHY}"
        assert rows["2"][1] == "failed" and rows["2"][-1].endswith("failed: exit code 3")
        summary = str(app.screen.query_one("#queue-summary").render())
        assert "the lab queue on pharaoh: 1 running · 1 waiting" in summary
