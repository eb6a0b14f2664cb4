"""Reservations: before a request goes upstream it holds its worst case (its prompt's upper bound plus every choice at
the full length figure, see agents.gateway.lengths) against its key's tokens per day and its provider's monthly budget,
and one of its key's concurrent slots; it settles at the real count. Concurrent requests therefore cannot together
pass a quota or a budget that each alone fits in, and the figure is lowered to what the key (and the budget) still has
for every choice, or the request is refused. A key's money budget (per day or month) is held the same way, against
the prices of the provider model that answers; a key that has spent it is refused with OpenAI's insufficient_quota."""

from __future__ import annotations

import math
from dataclasses import dataclass

from agents.gateway.keys import ApiKey, KeyStore
from agents.gateway.lengths import Lengths
from agents.gateway.metering import Meter
from agents.gateway.target import NotServable, Target
from agents.wire.lab.gateway import GatewayPolicies
from agents.wire.words import plural


@dataclass
class Hold:
    """What one request holds until it settles."""

    key: ApiKey
    tokens: int  # against the key's tokens per day: the prompt's bound + choices x figure
    figure: int  # the length of each choice, as sent upstream
    choices: int = 1
    provider: str | None = None
    money: float = 0.0  # against the provider's monthly budget
    key_money: float = 0.0  # against the key's money budget


class Reservations:
    """The holds in flight, per key and per provider."""

    def __init__(self, keys: KeyStore, meter: Meter, policies: GatewayPolicies):
        self.keys, self.meter, self.policies = keys, meter, policies
        self.tokens: dict[str, int] = {}  # key name -> tokens held
        self.money: dict[str, float] = {}  # provider -> money held
        self.key_money: dict[str, float] = {}  # key name -> money held
        self.in_flight: dict[str, int] = {}  # key name -> requests being answered

    def enter(self, key: ApiKey) -> None:
        """One of the key's concurrent slots (gateway.policies.key_concurrency); 429 when all are taken."""
        if self.in_flight.get(key.name, 0) >= self.policies.key_concurrency:
            raise NotServable(
                429,
                f"key {key.name} has {plural(self.policies.key_concurrency, 'request')} in flight "
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
        budget = self.keys.limits(key).budget
        if budget is not None and self.keys.money_spent(key) + self.key_money.get(key.name, 0.0) >= budget.amount:
            raise self._over_budget(key)
        hold = Hold(key=key, tokens=0, figure=lengths.figure, choices=lengths.choices)
        if key.tokens_per_day is not None:
            used = self.keys.tokens_today(key) + self.tokens.get(key.name, 0)
            room = (key.tokens_per_day - used - prompt_tokens) // hold.choices
            if room < min(1, hold.figure):  # a pooling request (figure 0) generates nothing: its prompt must fit
                raise NotServable(
                    429,
                    f"key {key.name}: its {plural(key.tokens_per_day, 'token')} per day are used or held by requests in flight",
                    "quota_exceeded",
                    60,
                )
            hold.figure = min(hold.figure, room)
        hold.tokens = prompt_tokens + hold.choices * hold.figure
        self.tokens[key.name] = self.tokens.get(key.name, 0) + hold.tokens
        return hold

    def reserve_money(self, hold: Hold, target: Target, prompt_tokens: int) -> None:
        """Hold the worst cost against a provider's monthly budget and the key's money budget; the figure lowered to
        what both still afford for every choice, or 429."""
        provider, model = target.provider, target.provider_model
        if provider is None or model is None:
            return
        key = hold.key
        budget = self.keys.limits(key).budget
        prompt_cost = prompt_tokens * model.prompt_per_million / 1e6
        per_token = model.completion_per_million / 1e6
        figure = hold.figure
        rooms: list[tuple[float, NotServable]] = []
        if provider.monthly_budget is not None:
            headroom = (
                provider.monthly_budget - self.meter.spend_month.get(provider.name, 0.0) - self.money.get(provider.name, 0.0)
            )
            refusal = NotServable(
                429,
                f"{provider.name} has spent or holds for requests in flight its monthly budget "
                f"({provider.monthly_budget}); gateway.policies.budget_exceeded is {self.policies.budget_exceeded}",
                "budget_exceeded",
                self.policies.retry_after_s,
            )
            rooms.append((headroom, refusal))
        if budget is not None:
            rooms.append((budget.amount - self.keys.money_spent(key) - self.key_money.get(key.name, 0.0), self._over_budget(key)))
        for headroom, refusal in rooms:
            if per_token > 0:
                figure = min(figure, math.floor((headroom - prompt_cost) / (per_token * hold.choices)))
            if figure < min(1, hold.figure) or headroom - prompt_cost <= 0:
                raise refusal
        if not rooms:
            return
        self._lower(hold, figure)
        cost = prompt_cost + hold.choices * figure * per_token
        if provider.monthly_budget is not None:
            hold.provider, hold.money = provider.name, cost
            self.money[provider.name] = self.money.get(provider.name, 0.0) + cost
        if budget is not None:
            hold.key_money = cost
            self.key_money[key.name] = self.key_money.get(key.name, 0.0) + cost

    def _over_budget(self, key: ApiKey) -> NotServable:
        """OpenAI's answer to an account out of credit: 429, type and code insufficient_quota."""
        budget = self.keys.limits(key).budget
        assert budget is not None
        return NotServable(
            429,
            f"You exceeded your current quota: key {key.name} has spent or holds for requests in flight its budget of "
            f"{self.keys.budget_text(budget)} ({self.keys.money_spent(key):.4f} spent); "
            f"`cetlab gateway keys list` shows its use",
            "insufficient_quota",
        )

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
        if hold.key_money:
            money = self.key_money.get(hold.key.name, 0.0) - hold.key_money
            if money > 1e-12:
                self.key_money[hold.key.name] = money
            else:
                self.key_money.pop(hold.key.name, None)
        hold.tokens, hold.money, hold.provider, hold.key_money = 0, 0.0, None, 0.0

    def held_money(self, provider: str) -> float:
        return self.money.get(provider, 0.0)
