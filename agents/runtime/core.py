"""What a component may use of the agent that runs it: a narrow, typed core, never the concrete ``Agent``.

A component is built with its core (``JobsComponent(core)``), so it never holds ``Agent | None`` and never
waits for ``start()`` to learn where it lives. It reaches another component only through a typed port, a
``Protocol`` the other side publishes (``core.find(GpuSupportPort)``), never by name and never through
another component's internals; news it has for others it publishes on the core (``core.publish(AlertsChanged(...))``)
for whoever subscribed to that event's class. ``Agent`` satisfies ``AgentCore``; tests may pass a small fake instead.

Layering (import-linter, pyproject): wire and schema (protocol, sections, states, schema, lab) below the
core (this module, rpc, store, history, telemetry), the core below the components.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from agents.runtime.rpc import Registry
    from agents.runtime.store import Store
    from agents.wire.events import PushEvent
    from agents.wire.lab.machines import Machine
    from agents.wire.lab.model import Lab
    from agents.wire.protocol import Telemetry

T = TypeVar("T")
E = TypeVar("E")


class AgentCore(Protocol):
    """The agent as its components see it."""

    @property
    def lab(self) -> Lab: ...

    @property
    def machine(self) -> Machine: ...

    @property
    def state_dir(self) -> Path: ...

    @property
    def rpc(self) -> Registry: ...  # register the component's methods here, at construction or start()

    @property
    def store(self) -> Store: ...  # the machine's SQLite state; open from start() on (raises before)

    @property
    def simulated(self) -> bool: ...  # the GPUs are simulated (figures are labelled SIM)

    @property
    def keep_engines(self) -> bool: ...  # model servers outlive the agent (systemd); the next one re-adopts them

    @property
    def interval_s(self) -> float: ...

    @property
    def latest(self) -> Telemetry | None: ...  # the newest sample; None before the first tick

    @property
    def current(self) -> Mapping[str, Any]: ...  # the typed sections of the latest tick, by name

    def notify(self, event: PushEvent) -> None: ...  # push an event (agents/wire/events.py) to every subscriber of its topic

    # news for the other components of this agent (agents/wire/local_events.py), by the event's class (agents/runtime/bus.py)
    def publish(self, event: object) -> None: ...

    def subscribe(self, kind: type[E], handler: Callable[[E], None]) -> None: ...

    def claim_gpus(self, indices: list[int], key: str, owner: str, mem_bytes: int, util_pct: float, pid: int = 0) -> None: ...

    def release_gpus(self, key: str) -> None: ...

    # the component that provides this port (a runtime-checkable Protocol), None where none runs. ``Callable[..., T]``
    # rather than ``type[T]``: mypy refuses a Protocol class where a concrete ``type[T]`` is expected (type-abstract)
    def find(self, port: Callable[..., T]) -> T | None: ...


ComponentFactory = Callable[["AgentCore"], Sequence[Any]]  # builds an agent's components with its core
