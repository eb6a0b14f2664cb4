"""Gateway API keys: issued once, stored hashed in the agent's SQLite, with optional quotas and limits (the models it
may use, an expiry, a money budget per day or month: agents.wire.lab.gateway.KeyLimits; lab.yaml's `gateway.keys`
entry for a key's name wins over what `keys add` gave it)."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, tzinfo

from agents.runtime.store import Store
from agents.wire.catalogue.gateway import KeyAddParams, KeyRecord
from agents.wire.lab.gateway import KeyBudget, KeyLimits
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.words import plural

TOKEN_PREFIX = "cetlab-gw-"
SCHEMA = [
    """CREATE TABLE gateway_keys (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, sha256 TEXT NOT NULL UNIQUE,
       created_at REAL NOT NULL, revoked_at REAL, rpm INTEGER, tokens_per_day INTEGER)""",
    "ALTER TABLE gateway_keys ADD COLUMN limits TEXT",  # KeyLimits as JSON (models, expires, budget)
]


def digest(token: str) -> str:
    """sha256 of a token: the tokens are 256 random bits, so a plain hash is enough (no stretching needed)."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(eq=False)
class ApiKey:
    name: str
    sha256: str
    rpm: int | None
    tokens_per_day: int | None
    revoked_at: float | None = None
    created_at: float = 0.0  # its use counts from here: a name revoked and added again is a new key, from zero
    recent: deque[float] = field(default_factory=deque)  # monotonic times of the last minute's requests
    requests: int = 0  # since the agent started
    tokens_day: int = 0  # tokens used on day `day`
    day: str = ""
    last_used: float | None = None
    limits: KeyLimits = field(default_factory=KeyLimits)  # as given at `keys add`; lab.yaml's entry wins (KeyStore.limits)
    money_period: str = ""  # the day or month money_spent counts
    money_spent: float = 0.0  # what its settled requests cost in that period


