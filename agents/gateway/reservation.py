"""Reservations: before a request goes upstream it holds its worst case (its prompt's upper bound plus every choice at
the full length figure, see agents.gateway.lengths) against its key's tokens per day and its provider's monthly budget,
and one of its key's concurrent slots; it settles at the real count. Concurrent requests therefore cannot together
pass a quota or a budget that each alone fits in, and the figure is lowered to what the key (and the budget) still has
for every choice, or the request is refused."""

from __future__ import annotations

import math
from dataclasses import dataclass

from agents.gateway.keys import ApiKey, KeyStore
from agents.gateway.lengths import Lengths
from agents.gateway.metering import Meter
from agents.gateway.router import NotServable, Target
from agents.wire.lab.gateway import GatewayPolicies


@dataclass
class Hold:
    """What one request holds until it settles."""

    key: ApiKey
    tokens: int  # against the key's tokens per day: the prompt's bound + choices x figure
    figure: int  # the length of each choice, as sent upstream
    choices: int = 1
    provider: str | None = None
    money: float = 0.0  # against the provider's monthly budget


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

    def reserve_tokens(self, key: ApiKey, prompt_tokens: int, lengths: Lengths) -> Hold:
        """Hold the prompt + every choice at the figure against the key's tokens per day; the figure lowered to the
        key's room per choice, or 429."""
        hold = Hold(key=key, tokens=0, figure=lengths.figure, choices=lengths.choices)
        if key.tokens_per_day is not None:
            used = self.keys.tokens_today(key) + self.tokens.get(key.name, 0)
            room = (key.tokens_per_day - used - prompt_tokens) // hold.choices
            if room < 1:
                raise NotServable(
                    429,
                    f"key {key.name}: its {key.tokens_per_day} tokens per day are used or held by requests in flight",
                    "quota_exceeded",
                    60,
                )
            hold.figure = min(hold.figure, room)
        hold.tokens = prompt_tokens + hold.choices * hold.figure
        self.tokens[key.name] = self.tokens.get(key.name, 0) + hold.tokens
        return hold

    def reserve_money(self, hold: Hold, target: Target, prompt_tokens: int) -> None:
        """Hold the worst cost against a provider's monthly budget; the figure lowered to what it still affords for
        every choice, or 429."""
        provider, model = target.provider, target.provider_model
        if provider is None or model is None or provider.monthly_budget is None:
            return
        held = self.money.get(provider.name, 0.0)
        headroom = provider.monthly_budget - self.meter.spend_month.get(provider.name, 0.0) - held
        prompt_cost = prompt_tokens * model.prompt_per_million / 1e6
        per_token = model.completion_per_million / 1e6
        figure = hold.figure
        if per_token > 0:
            figure = min(figure, math.floor((headroom - prompt_cost) / (per_token * hold.choices)))
        if figure < 1 or headroom - prompt_cost <= 0:
            raise NotServable(
                429,
                f"{provider.name} has spent or holds for requests in flight its monthly budget "
                f"({provider.monthly_budget}); gateway.policies.budget_exceeded is {self.policies.budget_exceeded}",
                "budget_exceeded",
                self.policies.retry_after_s,
            )
        self._lower(hold, figure)
        hold.provider = provider.name
        hold.money = prompt_cost + hold.choices * figure * per_token
        self.money[provider.name] = held + hold.money

    def _lower(self, hold: Hold, figure: int) -> None:
        """The figure lowered after its tokens were held: the key's hold shrinks with it."""
        freed = hold.choices * (hold.figure - figure)
        hold.figure, hold.tokens = figure, hold.tokens - freed
        if freed:
            self.tokens[hold.key.name] = self.tokens.get(hold.key.name, 0) - freed

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
