"""The gateway's section of the tick: typed, numbers finite or null (alerts and the console read it)."""

from __future__ import annotations

from pydantic import Field

from agents.protocol import Snapshot


class GatewayModelFigures(Snapshot):
    """One model as the gateway sees it: its traffic over the last minute and what it caused."""

    name: str
    tier: str  # local | provider
    where: str | None = None  # machine or provider
    state: str | None = None  # the pool's state for local models
    simulated: bool = False
    rps: float = 0.0
    in_flight: int = 0
    queued: int = 0
    p50_latency_s: float | None = None
    p95_latency_s: float | None = None
    p50_ttft_s: float | None = None
    p95_ttft_s: float | None = None
    requests: int = 0  # since the agent started
    wakes: int = 0  # bring-ups the gateway caused
    errors: int = 0


class ProviderSpend(Snapshot):
    """A provider's spend against its monthly budget (alerts fire at 80% and 100%)."""

    name: str
    simulated: bool = False
    spend_today: float = 0.0
    spend_month: float = 0.0
    monthly_budget: float | None = None
    budget_pct: float | None = None
    key_set: bool = True  # its api_key_env is set in the agent's environment (or none is needed)


class KeyUse(Snapshot):
    name: str
    revoked: bool = False
    rpm: int | None = None
    tokens_per_day: int | None = None
    requests: int = 0
    requests_last_minute: int = 0
    tokens_today: int = 0
    last_used: float | None = None


class GatewaySection(Snapshot):
    url: str | None = None  # None until it listens
    machine: str
    error: str | None = None  # why it does not serve
    currency: str = "USD"
    peers: dict[str, str] = Field(default_factory=dict)  # machine -> online | offline | refused | untrusted ...
    models: list[GatewayModelFigures] = Field(default_factory=list)
    providers: list[ProviderSpend] = Field(default_factory=list)
    keys: list[KeyUse] = Field(default_factory=list)
