"""The gateway's lab.yaml schema: `gateway:` (where and how it serves) and `providers:` (cloud tiers)."""

from __future__ import annotations

import re
from datetime import date, datetime
from fnmatch import fnmatchcase
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from agents.wire.schema import MAX_PRICE, CurrencyCode, KeyModelPattern, Name, Price, Strict, parse_duration

Seconds = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]
ENV_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
MAX_GROUP_MEMBERS = 32  # an orchestra call fans out to at most this many models (the gateway's MAX_FANOUT)


class ProviderModel(Strict):
    """One model a provider sells, with its prices per million tokens (in the lab's currency)."""

    name: Name  # how the lab asks for it (and a fallback names it)
    upstream: str | None = None  # the provider's own name for it; default: name
    prompt_per_million: Price = 0.0
    completion_per_million: Price = 0.0

    @property
    def upstream_name(self) -> str:
        return self.upstream or self.name


def _plain_base_url(url: str) -> str:
    """A provider's base_url: no credentials in it (api_key_env holds the key) and nothing that could split a header."""
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not hold credentials (user:password@); name the variable holding the key in api_key_env")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise ValueError("must not hold spaces or control characters (CR, LF ...)")
    if not parts.hostname:
        raise ValueError("names no host")
    return url


class Provider(Strict):
    """A cloud tier: an OpenAI-compatible API paid per token, within a monthly budget."""

    name: Name
    base_url: Annotated[
        str, Field(pattern=r"^https?://", max_length=2048), AfterValidator(_plain_base_url)
    ]  # ends before /chat/completions
    api_key_env: Annotated[str, Field(pattern=ENV_RE)] | None = None  # the variable holding the key; never the key itself
    models: list[ProviderModel] = Field(min_length=1)
    monthly_budget: Price | None = None  # None: no budget
    simulated: bool = False  # a local stand-in (the demo's): labelled SIM wherever it shows
    timeout_s: Seconds = 120.0


KeyExpiry = date | datetime  # a date: the key ends at that day's start, in the lab's time zone
_BUDGET_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]{3})?\s*/\s*(day|month)\s*$", re.IGNORECASE)


class KeyBudget(Strict):
    """A key's money budget: what its requests may cost (the providers' prices) per day or per month, in the lab's
    currency. Written `5usd/day`, `20/month`, `7.5 EUR/month`."""

    amount: Annotated[float, Field(gt=0, le=MAX_PRICE)]
    period: Literal["day", "month"]
    currency: CurrencyCode | None = None  # as written; must be the lab's currency

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        match = _BUDGET_RE.match(value)
        if match is None:
            raise ValueError(
                f"a budget is AMOUNT[CURRENCY]/day or AMOUNT[CURRENCY]/month (5usd/day, 20/month), got {value[:40]!r}"
            )
        return {"amount": float(match[1]), "currency": match[2].upper() if match[2] else None, "period": match[3].lower()}

    def __str__(self) -> str:
        return f"{self.amount:g}{' ' + self.currency if self.currency else ''}/{self.period}"


class KeyLimits(Strict):
    """What a gateway key may do beyond its quotas: which models (names and aliases, fnmatch patterns; none listed:
    all), until when, and how much money per day or month."""

    models: list[KeyModelPattern] = Field(default_factory=list, max_length=256)
    expires: KeyExpiry | None = None
    budget: KeyBudget | None = None

    def allows(self, names: set[str]) -> bool:
        """Whether one of a model's names (as asked, its lab name, its aliases) matches one of the key's patterns."""
        return not self.models or any(fnmatchcase(name, pattern) for name in names for pattern in self.models)


class GatewayModel(Strict):
    """Per-model gateway policy for a lab model (key: the model's name)."""

    aliases: list[str] = Field(default_factory=list)  # other names the model answers to
    fallback: str | None = None  # a provider model (name, or provider/name) used when this one cannot answer in time
    max_wait_s: Seconds | None = None  # the latency budget when the request sends none
    idle_ttl_s: Seconds | None = None  # asleep (or stopped) after this long without a gateway request


