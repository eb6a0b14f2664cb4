"""The pool's books: its slots, and what it records of them (state.db, GPU claims, notices, the engines a restart re-adopts)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from agents.orchestra.adopt import keep_on_disk, remember
from agents.orchestra.slot import TOKENS_PER_S_WINDOW_S, Slot, WindowRate
from agents.runtime.core import AgentCore
from agents.wire.documents import EngineFigures
from agents.wire.events import Notice, NoticeLevel
from agents.wire.states import MODEL_ENGINE_UP, ModelState

log = logging.getLogger("cetlab.orchestra")

SIM_UTIL_PCT = {ModelState.LOADING: 25.0, ModelState.WARMING: 95.0, ModelState.WARM: 10.0}  # a simulated GPU's load by state
TIMED_EVENTS = ("load", "warmup", "wake", "swap", "cache")  # their last duration is shown as <event>_s


class PoolBook:
    """The models of this machine (``slots``) and the one place their changes are recorded.

    Every part of the pool (lifecycle, residency, placement, rotation) shares this object: a state
    change goes through ``set_state``, so it is timed, stored, shown on the GPUs and remembered.
    """

    def __init__(self, core: AgentCore) -> None:
        self.core = core
        self.slots: dict[str, Slot] = {}
        self.since = time.time()  # when the pool started counting unavailable_s
        self.unavailable_s = 0.0  # seconds models were out of service for swaps and rotations

    def kv_save(self, **values: Any) -> None:
        with self.core.store.transaction() as db:
            for key, value in values.items():
                db.execute("INSERT OR REPLACE INTO orchestra_kv VALUES (?, ?)", (key, json.dumps(value)))

    def event(
        self,
        slot: Slot,
        event: str,
        duration_s: float | None = None,
        detail: Any = None,
        from_state: str | None = None,
        to_state: str | None = None,
    ) -> None:
        with self.core.store.transaction() as db:
            db.execute(
                "INSERT INTO model_events (t, model, event, from_state, to_state, duration_s, detail) VALUES (?,?,?,?,?,?,?)",
                (time.time(), slot.name, event, from_state, to_state, duration_s, None if detail is None else json.dumps(detail)),
            )
        if duration_s is not None and event in TIMED_EVENTS:
            slot.timings[f"{event}_s"] = round(duration_s, 3)

    def set_state(self, slot: Slot, state: ModelState) -> None:
        if slot.state == state:
            return
        now = time.time()
        self.event(slot, "state", round(now - slot.since, 3), from_state=slot.state, to_state=state)
        log.info("%s: %s -> %s", slot.name, slot.state, state)
        slot.state, slot.since = state, now
        slot.measured = None  # e.g. a sleeping vLLM's residual: taken from the next sample, the estimate until then
        if state in MODEL_ENGINE_UP:
            slot.last_used = now
        if state != ModelState.WARM:
            slot.metrics, slot.tokens_per_s, slot.token_rate = EngineFigures(), None, WindowRate(TOKENS_PER_S_WINDOW_S)
        self.claim(slot)
        self.remember_engines()

    def claim(self, slot: Slot, util_pct: float | None = None) -> None:
        """Show the model on simulated GPUs (NVML machines see the real process)."""
        key = f"model:{slot.name}"
        held = slot.held_bytes()
        if not held:
            self.core.release_gpus(key)
            return
        if util_pct is None:
            util_pct = SIM_UTIL_PCT.get(slot.state, 0.0)
        pid = slot.engine.pid if slot.engine and slot.engine.pid else 0
        self.core.claim_gpus(slot.gpus, key, f"model {slot.name} ({slot.model.engine})", held, util_pct, pid)

    def notice(self, level: NoticeLevel, message: str) -> None:
        self.core.notify(Notice(level=level, message=message, machine=self.core.machine.name))

    def remember_engines(self) -> None:
        """The running engines, in state.db and in the models folder: a restarted agent re-adopts them."""
        running = remember(self.slots)
        self.kv_save(engines=running)
        keep_on_disk(self.core.state_dir / "models", running)
