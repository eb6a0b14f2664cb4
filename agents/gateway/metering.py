"""Metering: every gateway request into SQLite, live per-model figures, provider spend against budgets."""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from agents.runtime.store import Store

WINDOW_S = 60.0  # rates and percentiles over the last minute
SCHEMA = [
    """CREATE TABLE gateway_requests (id INTEGER PRIMARY KEY, t REAL NOT NULL, day TEXT NOT NULL, month TEXT NOT NULL,
       key TEXT, model TEXT NOT NULL, tier TEXT NOT NULL, target TEXT, status INTEGER NOT NULL, stream INTEGER NOT NULL,
       prompt_tokens INTEGER, completion_tokens INTEGER, usage_source TEXT, latency_s REAL, ttft_s REAL, cost REAL,
       cloud_equivalent REAL, woke INTEGER NOT NULL DEFAULT 0, error TEXT)""",
    "CREATE INDEX gateway_requests_by_month ON gateway_requests(month, tier, target)",
    "CREATE TABLE gateway_kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
]


@dataclass
class Record:
    """One request as metered."""

    key: str | None
    model: str  # the lab's name for what was asked (after aliases)
    tier: str  # local | provider | none
    target: str | None  # machine or provider that answered
    status: int
    stream: bool
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    usage_source: str | None = None  # engine | counted
    latency_s: float | None = None
    ttft_s: float | None = None
    cost: float | None = None  # what the lab pays for it (providers: price x tokens; local: 0 beyond the energy ledger)
    cloud_equivalent: float | None = None  # what the providers would have charged
    woke: bool = False
    error: str | None = None
    t: float = field(default_factory=time.time)


@dataclass
class ModelStats:
    done: deque[tuple[float, float | None, float | None, bool]] = field(
        default_factory=deque
    )  # (t, latency_s, ttft_s, error) in the window
    in_flight: int = 0
    queued: int = 0
    wakes: int = 0
    errors: int = 0
    requests: int = 0


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 4)
    return round(statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1], 4)


