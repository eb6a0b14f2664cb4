"""What tests/e2e/orchestra/test_checkpoints_port.py, tests/fast/runtime/test_core.py share: T, E, SmallCore."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from agents.runtime.bus import Bus
from agents.runtime.rpc import Registry
from agents.runtime.store import Store
from agents.wire.events import PushEvent
from agents.wire.lab.machines import Machine
from agents.wire.lab.model import Lab
from agents.wire.protocol import Telemetry

T = TypeVar("T")


E = TypeVar("E")


@dataclass
class SmallCore:
    """An AgentCore with only what a component may use; `parts` stand for the other components."""

    lab: Lab
    machine: Machine
    state_dir: Path
    store: Store
    rpc: Registry = field(default_factory=Registry)
    parts: list[Any] = field(default_factory=list)
    events: list[tuple[str, PushEvent]] = field(default_factory=list)
    simulated: bool = True
    keep_engines: bool = False
    interval_s: float = 1.0
    latest: Telemetry | None = None
    current: Mapping[str, Any] = field(default_factory=dict)
    bus: Bus = field(default_factory=Bus)

    def notify(self, event: PushEvent) -> None:
        self.events.append((event.event, event))

    def publish(self, event: object) -> None:
        self.bus.publish(event)

    def subscribe(self, kind: type[E], handler: Callable[[E], None]) -> None:
        self.bus.subscribe(kind, handler)

    def claim_gpus(self, indices: list[int], key: str, owner: str, mem_bytes: int, util_pct: float, pid: int = 0) -> None:
        pass

    def release_gpus(self, key: str) -> None:
        pass

    def find(self, port: Callable[..., T]) -> T | None:
        kind = cast("type[T]", port)
        return next((p for p in self.parts if isinstance(p, kind)), None)
