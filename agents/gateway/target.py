"""What a routed request is: its Target, the NotServable refusal every step raises, and how long a model takes to come up."""

from __future__ import annotations

import time
from dataclasses import dataclass

from agents.runtime.reach import Unreachable
from agents.wire.lab.gateway import Provider, ProviderModel
from agents.wire.lab.model import Model
from agents.wire.sections.models import ModelInfo
from agents.wire.states import ModelState

# Used when the pool has not timed a model yet: the field notes' figures
DEFAULT_WAKE_S, DEFAULT_LOAD_S, DEFAULT_WARMUP_S, COLD_FACTOR = 6.0, 15.0, 52.0, 14.0


def placement_key(model: Model) -> str:
    """One placement of a model: its name, and where it has replicas, the machine (a model of one placement: its name)."""
    return f"{model.name}@{model.machine}" if model.replicas else model.name


def why_failed(info: ModelInfo) -> str | None:
    return info.error.message if info.error is not None else None


def unreachable(exc: Unreachable, retry_after_s: int) -> NotServable:
    return NotServable(
        503,
        f"cannot reach {exc.machine}: its link is {exc.status}" + (f" ({exc.why})" if exc.why else "") + f"; fix: {exc.fix}",
        "machine_unreachable",
        retry_after_s,
    )


class NotServable(Exception):
    """The request cannot be answered: an HTTP status, a message, and for 503 a Retry-After."""

    def __init__(self, status: int, message: str, code: str, retry_after_s: int | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.retry_after_s, self.param = status, message, code, retry_after_s, param


@dataclass
class Target:
    """Where one request goes."""

    model: str  # the lab's name for it
    tier: str  # local | provider
    base_url: str  # ends in /v1
    upstream_model: str  # the name the endpoint answers to
    where: str  # machine or provider name
    simulated: bool
    provider: Provider | None = None
    provider_model: ProviderModel | None = None
    woke: bool = False
    reason: str | None = None  # why a fallback answered
    engine_model: Model | None = None  # local: the model whose engine answers (an adapter's base, or the model itself),
    # as placed on the machine that answers (a replica's machine, GPUs and port)
    unix_socket: str | None = None  # the socket that carries base_url: this machine's engine's, or the SSH forward's
    length_param: str | None = None  # local: the engine's own length field (its EngineSpec.length_param)


def expected_bring_up_s(info: ModelInfo | None) -> float:
    """How long until this model can answer, from the pool's own timings."""
    if info is None:
        return float("inf")
    load = info.load_s or DEFAULT_LOAD_S
    warmup = info.warmup_s or DEFAULT_WARMUP_S
    match info.state:
        case ModelState.WARM:
            return 0.0
        case ModelState.SLEEPING:
            return info.wake_s or DEFAULT_WAKE_S
        case ModelState.CACHED:
            return load + warmup
        case ModelState.COLD:
            return load * COLD_FACTOR + warmup
        case ModelState.LOADING | ModelState.WARMING:
            elapsed = time.time() - (info.since or time.time())
            total = (info.wake_s or DEFAULT_WAKE_S) if info.op == "wake" else load + warmup
            return max(0.0, total - elapsed)
        case ModelState.FAILED:
            return float("inf")
