"""Gateway API keys: issued once, stored hashed in the agent's SQLite, with optional quotas."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from agents.runtime.store import Store
from agents.wire.catalogue.gateway import KeyAddParams, KeyRecord
from agents.wire.protocol import ErrorCode, RemoteError

TOKEN_PREFIX = "cetlab-gw-"
SCHEMA = [
    """CREATE TABLE gateway_keys (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, sha256 TEXT NOT NULL UNIQUE,
       created_at REAL NOT NULL, revoked_at REAL, rpm INTEGER, tokens_per_day INTEGER)""",
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
    recent: deque[float] = field(default_factory=deque)  # monotonic times of the last minute's requests
    requests: int = 0  # since the agent started
    tokens_day: int = 0  # tokens used on day `day`
    day: str = ""
    last_used: float | None = None


class QuotaExceeded(Exception):
    """The key has used its requests per minute or tokens per day; the message says which."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class KeyStore:
    """The keys, cached in memory by hash (the hot path never touches SQLite)."""

    def __init__(self, store: Store, today: Callable[[], str]):
        self.store = store
        self.today = today  # -> "YYYY-MM-DD" in the lab's time zone
        store.migrate("gateway_keys", SCHEMA)
        self._by_hash: dict[str, ApiKey] = {}
        for row in store.query("SELECT name, sha256, rpm, tokens_per_day, revoked_at FROM gateway_keys"):
            self._by_hash[row["sha256"]] = ApiKey(
                row["name"], row["sha256"], row["rpm"], row["tokens_per_day"], row["revoked_at"]
            )

    def add(self, params: KeyAddParams) -> str:
        """A new key; the token is returned once and only its hash is kept."""
        if any(k.name == params.name for k in self._by_hash.values()):
            raise RemoteError(ErrorCode.CONFLICT, f"a gateway key named {params.name!r} exists; revoke it or pick another name")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        key = ApiKey(params.name, digest(token), params.rpm, params.tokens_per_day)
        with self.store.transaction() as db:
            db.execute(
                "INSERT INTO gateway_keys (name, sha256, created_at, rpm, tokens_per_day) VALUES (?,?,?,?,?)",
                (key.name, key.sha256, time.time(), key.rpm, key.tokens_per_day),
            )
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
            raise QuotaExceeded(f"key {key.name}: {key.rpm} requests per minute used", max(1, int(61 - (now - key.recent[0]))))
        if key.tokens_per_day is not None and self._tokens_today(key) >= key.tokens_per_day:
            raise QuotaExceeded(f"key {key.name}: {key.tokens_per_day} tokens per day used", 3600)
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

    def seed_usage(self, tokens_by_key: dict[str, int]) -> None:
        """Tokens already used today (from the request log), so a restart does not reset a quota."""
        today = self.today()
        for key in self._by_hash.values():
            key.day, key.tokens_day = today, tokens_by_key.get(key.name, 0)

    def listing(self) -> list[KeyRecord]:
        rows = self.store.query("SELECT name, created_at, revoked_at, rpm, tokens_per_day FROM gateway_keys ORDER BY name")
        live = {k.name: k for k in self._by_hash.values()}
        for row in rows:
            key = live[row["name"]]
            row.update(
                requests=key.requests,
                tokens_today=self._tokens_today(key),
                last_used=key.last_used,
                requests_last_minute=len(key.recent),
            )
        return [KeyRecord.model_validate(row) for row in rows]
