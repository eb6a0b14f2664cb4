"""The pool's page-cache budget: which models' files are in RAM, pre-reading them, and evicting the least recently used."""

from __future__ import annotations

import asyncio
import os
import sys
import time

from agents.orchestra import pagecache
from agents.orchestra.book import PoolBook
from agents.orchestra.engine import GIB
from agents.orchestra.engines import engine_spec
from agents.orchestra.slot import EngineFailed, Slot, gib_text
from agents.runtime.children import OFFLINE, minimal_env, run_helper
from agents.runtime.core import AgentCore
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.models import ModelProgress
from agents.wire.states import MODEL_ENGINE_UP, ModelState

TINY_TIMEOUT_S = 300.0  # the demo's tiny Llama: seconds on any machine (torch's import is most of it)
CACHED_MIN_FRACTION = 0.9  # a model counts as cached when this share of its files is in RAM


class Residency:
    """The pool's page-cache residency and its RAM-cache budget (machines[].ram_cache_gib)."""

    def __init__(self, core: AgentCore, book: PoolBook) -> None:
        self.core = core
        self.book = book

    def make_placeholders(self) -> None:
        for slot in self.book.slots.values():
            size_mib = slot.model.sim.placeholder_mib
            spec = engine_spec(slot.model.engine)
            if spec.simulated and size_mib is not None and not slot.path.exists():
                if spec.model_formats == ("gguf",):  # one .gguf file, not a folder
                    pagecache.write_placeholder_file(slot.path, int(size_mib * 1024 * 1024))
                else:
                    pagecache.write_placeholder(slot.path, int(size_mib * 1024 * 1024))

    async def make_tiny(self, slot: Slot) -> None:
        """The demo's tiny Llama, made in a child process (torch stays out of the agent)."""
        slot.progress = ModelProgress(phase="making the tiny model")
        code = "import sys; from agents.train.tiny import make_tiny_model; make_tiny_model(sys.argv[1])"
        python_path = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
        # a helper like any other: a timeout, its output's end kept, the agent's secrets and the network left out
        done = await run_helper(
            [sys.executable, "-c", code, str(slot.path)], timeout_s=TINY_TIMEOUT_S, env=minimal_env({**OFFLINE, **python_path})
        )
        if done.timed_out or done.returncode != 0:
            why = f"took over {TINY_TIMEOUT_S:.0f} s" if done.timed_out else done.output.decode(errors="replace")[-300:]
            raise EngineFailed(f"making the tiny model at {slot.path} failed: {why}")
        await asyncio.to_thread(self.measure, slot)
        await asyncio.to_thread(slot.estimate_need)  # its files are there now

    def measure(self, slot: Slot) -> None:
        files = pagecache.model_files(slot.path) if slot.path.exists() else []
        found = pagecache.residency(files)
        slot.cached_bytes, slot.size_bytes = found.resident_bytes, found.total_bytes

    def measure_all(self) -> None:
        for slot in self.book.slots.values():
            self.measure(slot)

    @staticmethod
    def rest_state(slot: Slot) -> ModelState:
        fraction = slot.cached_fraction
        return ModelState.CACHED if fraction is not None and fraction >= CACHED_MIN_FRACTION else ModelState.COLD

    def budget_bytes(self) -> int | None:
        gib = self.core.machine.ram_cache_gib
        return None if gib is None else int(gib * GIB)

    async def make_room(self, slot: Slot, strict: bool) -> bool:
        """Evict least recently used models until this one fits the RAM-cache budget."""
        budget = self.budget_bytes()
        if budget is None:
            return True
        if slot.size_bytes > budget:
            if strict:
                raise RemoteError(
                    ErrorCode.CONFLICT,
                    f"{slot.name} is {gib_text(slot.size_bytes)}, more than the RAM-cache budget of "
                    f"{self.core.machine.name} ({gib_text(budget)}, machines[].ram_cache_gib)",
                )
            return False
        others = [
            s
            for s in self.book.slots.values()
            if s is not slot and s.cached_bytes and not (s.busy and s.state == ModelState.LOADING)
        ]
        # idle models go first, then those already on a GPU (they no longer read their files); oldest use first
        others.sort(key=lambda s: (s.state in MODEL_ENGINE_UP, s.last_used))
        used = sum(s.cached_bytes for s in others)
        while used + slot.size_bytes - slot.cached_bytes > budget and others:
            victim = others.pop(0)
            files = pagecache.model_files(victim.path)
            await asyncio.to_thread(pagecache.evict, files)
            before = victim.cached_bytes
            await asyncio.to_thread(self.measure, victim)
            used -= before - victim.cached_bytes
            self.book.event(victim, "evict", detail={"for": slot.name, "freed_bytes": before - victim.cached_bytes})
            if victim.state == ModelState.CACHED:
                self.book.set_state(victim, self.rest_state(victim))
        return used + slot.size_bytes - slot.cached_bytes <= budget

    async def cache(self, slot: Slot, strict: bool) -> None:
        """Pre-read the model's files into the page cache, within the budget, with progress."""
        if not await self.make_room(slot, strict):
            if strict:
                raise RemoteError(
                    ErrorCode.CONFLICT, f"the RAM-cache budget of {self.core.machine.name} is taken by models in use"
                )
            return
        slot.progress = ModelProgress(phase="caching", done_bytes=0, total_bytes=slot.size_bytes)

        def progress(done: int, total_bytes: int) -> None:
            slot.progress = ModelProgress(phase="caching", done_bytes=done, total_bytes=total_bytes)

        try:
            read_bytes, seconds = await asyncio.to_thread(pagecache.warm, pagecache.model_files(slot.path), progress)
        except OSError as exc:
            raise RemoteError(
                ErrorCode.UNAVAILABLE, f"cannot read the files of {slot.name} on {self.core.machine.name}: {exc}"
            ) from None
        await asyncio.to_thread(self.measure, slot)
        slot.last_used = time.time()
        slot.progress = None
        self.book.event(
            slot, "cache", seconds, detail={"bytes": read_bytes, "bytes_per_s": read_bytes / seconds if seconds else None}
        )