class Meter:
    """Request log (written in batches off the request path), live figures and spend."""

    def __init__(self, store: Store, timezone: str | None):
        self.store = store
        self.zone = ZoneInfo(timezone) if timezone else None
        store.migrate("gateway_requests", SCHEMA)
        self.models: dict[str, ModelStats] = {}
        self._pending: list[Record] = []
        self.spend_month: dict[str, float] = {}  # provider -> spend this month
        self.spend_day: dict[str, float] = {}
        self._period = ("", "")
        self._load_spend()

    def _now(self) -> datetime:
        return datetime.now(self.zone) if self.zone else datetime.now().astimezone()

    def today(self) -> str:
        return self._now().strftime("%Y-%m-%d")

    def month(self) -> str:
        return self._now().strftime("%Y-%m")

    def _load_spend(self) -> None:
        day, month = self.today(), self.month()
        self._period = (day, month)
        self.spend_month, self.spend_day = {}, {}
        for row in self.store.query(
            "SELECT target, day, SUM(cost) AS cost FROM gateway_requests WHERE month=? AND tier='provider' GROUP BY target, day",
            (month,),
        ):
            self.spend_month[row["target"]] = self.spend_month.get(row["target"], 0.0) + (row["cost"] or 0.0)
            if row["day"] == day:
                self.spend_day[row["target"]] = row["cost"] or 0.0

    def _roll(self) -> None:
        if self._period != (self.today(), self.month()):
            self._load_spend()

    def stats(self, model: str) -> ModelStats:
        stats = self.models.get(model)
        if stats is None:
            stats = self.models[model] = ModelStats()
        return stats

    def record(self, record: Record) -> None:
        """Count a finished request now; its row reaches SQLite at the next flush."""
        self._roll()
        stats = self.stats(record.model)
        stats.requests += 1
        error = record.status >= 400
        stats.errors += error
        stats.done.append((record.t, record.latency_s, record.ttft_s, error))
        if record.tier == "provider" and record.cost and record.target:
            self.spend_month[record.target] = self.spend_month.get(record.target, 0.0) + record.cost
            self.spend_day[record.target] = self.spend_day.get(record.target, 0.0) + record.cost
        self._pending.append(record)

    def flush(self) -> None:
        if not self._pending:
            return
        rows, self._pending = self._pending, []
        with self.store.transaction() as db:
            db.executemany(
                "INSERT INTO gateway_requests (t, day, month, key, model, tier, target, status, stream, prompt_tokens, completion_tokens, "
                "usage_source, latency_s, ttft_s, cost, cloud_equivalent, woke, error) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        r.t,
                        *self._period,
                        r.key,
                        r.model,
                        r.tier,
                        r.target,
                        r.status,
                        int(r.stream),
                        r.prompt_tokens,
                        r.completion_tokens,
                        r.usage_source,
                        r.latency_s,
                        r.ttft_s,
                        r.cost,
                        r.cloud_equivalent,
                        int(r.woke),
                        r.error,
                    )
                    for r in rows
                ],
            )

    def spend_by_day(self, since_day: str) -> dict[str, dict[str, float]]:
        """Provider -> day -> spend, from since_day (the lab's local date) on; requests not yet flushed included."""
        out: dict[str, dict[str, float]] = {}
        for row in self.store.query(
            "SELECT target, day, SUM(cost) AS cost FROM gateway_requests WHERE day>=? AND tier='provider' "
            "AND target IS NOT NULL GROUP BY target, day",
            (since_day,),
        ):
            out.setdefault(row["target"], {})[row["day"]] = row["cost"] or 0.0
        for record in self._pending:
            if record.tier == "provider" and record.cost and record.target and self._period[0] >= since_day:
                days = out.setdefault(record.target, {})
                days[self._period[0]] = days.get(self._period[0], 0.0) + record.cost
        return out

    def key_tokens_today(self, key: str, since: float = 0.0) -> int:
        """The prompt and completion tokens a key's requests used today, from the request log (those since `since`,
        the key's creation: a revoked key's name given again is a new key)."""
        rows = self.store.query(
            "SELECT SUM(COALESCE(prompt_tokens,0) + COALESCE(completion_tokens,0)) AS n FROM gateway_requests "
            "WHERE key=? AND day=? AND t>=?",
            (key, self.today(), since),
        )
        return int(rows[0]["n"] or 0) if rows else 0

    def key_cost(self, key: str, period: str, since: float = 0.0) -> float:
        """What a key's requests cost in a day ("YYYY-MM-DD") or a month ("YYYY-MM"), from the request log (those since
        `since`, as key_tokens_today)."""
        rows = self.store.query(
            "SELECT SUM(cost) AS cost FROM gateway_requests WHERE key=? AND (day=? OR month=?) AND t>=?",
            (key, period, period, since),
        )
        return float(rows[0]["cost"] or 0.0) if rows else 0.0

    def model_figures(self) -> dict[str, dict[str, Any]]:
        """Per model: rps, p50/p95 latency and TTFT over the last minute; in flight, queued, wakes, errors."""
        now = time.time()
        out = {}
        for name, stats in self.models.items():
            while stats.done and now - stats.done[0][0] > WINDOW_S:
                stats.done.popleft()
            latencies = [d[1] for d in stats.done if d[1] is not None and not d[3]]
            ttfts = [d[2] for d in stats.done if d[2] is not None and not d[3]]
            out[name] = {
                "rps": round(len(stats.done) / WINDOW_S, 3),
                "in_flight": stats.in_flight,
                "queued": stats.queued,
                "p50_latency_s": _pct(latencies, 50),
                "p95_latency_s": _pct(latencies, 95),
                "p50_ttft_s": _pct(ttfts, 50),
                "p95_ttft_s": _pct(ttfts, 95),
                "requests": stats.requests,
                "wakes": stats.wakes,
                "errors": stats.errors,
            }
        return out

    def kv_get(self, key: str) -> str | None:
        rows = self.store.query("SELECT value FROM gateway_kv WHERE key=?", (key,))
        return rows[0]["value"] if rows else None

    def kv_set(self, key: str, value: str) -> None:
        with self.store.transaction() as db:
            db.execute("INSERT OR REPLACE INTO gateway_kv VALUES (?, ?)", (key, value))