class QuotaExceeded(Exception):
    """The key has used its requests per minute or tokens per day; the message says which."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class KeyStore:
    """The keys, cached in memory by hash (the hot path never touches SQLite)."""

    def __init__(
        self,
        store: Store,
        today: Callable[[], str],
        month: Callable[[], str] = lambda: time.strftime("%Y-%m"),
        zone: tzinfo | None = None,
        configured: dict[str, KeyLimits] | None = None,
        currency: str = "USD",
    ):
        self.store = store
        self.today = today  # -> "YYYY-MM-DD" in the lab's time zone
        self.month = month  # -> "YYYY-MM"
        self.zone = zone  # the lab's time zone: an expiry date starts there (None: the machine's)
        self.configured = configured or {}  # lab.yaml's gateway.keys
        self.currency = currency
        store.migrate("gateway_keys", SCHEMA)
        self._by_hash: dict[str, ApiKey] = {}
        for row in store.query("SELECT name, sha256, rpm, tokens_per_day, revoked_at, created_at, limits FROM gateway_keys"):
            key = ApiKey(row["name"], row["sha256"], row["rpm"], row["tokens_per_day"], row["revoked_at"], row["created_at"])
            if row["limits"]:
                key.limits = KeyLimits.model_validate(json.loads(row["limits"]))
            self._by_hash[row["sha256"]] = key

    def limits(self, key: ApiKey) -> KeyLimits:
        """The key's limits: lab.yaml's entry for its name, else what it was given when added."""
        return self.configured.get(key.name, key.limits)

    def expires_at(self, key: ApiKey) -> float | None:
        """The key's end as a Unix time: a date ends it at that day's start in the lab's time zone."""
        expires = self.limits(key).expires
        if expires is None:
            return None
        if not isinstance(expires, datetime):
            expires = datetime(expires.year, expires.month, expires.day)
        return (
            expires if expires.tzinfo else expires.replace(tzinfo=self.zone) if self.zone else expires.astimezone()
        ).timestamp()

    def expired(self, key: ApiKey) -> bool:
        end = self.expires_at(key)
        return end is not None and time.time() >= end

    def budget_text(self, budget: KeyBudget | None) -> str | None:
        return None if budget is None else f"{budget.amount:g} {self.currency}/{budget.period}"

    def budget_amount(self, name: str) -> float | None:
        key = next((k for k in self._by_hash.values() if k.name == name), None)
        budget = None if key is None else self.limits(key).budget
        return None if budget is None else budget.amount

    def budget_problem(self, budget: KeyBudget | None) -> str | None:
        if budget is not None and budget.currency is not None and budget.currency != self.currency.upper():
            return f"the budget is in {budget.currency}; this lab counts money in {self.currency} (costs.currency)"
        return None

    def add(self, params: KeyAddParams) -> str:
        """A new key; the token is returned once and only its hash is kept. A revoked key's name can be given again:
        the new key replaces it and starts from zero (its requests, tokens and spend count from now)."""
        old = next((k for k in self._by_hash.values() if k.name == params.name), None)
        if old is not None and old.revoked_at is None:
            raise RemoteError(ErrorCode.CONFLICT, f"a gateway key named {params.name!r} exists; revoke it or pick another name")
        problem = self.budget_problem(params.budget)
        if problem is not None:
            raise RemoteError(ErrorCode.INVALID_PARAMS, f"budget: {problem}")
        limits = KeyLimits(models=params.models, expires=params.expires, budget=params.budget)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        key = ApiKey(params.name, digest(token), params.rpm, params.tokens_per_day, created_at=time.time(), limits=limits)
        if self.expired(key):
            raise RemoteError(ErrorCode.INVALID_PARAMS, f"expires: {params.expires} has passed; a key must expire in the future")
        with self.store.transaction() as db:
            db.execute("DELETE FROM gateway_keys WHERE name=? AND revoked_at IS NOT NULL", (key.name,))
            db.execute(
                "INSERT INTO gateway_keys (name, sha256, created_at, rpm, tokens_per_day, limits) VALUES (?,?,?,?,?,?)",
                (
                    key.name,
                    key.sha256,
                    key.created_at,
                    key.rpm,
                    key.tokens_per_day,
                    limits.model_dump_json(exclude_defaults=True),
                ),
            )
        if old is not None:
            del self._by_hash[old.sha256]  # its token stays refused: no key has its hash now
        self._by_hash[key.sha256] = key
        return token

    def revoke(self, name: str) -> None:
        key = next((k for k in self._by_hash.values() if k.name == name), None)
        if key is None:
            raise RemoteError(ErrorCode.NOT_FOUND, f"no gateway key named {name!r}")
        key.revoked_at = key.revoked_at or time.time()
        with self.store.transaction() as db:
            db.execute("UPDATE gateway_keys SET revoked_at=? WHERE name=?", (key.revoked_at, name))

    def lookup(self, token: str) -> ApiKey | None:
        """The live key for a bearer token, or None (unknown or revoked)."""
        key = self._by_hash.get(digest(token))
        if key is None or key.revoked_at is not None or not hmac.compare_digest(key.sha256, digest(token)):
            return None
        return key

    def admit(self, key: ApiKey) -> None:
        """Count one request against the key's quotas; raises QuotaExceeded."""
        now = time.monotonic()
        while key.recent and now - key.recent[0] >= 60.0:
            key.recent.popleft()
        if key.rpm is not None and len(key.recent) >= key.rpm:
            raise QuotaExceeded(
                f"key {key.name}: {plural(key.rpm, 'request')} per minute used", max(1, int(61 - (now - key.recent[0])))
            )
        if key.tokens_per_day is not None and self._tokens_today(key) >= key.tokens_per_day:
            raise QuotaExceeded(f"key {key.name}: {plural(key.tokens_per_day, 'token')} per day used", 3600)
        key.recent.append(now)
        key.requests += 1
        key.last_used = time.time()

    def charge(self, key: ApiKey, tokens: int) -> None:
        self._tokens_today(key)
        key.tokens_day += tokens

    def tokens_today(self, key: ApiKey) -> int:
        """Tokens the key was charged today (requests in flight not included)."""
        return self._tokens_today(key)

    def _tokens_today(self, key: ApiKey) -> int:
        today = self.today()
        if key.day != today:
            key.day, key.tokens_day = today, 0
        return key.tokens_day

    def money_spent(self, key: ApiKey) -> float:
        """What the key's settled requests cost in its budget's period (today or this month)."""
        budget = self.limits(key).budget
        period = self.month() if budget is not None and budget.period == "month" else self.today()
        if key.money_period != period:
            key.money_period, key.money_spent = period, 0.0
        return key.money_spent

    def spend(self, key: ApiKey, cost: float) -> None:
        self.money_spent(key)
        key.money_spent += cost

    def seed_money(self, spent: Callable[[str, str, float], float]) -> None:
        """What each key's requests already cost in its budget's period since it was added (from the request log:
        survives a restart; an earlier key of the same name is not this one)."""
        for key in self._by_hash.values():
            budget = self.limits(key).budget
            if budget is not None:
                period = self.month() if budget.period == "month" else self.today()
                key.money_period, key.money_spent = period, spent(key.name, period, key.created_at)

    def seed_usage(self, tokens_today: Callable[[str, float], int]) -> None:
        """Tokens already used today since the key was added (from the request log), so a restart does not reset a
        quota, nor hand a re-added name its predecessor's use."""
        today = self.today()
        for key in self._by_hash.values():
            key.day, key.tokens_day = today, tokens_today(key.name, key.created_at)

    def listing(self) -> list[KeyRecord]:
        rows = self.store.query("SELECT name, created_at, revoked_at, rpm, tokens_per_day FROM gateway_keys ORDER BY name")
        live = {k.name: k for k in self._by_hash.values()}
        for row in rows:
            key = live[row["name"]]
            limits = self.limits(key)
            row.update(
                requests=key.requests,
                tokens_today=self._tokens_today(key),
                last_used=key.last_used,
                requests_last_minute=len(key.recent),
                models=list(limits.models),
                expires=None if limits.expires is None else limits.expires.isoformat(),
                expired=self.expired(key),
                budget=self.budget_text(limits.budget),
                spent=round(self.money_spent(key), 8),
            )
        return [KeyRecord.model_validate(row) for row in rows]