class GatewayPolicies(Strict):
    queue_size: Annotated[int, Field(ge=0, le=100000)] = 64  # requests waiting for one model to come up; beyond: 503
    queue_timeout_s: Seconds = 120.0  # a request waits this long for its model, then 504 (or its fallback)
    swap: Literal["never", "lru-unpinned"] = "never"  # may a request swap another model out to make room?
    idle_ttl_s: Seconds | None = 900.0  # models the gateway brought up go back to sleep after this idle time
    budget_exceeded: Literal["refuse", "fallback-local"] = "refuse"  # past 100% of a provider's budget
    retry_after_s: Annotated[int, Field(ge=1, le=3600)] = 5  # in a 503's Retry-After
    max_body_bytes: Annotated[int, Field(ge=1024, le=64 * 1024 * 1024)] = 4 * 1024 * 1024
    max_tokens: Annotated[int, Field(ge=1, le=10_000_000)] = 32768  # the most one request may ask for; more is a 400
    key_concurrency: Annotated[int, Field(ge=1, le=10000)] = (
        4  # requests one key may have in flight (an orchestra call is one); beyond: 429
    )
    max_connections: Annotated[int, Field(ge=1, le=65536)] | None = None  # None: 1/8 of the agent's fd limit, at most 4096
    first_request_s: Seconds = 10.0  # a connection sends its first request head within this, or is closed
    idle_s: Seconds = 15.0  # a kept-alive connection with no request (or half a request head) this long is closed
    body_timeout_s: Seconds = 30.0  # a request body arrives whole within this, or 408


class Gateway(Strict):
    """The lab gateway: one OpenAI-compatible endpoint, served by the agent of `machine`."""

    machine: Name
    host: str = "127.0.0.1"  # where it listens (0.0.0.0: the whole network; keys guard it)
    port: int = Field(default=8400, ge=0, le=65535)  # 0: any free port (the log and section say which)
    policies: GatewayPolicies = Field(default_factory=GatewayPolicies)
    models: dict[Name, GatewayModel] = Field(default_factory=dict)
    keys: dict[Name, KeyLimits] = Field(default_factory=dict)  # limits of the key of that name; they win over the CLI's

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"


def find_provider_model(providers: list[Provider], name: str) -> tuple[Provider, ProviderModel] | None:
    """A provider model by `name` or `provider/name`."""
    provider_name, _, model_name = name.rpartition("/")
    for provider in providers:
        if provider_name and provider.name != provider_name:
            continue
        for model in provider.models:
            if model.name == model_name:
                return provider, model
    return None


def cross_check(
    providers: list[Provider],
    gateway: Gateway | None,
    machines: list[str],
    local: set[str],
    groups: dict[str, list[str]],
    currency: str = "USD",
) -> list[tuple[tuple[str | int, ...], str]]:
    """References of the gateway and providers sections to the rest of the lab (its machines, local models and
    orchestra groups): machine, models, fallbacks, groups, aliases."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    seen: set[str] = set()
    for i, provider in enumerate(providers):
        if provider.name in seen:
            problems.append((("providers", i, "name"), f"duplicate provider {provider.name!r}"))
        seen.add(provider.name)
    if gateway is None:
        return problems
    if gateway.machine not in machines:
        problems.append((("gateway", "machine"), f"no machine named {gateway.machine!r} (machines: {', '.join(machines)})"))
    for name, limits in gateway.keys.items():
        budget = limits.budget
        if budget is not None and budget.currency is not None and budget.currency != currency.upper():
            problems.append(
                (
                    ("gateway", "keys", name, "budget"),
                    f"in {budget.currency}; this lab counts money in {currency} (costs.currency)",
                )
            )
    names: dict[str, str] = {}
    for name, policy in gateway.models.items():
        if name not in local:
            problems.append((("gateway", "models", name), f"no model named {name!r} in models:"))
        if policy.fallback is not None and find_provider_model(providers, policy.fallback) is None:
            problems.append(
                (
                    ("gateway", "models", name, "fallback"),
                    f"{policy.fallback!r} is no provider's model (providers: {', '.join(seen) or 'none'})",
                )
            )
        for j, alias in enumerate(policy.aliases):
            if alias in local or alias in names:
                problems.append(
                    (("gateway", "models", name, "aliases", j), f"alias {alias!r} is already a model's name or alias")
                )
            names[alias] = name
    for group, members in groups.items():
        if len(members) > MAX_GROUP_MEMBERS:
            problems.append(
                (("orchestra", "groups", group), f"{len(members)} members; an orchestra call asks at most {MAX_GROUP_MEMBERS}")
            )
        for j, member in enumerate(members):
            if member not in local and member not in names and find_provider_model(providers, member) is None:
                problems.append((("orchestra", "groups", group, j), f"{member!r} is no lab model, alias or provider model"))
    return problems
