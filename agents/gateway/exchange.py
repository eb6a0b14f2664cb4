"""One request to one model, whichever way it came: any model route (agents.gateway.routes) or a member of the orchestra
call (agents.gateway.fanout). Each is an Exchange and takes GatewayHttp's same three steps: admit (the checks), carry
(the hold, routing and waking, the request upstream, its retry), close (released and metered); a new way in is a new
caller of these and cannot skip one."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agents.gateway import proxy
from agents.gateway.keys import ApiKey
from agents.gateway.metering import ModelStats, Record
from agents.gateway.reservation import Hold
from agents.gateway.routes import Route
from agents.gateway.target import Target

R = TypeVar("R")
Send = Callable[[Target, dict[str, Any], float], Awaitable[tuple[R, proxy.Outcome]]]  # a request upstream: (answer, outcome)


@dataclass
class Exchange:
    """One request to one model, whichever way it came (any model route, a member of the orchestra call): each takes
    the same steps (GatewayHttp.admit, carry, close), so a new way in cannot skip a check, the hold or the meter."""

    key: ApiKey
    model: str  # as the client named it
    route: Route
    body: dict[str, Any]  # in the route's upstream form (a mapped API's body, as chat)
    record: Record
    max_wait_s: float | None = None  # how long its model may take to come up
    timeout_s: float | None = None  # the upstream's; None: the provider's own, else 10 x gateway.policies.queue_timeout_s
    begun: Callable[[], bool] = lambda: False  # whether the client has bytes of the answer (then no retry)
    stats: ModelStats | None = None
    hold: Hold | None = None
    target: Target | None = None
    started: float = field(default_factory=time.monotonic)
