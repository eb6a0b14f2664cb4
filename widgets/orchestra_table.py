"""The model pool as a live table: one row per model, state in colour, figures updated cell by cell."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from widgets.format import NA, fmt, fmt_gib
from widgets.live_table import LiveTable

STATE_STYLES = {
    "warm": "bold green",
    "warming": "bold yellow",
    "loading": "yellow",
    "sleeping": "cyan",
    "cached": "blue",
    "cold": "dim",
    "failed": "bold red",
}
COLUMNS = [
    ("model", "MODEL", 20), ("machine", "MACHINE", 11), ("gpus", "GPUS", 5), ("engine", "ENGINE", 16),
    ("state", "STATE", 28), ("vram", "VRAM", 5), ("requests", "RUN/WAIT", 8), ("tokens", "TOK/S", 6),
    ("kv", "KV", 4), ("load", "LOAD", 6), ("warmup", "WARM-UP", 7), ("wake", "WAKE", 5), ("ram", "RAM", 5),
]


def row_key(model: dict[str, Any]) -> str:
    return f"{model['machine']}/{model['name']}"


def _secs(value: float | None) -> str:
    return fmt(value, ".1f", "s")


def state_cell(model: dict[str, Any]) -> Text:
    state = model["state"]
    text = Text(state, style=STATE_STYLES.get(state, ""))
    progress = model.get("progress")
    if progress:
        phase = progress.get("phase", "")
        if progress.get("total_bytes"):
            phase += f" {progress['done_bytes'] / progress['total_bytes']:.0%}"
        text.append(f" {phase}", style="italic")
    if model.get("pinned"):
        text.append(" PIN", style="bold magenta")
    return text


def model_cells(model: dict[str, Any]) -> tuple[Any, ...]:
    """The row of one model (plain data in, Rich text out)."""
    running, waiting = model.get("requests_running"), model.get("requests_waiting")
    engine = Text(model["engine"])
    if model.get("simulated"):
        engine.append(" SIM", style="bold magenta")
    cached = model.get("cached_fraction")
    return (
        Text(model["name"], style="bold"),
        model["machine"],
        ",".join(map(str, model["gpus"])) or "cpu",
        engine,
        state_cell(model),
        fmt_gib(model.get("vram_bytes")),
        NA if running is None else f"{running:.0f}/{waiting or 0:.0f}",
        fmt(model.get("tokens_per_s")),
        fmt(model.get("kv_cache_pct"), ".0f", "%"),
        _secs(model.get("load_s")),
        _secs(model.get("warmup_s")),
        _secs(model.get("wake_s")),
        fmt(cached, ".0%"),
    )


class OrchestraTable(LiveTable):
    """Give it the models (dicts as `models.list` returns them); rows keyed by machine/name."""

    DEFAULT_CSS = "OrchestraTable { height: 1fr; }"
    COLUMNS = COLUMNS

    def cells(self, item: dict[str, Any]) -> tuple:
        return model_cells(item)

    def show_models(self, models: list[dict[str, Any]]) -> None:
        self.show({row_key(m): m for m in models})
