"""The method catalogue: every RPC method with its params model, its result model, its role and its doc: gateway."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from agents.wire.catalogue.method import OP, Method, NoParams, Params, Root
from agents.wire.lab.gateway import KeyBudget, KeyExpiry
from agents.wire.protocol import (
    Finite,
    FiniteFloat,
)
from agents.wire.schema import KeyModelPattern, Name
from agents.wire.sections.base import Section
from agents.wire.sections.gateway import GatewaySection


class KeyAddParams(Params):
    name: Name
    rpm: int | None = Field(default=None, ge=1, le=1_000_000)  # requests per minute
    tokens_per_day: int | None = Field(default=None, ge=1)
    models: list[KeyModelPattern] = Field(default_factory=list, max_length=256)  # names, aliases, fnmatch patterns
    expires: KeyExpiry | None = None
    budget: KeyBudget | None = None  # "5usd/day" or its object


class KeyNameParams(Params):
    name: Name


class GatewayStatus(Root):
    """`gateway.status`: the gateway's section, or null where it does not run."""

    model_config = ConfigDict(defer_build=True)

    root: GatewaySection | None


class KeyIssued(Section):
    name: str
    key: str  # the token: shown once, never again
    rpm: int | None = None
    tokens_per_day: int | None = None
    models: list[str] = Field(default_factory=list)
    expires: str | None = None  # ISO date or time
    budget: str | None = None  # as `5 USD/day`
    url: str | None = None


class KeyRecord(Section):
    name: str
    created_at: FiniteFloat
    revoked_at: Finite = None
    rpm: int | None = None
    tokens_per_day: int | None = None
    requests: int = 0
    tokens_today: int = 0
    last_used: Finite = None
    requests_last_minute: int = 0
    models: list[str] = Field(default_factory=list)  # none: every model
    expires: str | None = None  # ISO date or time
    expired: bool = False
    budget: str | None = None  # as `5 USD/day`
    spent: FiniteFloat = 0.0  # in the budget's period (today or this month), requests in flight not included


class KeyList(Section):
    keys: list[KeyRecord] = Field(default_factory=list)


class KeyRevoked(Section):
    name: str
    revoked: bool


GATEWAY_STATUS = Method(
    "gateway.status", NoParams, GatewayStatus, doc="The gateway's section: url, per-model traffic, provider spend, keys."
)


GATEWAY_KEYS_ADD = Method("gateway.keys.add", KeyAddParams, KeyIssued, OP, "Issue a gateway API key; the token is shown once.")


GATEWAY_KEYS_LIST = Method("gateway.keys.list", NoParams, KeyList, doc="Gateway keys (names, quotas, use; never the tokens).")


GATEWAY_KEYS_REVOKE = Method("gateway.keys.revoke", KeyNameParams, KeyRevoked, OP, "Revoke a gateway key at once.")
