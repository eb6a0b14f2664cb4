"""Reservations: before a request goes upstream it holds its worst case (its prompt plus `max_tokens`) against its
key's tokens per day and its provider's monthly budget, and one of its key's concurrent slots; it settles at the real
count. Concurrent requests therefore cannot together pass a quota or a budget that each alone fits in, and
`max_tokens` is lowered to what the key (and the budget) still has, or the request is refused."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agents.gateway.keys import ApiKey, KeyStore
from agents.gateway.metering import Meter
from agents.gateway.router import NotServable, Target
from agents.wire.lab.gateway import GatewayPolicies

MAX_TOKENS_FIELDS = ("max_completion_tokens", "max_tokens")  # OpenAI's newer name first


@dataclass
class Hold:
    """What one request holds until it settles."""

    key: ApiKey
    tokens: int  # against the key's tokens per day
    asked: int | None  # the max_tokens the client sent
    max_tokens: int | None = None  # what goes upstream (None: as asked)
    provider: str | None = None
    money: float = 0.0  # against the provider's monthly budget


def asked_max_tokens(body: dict[str, Any], cap: int) -> int | None:
    """The client's max_tokens (or max_completion_tokens): a whole number from 1 to the gateway's cap, or absent."""
    for name in MAX_TOKENS_FIELDS:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise NotServable(400, f"{name} must be a whole number >= 1", "invalid_max_tokens", param=name)
        if value > cap:
            raise NotServable(
                400,
                f"{name} is {str(value)[:24]}; this gateway answers at most {cap} tokens a request (gateway.policies.max_tokens)",
                "invalid_max_tokens",
                param=name,
            )
        return value
    return None


def with_max_tokens(body: dict[str, Any], hold: Hold) -> dict[str, Any]:
    """The body to send upstream: max_tokens lowered to what the hold allows."""
    if hold.max_tokens is None or hold.max_tokens == hold.asked:
        return body
    name = next((n for n in MAX_TOKENS_FIELDS if body.get(n) is not None), "max_tokens")
    return {**body, name: hold.max_tokens}


class Reservations:
    """The holds in flight, per key and per provider."""

    def __init__(self, keys: KeyStore, meter: Meter, policies: GatewayPolicies):
        self.keys, self.meter, self.policies = keys, meter, policies
        self.tokens: dict[str, int] = {}  # key name -> tokens held
        self.money: dict[str, float] = {}  # provider -> money held
        self.in_flight: dict[str, int] = {}  # key name -> requests being answered

    def enter(self, key: ApiKey) -> None:
        """One of the key's concurrent slots (gateway.policies.key_concurrency); 429 when all are taken."""
        if self.in_flight.get(key.name, 0) >= self.policies.key_concurrency:
            raise NotServable(
                429,
                f"key {key.name} has {self.policies.key_concurrency} requests in flight "
                "(gateway.policies.key_concurrency); wait for one to finish",
                "too_many_requests",
                1,
            )
        self.in_flight[key.name] = self.in_flight.get(key.name, 0) + 1

    def leave(self, key: ApiKey) -> None:
        left = self.in_flight.get(key.name, 0) - 1
        if left > 0:
            self.in_flight[key.name] = left
        else:
            self.in_flight.pop(key.name, None)

    def reserve_tokens(self, key: ApiKey, prompt_tokens: int, asked: int | None) -> Hold:
        """Hold prompt + max_tokens against the key's tokens per day; max_tokens lowered to the key's room, or 429."""
        hold = Hold(key=key, tokens=prompt_tokens + (asked or self.policies.max_tokens), asked=asked)
        if key.tokens_per_day is not None:
            used = self.keys.tokens_today(key) + self.tokens.get(key.name, 0)
            room = key.tokens_per_day - used - prompt_tokens
            if room < 1:
                raise NotServable(
                    429,
                    f"key {key.name}: its {key.tokens_per_day} tokens per day are used or held by requests in flight",
                    "quota_exceeded",
                    60,
                )
            if asked is None or asked > room:
                hold.max_tokens = room
            hold.tokens = prompt_tokens + (hold.max_tokens or asked or 0)
        self.tokens[key.name] = self.tokens.get(key.name, 0) + hold.tokens
        return hold

    def reserve_money(self, hold: Hold, target: Target, prompt_tokens: int) -> None:
        """Hold the worst cost against a provider's monthly budget; max_tokens lowered to what it still affords, or 429."""
        provider, model = target.provider, target.provider_model
        if provider is None or model is None or provider.monthly_budget is None:
            return
        held = self.money.get(provider.name, 0.0)
        headroom = provider.monthly_budget - self.meter.spend_month.get(provider.name, 0.0) - held
        prompt_cost = prompt_tokens * model.prompt_per_million / 1e6
        completion = hold.max_tokens or hold.asked or self.policies.max_tokens
        if model.completion_per_million > 0:
            affordable = math.floor((headroom - prompt_cost) / (model.completion_per_million / 1e6))
            completion = min(completion, affordable)
        if completion < 1 or headroom - prompt_cost <= 0:
            raise NotServable(
                429,
                f"{provider.name} has spent or holds for requests in flight its monthly budget "
                f"({provider.monthly_budget}); gateway.policies.budget_exceeded is {self.policies.budget_exceeded}",
                "budget_exceeded",
                self.policies.retry_after_s,
            )
        if completion != (hold.max_tokens or hold.asked or self.policies.max_tokens) or hold.max_tokens is not None:
            hold.max_tokens = completion
        hold.provider = provider.name
        hold.money = prompt_cost + completion * model.completion_per_million / 1e6
        self.money[provider.name] = held + hold.money

    def release(self, hold: Hold) -> None:
        """The request settled (its real count is charged by the meter): what it held is free again."""
        left = self.tokens.get(hold.key.name, 0) - hold.tokens
        if left > 0:
            self.tokens[hold.key.name] = left
        else:
            self.tokens.pop(hold.key.name, None)
        if hold.provider is not None:
            money = self.money.get(hold.provider, 0.0) - hold.money
            if money > 1e-12:
                self.money[hold.provider] = money
            else:
                self.money.pop(hold.provider, None)
        hold.tokens, hold.money, hold.provider = 0, 0.0, None

    def held_money(self, provider: str) -> float:
        return self.money.get(provider, 0.0)
