"""CheckpointsComponent: the runs of this machine, rescanned in the background, composed of its parts.

The parts, each built with what it uses: catalog.py (the runs as last scanned, kept flags, why a checkpoint is in
use), serving.py (serving a checkpoint through the model pool's port), actions.py (delete, prune, keep, resume);
records.py holds what is served, shared by the catalog (reads) and serving (writes).
"""

from __future__ import annotations

import asyncio
import logging

from agents.checkpoints.actions import CheckpointActions
from agents.checkpoints.catalog import RunCatalog
from agents.checkpoints.discovery import Run
from agents.checkpoints.methods import register
from agents.checkpoints.records import ServedRecords
from agents.checkpoints.serving import CheckpointServing
from agents.runtime.core import AgentCore
from agents.runtime.hooks import Hooks
from agents.wire.protocol import Telemetry
from agents.wire.sections.checkpoints import RunSummary

log = logging.getLogger("cetlab.checkpoints")

SCHEMA = [
    "CREATE TABLE checkpoint_flags (path TEXT PRIMARY KEY, kept INTEGER NOT NULL, t REAL NOT NULL)",
    """CREATE TABLE checkpoint_events (id INTEGER PRIMARY KEY, t REAL NOT NULL, run TEXT NOT NULL, step INTEGER,
       path TEXT, event TEXT NOT NULL, who TEXT, detail TEXT)""",
]


class CheckpointsComponent(Hooks):
    """Hugging Face checkpoints of every run on this machine: timeline, keep, prune, serve, resume (CheckpointsPort)."""

    name = "checkpoints"

    def __init__(self, core: AgentCore) -> None:
        self.core = core
        self.served: ServedRecords = {}
        self.catalog = RunCatalog(core, self.served)
        self.serving = CheckpointServing(core, self.catalog, self.served)
        self.actions = CheckpointActions(core, self.catalog)
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle

    async def start(self) -> None:
        """Registers the methods and starts the background scan: the agent listens before the first scan ends."""
        self.core.store.migrate(self.name, SCHEMA)
        self.catalog.load_kept()
        register(self)
        self._tasks.append(asyncio.create_task(self._loop(), name="checkpoints"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def on_telemetry(self, telemetry: Telemetry) -> None:
        """Discovery runs on its own, slower poll (lab.yaml checkpoints.poll_s)."""

    def section(self) -> list[RunSummary]:
        return self.catalog.summaries

    def run_summaries(self) -> list[RunSummary]:  # CheckpointsPort (agents/checkpoints/port.py)
        return self.catalog.summaries

    async def rescan(self) -> None:
        await self.catalog.rescan()

    async def run(self, name: str) -> Run:
        return await self.catalog.run(name)

    async def _loop(self) -> None:
        while True:
            try:
                await self.catalog.rescan()
            except Exception:
                log.exception("checkpoint scan failed")
            await asyncio.sleep(self.core.lab.checkpoints.poll_s)
