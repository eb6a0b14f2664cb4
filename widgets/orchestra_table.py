"""The model pool as a live table: one row per model, state in colour, figures updated cell by cell."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from agents.wire.sections.models import ModelInfo
from widgets.format import NA, fmt, fmt_gib, fmt_gpus, machines_text
from widgets.live_table import Cells, LiveTable

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
    ("model", "MODEL", 18),
    ("machine", "MACHINE", 11),
    ("gpus", "GPUS", 5),
    ("engine", "ENGINE", 13),
    ("state", "STATE", None),
    ("vram", "VRAM", 5),
    ("requests", "RUN/WAIT", 8),
    ("tokens", "TOK/S", 6),
    ("kv", "KV", 4),
    ("load", "LOAD", 6),
    ("warmup", "WARM-UP", 7),
    ("wake", "WAKE", 5),
    ("ram", "RAM", 5),
]
# in a narrow terminal the timings go first, then KV, the GPUs, the tokens/s and the engine: name, machine, engine,
# state, VRAM and the live load stay at 80 columns (where a model runs and on what is what a split pane asks first)
DROP = ("ram", "wake", "warmup", "load", "kv", "gpus", "tokens", "engine", "machine")
STATE_MIN = 11  # STATE takes the width the other columns leave, at least this (a long phase, "loading making the tiny model", is
# whole at 160 columns and cut where the table is tight: at 80 the machine's column matters more)


def row_key(model: ModelInfo) -> str:
    return f"{model.machine}/{model.name}"


def _secs(value: float | None) -> str:
    return fmt(value, ".1f", "s")


def state_cell(model: ModelInfo) -> Text:
    text = Text(model.state, style=STATE_STYLES.get(model.state, ""))
    progress = model.progress
    if progress:
        phase: str = "" if progress.phase == model.state else progress.phase  # not "loading loading"
        if progress.total_bytes:
            phase += f" {(progress.done_bytes or 0) / progress.total_bytes:.0%}"
        if phase.strip():
            text.append(f" {phase.strip()}", style="italic")
    if model.draining:  # a replica going out: it ends its requests, gets no new one
        text.append(" draining", style="bold yellow")
    if model.pinned:
        text.append(" PIN", style="bold magenta")
    return text


def model_cells(model: ModelInfo) -> tuple[Any, ...]:
    """The row of one model (its typed section in, Rich text out)."""
    running, waiting = model.requests_running, model.requests_waiting
    engine = Text(model.engine)
    if model.simulated:
        engine.append(" SIM", style="bold magenta")
    return (
        Text(model.name, style="bold"),
        machines_text(model.machine, model.machines),
        fmt_gpus(model.gpus, "cpu"),
        engine,
        state_cell(model),
        fmt_gib(model.vram_bytes),
        NA if running is None else f"{running:.0f}/{waiting or 0:.0f}",
        fmt(model.tokens_per_s),
        fmt(model.kv_cache_pct, ".0f", "%"),
        _secs(model.load_s),
        _secs(model.warmup_s),
        _secs(model.wake_s),
        fmt(model.cached_fraction, ".0%"),
    )


class OrchestraTable(LiveTable):
    """Give it the models (the typed models sections); rows keyed by machine/name."""

    DEFAULT_CSS = "OrchestraTable { height: 1fr; }"
    COLUMNS = COLUMNS
    DROP = DROP
    REST_MIN_WIDTH = STATE_MIN

    def cells(self, item: ModelInfo) -> Cells:
        return model_cells(item)

    def show_models(self, models: list[ModelInfo]) -> None:
        self.show({row_key(m): m for m in models})
