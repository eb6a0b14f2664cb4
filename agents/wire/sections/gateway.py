"""The typed sections of a tick: one model per section, produced by the agent's components, parsed by consoles: gateway."""

from __future__ import annotations

from pydantic import Field

from agents.wire.protocol import Finite, FiniteFloat
from agents.wire.sections.base import GatewayTier, Section
from agents.wire.sections.costs import ProviderSpend


class ReplicaFigures(Section):
    """One placement of a model with replicas, as the gateway routes to it."""

    machine: str
    gpus: list[int] = Field(default_factory=list)
    state: str | None = None  # the pool's state there (unknown while that machine's models are)
    draining: bool = False  # going out: it gets no new request
    outstanding: int = 0  # this gateway's requests at it now


class GatewayModelFigures(Section):
    """One model as the gateway sees it: its traffic over the last minute and what it caused."""

    name: str
    tier: GatewayTier
    where: str | None = None  # machine or provider
    state: str | None = None  # the pool's state for local models
    simulated: bool = False
    rps: FiniteFloat = 0.0
    in_flight: int = 0
    queued: int = 0
    p50_latency_s: Finite = None
    p95_latency_s: Finite = None
    p50_ttft_s: Finite = None
    p95_ttft_s: Finite = None
    requests: int = 0  # since the agent started
    wakes: int = 0  # bring-ups the gateway caused
    errors: int = 0
    replicas: list[ReplicaFigures] = Field(default_factory=list)  # a model with replicas: each placement


class KeyUse(Section):
    name: str
    revoked: bool = False
    rpm: int | None = None
    tokens_per_day: int | None = None
    requests: int = 0
    requests_last_minute: int = 0
    tokens_today: int = 0
    last_used: Finite = None
    models: list[str] = Field(default_factory=list)  # the models it may use (patterns); none: every model
    expires: str | None = None  # ISO date or time
    expired: bool = False
    budget: str | None = None  # as `5 USD/day`
    budget_amount: Finite = None
    spent: FiniteFloat = 0.0  # in the budget's period


class GatewaySection(Section):
    url: str | None = None  # None until it listens
    machine: str
    error: str | None = None  # why it does not serve
    currency: str = "USD"
    peers: dict[str, str] = Field(default_factory=dict)  # machine -> online | offline | refused | untrusted ...
    models: list[GatewayModelFigures] = Field(default_factory=list)
    providers: list[ProviderSpend] = Field(default_factory=list)
    keys: list[KeyUse] = Field(default_factory=list)
