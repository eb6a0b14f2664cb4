"""The console's views by name, for `:name` jumps, the help screen and the key bar.

Each entry: name -> (module, class, one-line description). Screens subclass
console.tui.screens.base.LabScreen.
"""

from __future__ import annotations

VIEWS: dict[str, tuple[str, str, str]] = {
    "fleet": ("console.tui.screens.fleet", "FleetScreen", "every GPU of every machine, live"),
    "jobs": (
        "console.tui.screens.jobs",
        "JobsScreen",
        "training runs: progress, loss, start (n), stop (s), kill (ctrl+k), logs (l)",
    ),
    "queue": (
        "console.tui.screens.queue",
        "QueueScreen",
        "the lab queue: what runs where, what waits and why; hold (h), release (u), cancel (ctrl+x)",
    ),
    "models": ("console.tui.screens.models", "ModelsScreen", "the model pool: warm, sleeping, cached, cold; swap and rotation"),
    "checkpoints": (
        "console.tui.screens.checkpoints",
        "CheckpointsScreen",
        "a run's loss with its checkpoints: resume (r), serve (v), keep (p), prune (P), delete (ctrl+d)",
    ),
    "costs": ("console.tui.screens.costs", "CostsScreen", "money now, today, this month; the saving vs cloud; spend per day"),
    "alerts": ("console.tui.screens.alerts", "AlertsScreen", "what is wrong now across the lab, the history, acknowledgement"),
    "audit": ("console.tui.screens.audit", "AuditScreen", "who did what: every operator action on the agents, with its outcome"),
    "gateway": (
        "console.tui.screens.gateway",
        "GatewayScreen",
        "the lab gateway: traffic per model, wakes, errors, provider spend, keys",
    ),
}
