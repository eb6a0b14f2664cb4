"""The energy and money ledger: measured watts integrated into kWh, attributed to jobs and models, priced."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, tzinfo
from typing import TYPE_CHECKING, Any

from agents.costs.port import LedgerTotal
from agents.gateway.port import GatewayPort
from agents.runtime.hooks import Hooks
from agents.runtime.store import DiskFull, Store
from agents.wire.catalogue.costs import COSTS_GET, CostsParams, CostsReport
from agents.wire.lab.gateway import find_provider_model
from agents.wire.lab.machines import Machine
from agents.wire.lab.model import Lab
from agents.wire.protocol import Telemetry
from agents.wire.sections.costs import CostsSummary, ProviderSpend
from agents.wire.sections.jobs import JobInfo
from agents.wire.sections.models import ModelInfo
from agents.wire.sections.tick import Tick
from agents.wire.states import JOB_HOLDS_GPU, MODEL_HOLDS_GPU

if TYPE_CHECKING:
    from agents.runtime.core import AgentCore
    from agents.runtime.rpc import Peer

log = logging.getLogger("cetlab.costs")

BUSY_UTIL_PCT = 10.0  # a GPU above this utilisation is busy: its time counts for the cloud equivalent
MAX_GAP_INTERVALS = 3  # a gap between samples longer than this many intervals adds nothing
JOULES_PER_KWH = 3.6e6
COLUMNS = ("energy_j", "up_s", "held_s", "busy_s", "rent_s", "tokens")

SCHEMA = [
    """CREATE TABLE cost_ledger (
        day TEXT NOT NULL,           -- the lab's local date of the interval's end, YYYY-MM-DD
        kind TEXT NOT NULL,          -- host | job | model | other (a GPU nobody of ours holds)
        owner TEXT NOT NULL,         -- job id, model name, gpu<index>, or 'host'
        gpu_name TEXT NOT NULL,      -- GPU model name; '' for the host and for token counts
        label TEXT NOT NULL DEFAULT '',
        energy_j REAL NOT NULL DEFAULT 0,
        up_s REAL NOT NULL DEFAULT 0,    -- machine uptime (host rows)
        held_s REAL NOT NULL DEFAULT 0,  -- GPU-seconds held by the owner
        busy_s REAL NOT NULL DEFAULT 0,  -- GPU-seconds above BUSY_UTIL_PCT
        rent_s REAL NOT NULL DEFAULT 0,  -- seconds of the machine's hourly rate charged here
        tokens REAL NOT NULL DEFAULT 0,  -- tokens served (model rows)
        PRIMARY KEY (day, kind, owner, gpu_name))""",
    "CREATE TABLE cost_token_marks (model TEXT PRIMARY KEY, count REAL NOT NULL)",
]


@dataclass(frozen=True)
class Reading:
    """One power draw at one sample, and who it belongs to: a GPU's or the host's idle draw."""

    kind: str
    owner: str
    gpu_name: str = ""
    power_w: float | None = None
    busy: bool = False
    label: str = ""
    rent_share: float = 0.0  # the fraction of the machine's hourly rate this reading carries


def local_day(t: float, tz: tzinfo | None) -> str:
    return datetime.fromtimestamp(t, tz).date().isoformat()


class Ledger:
    """Integrates readings over time (trapezoid) into daily rows in SQLite, one transaction per sample."""

    def __init__(self, store: Store, interval_s: float, tz: tzinfo | None = None):
        self.store = store
        self.max_gap_s = MAX_GAP_INTERVALS * interval_s
        self.tz = tz
        store.migrate("costs", SCHEMA)
        self._prev: tuple[float, dict[str, Reading]] | None = None
        self._marks = {r["model"]: r["count"] for r in store.query("SELECT model, count FROM cost_token_marks")}

    def add(
        self, t: float, readings: dict[str, Reading], token_counts: dict[str, float] | None = None
    ) -> dict[tuple[str, str, str, str], list[float]]:
        """Account the interval since the previous sample; returns the increments written."""
        rows: dict[tuple[str, str, str, str], list[float]] = defaultdict(lambda: [0.0] * len(COLUMNS))
        labels: dict[tuple[str, str, str, str], str] = {}
        day = local_day(t, self.tz)
        prev, self._prev = self._prev, (t, readings)
        if prev is not None and 0 < t - prev[0] <= self.max_gap_s:
            half_s = (t - prev[0]) / 2
            # Trapezoid, split at the middle: each end's half goes to whoever held the slot then.
            for slot, now in readings.items():
                before = prev[1].get(slot)
                if before is None:  # a slot that just appeared starts counting at its next sample
                    continue
                for reading in (before, now):
                    key = (day, reading.kind, reading.owner, reading.gpu_name)
                    labels[key] = reading.label
                    row = rows[key]
                    row[0] += (reading.power_w or 0.0) * half_s
                    if reading.kind == "host":
                        row[1] += half_s
                    else:
                        row[2] += half_s
                        row[3] += half_s if reading.busy else 0.0
                    row[4] += half_s * reading.rent_share
        marks = {}
        for model, count in (token_counts or {}).items():
            last = self._marks.get(model)
            if last is not None and count != last:
                # a counter that went down was reset (engine restarted): it counted from zero
                rows[(day, "model", model, "")][5] += count - last if count > last else count
            if count != last:
                marks[model] = count
        self._marks.update(marks)
        if rows or marks:
            with self.store.transaction() as db:
                for key, values in rows.items():
                    db.execute(
                        f"INSERT INTO cost_ledger (day, kind, owner, gpu_name, label, {', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                        " ON CONFLICT(day, kind, owner, gpu_name) DO UPDATE SET label=excluded.label, "
                        + ", ".join(f"{c}={c}+excluded.{c}" for c in COLUMNS),
                        (*key, labels.get(key, ""), *values),
                    )
                db.executemany("INSERT OR REPLACE INTO cost_token_marks VALUES (?, ?)", list(marks.items()))
        return dict(rows)

    def totals(self) -> list[dict[str, Any]]:
        """Energy (J) and tokens served by kind and owner, over the whole ledger."""
        return self.store.query(
            "SELECT kind, owner, SUM(energy_j) AS energy_j, SUM(tokens) AS tokens FROM cost_ledger GROUP BY kind, owner"
        )

    def rows(self, since_day: str | None = None) -> list[dict[str, Any]]:
        if since_day is None:
            return self.store.query("SELECT * FROM cost_ledger")
        return self.store.query("SELECT * FROM cost_ledger WHERE day >= ?", (since_day,))


# ---------------------------------------------------------------------------- prices


@dataclass
class Prices:
    currency: str
    electricity_per_kwh: float | None
    hourly_rate: float
    gpu_hour: dict[str, float]
    token_price: dict[str, float] = field(default_factory=dict)  # by our model name, per million tokens

    @classmethod
    def of(cls, lab: Lab, machine: Machine) -> Prices:
        """The prices that apply to this machine. Local tokens are compared at what the lab's own providers charge
        for the same model (lab.yaml `providers:`), else at `cloud_prices.tokens_per_million`. The ledger counts
        prompt and generated tokens together, so a provider's price is the mean of its prompt and completion prices."""
        token_price = {}
        for model in lab.models:
            name = model.cloud_equivalent or model.name  # a model without cloud_equivalent is compared under its own name
            sold = find_provider_model(lab.providers, name)
            price = (
                (sold[1].prompt_per_million + sold[1].completion_per_million) / 2
                if sold
                else lab.cloud_prices.tokens_per_million.get(name)
            )
            if price is not None:
                token_price[model.name] = price
        return cls(
            lab.costs.currency, lab.costs.electricity_per_kwh, machine.hourly_rate, dict(lab.cloud_prices.gpu_hour), token_price
        )

    @property
    def rented(self) -> bool:
        return self.hourly_rate > 0


def _r(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def price(rows: list[dict[str, Any]], prices: Prices) -> dict[str, Any]:
    """Money for ledger rows: what they cost here, what the same work would cost in the cloud."""
    missing: list[str] = []
    kwh = sum(r["energy_j"] for r in rows) / JOULES_PER_KWH
    rent = sum(r["rent_s"] for r in rows) / 3600 * prices.hourly_rate
    if prices.rented:  # the rate of a rented machine includes its power
        energy_cost: float | None = 0.0
    elif prices.electricity_per_kwh is None:
        energy_cost = None if kwh > 0 else 0.0
        if kwh > 0:
            missing.append("missing: costs.electricity_per_kwh")
    else:
        energy_cost = kwh * prices.electricity_per_kwh
    cost = None if energy_cost is None else energy_cost + rent
    tokens = sum(r["tokens"] for r in rows)
    cloud_tokens = sum(
        r["tokens"] / 1e6 * prices.token_price[r["owner"]]
        for r in rows
        if r["kind"] == "model" and r["owner"] in prices.token_price
    )
    cloud_gpu: float | None = 0.0
    for r in rows:
        if r["kind"] not in ("job", "model"):
            continue  # only the lab's own work would move to the cloud: not a GPU's background load (another user's, a SIM's)
        if not r["busy_s"] or (r["kind"] == "model" and r["owner"] in prices.token_price):
            continue  # idle, or work a per-token price already compares
        rate = prices.gpu_hour.get(r["gpu_name"])
        if rate is None:
            problem = f"no cloud price for GPU {r['gpu_name']!r}"
            if problem not in missing:
                missing.append(problem)
            cloud_gpu = None
        elif cloud_gpu is not None:
            cloud_gpu += r["busy_s"] / 3600 * rate
    cloud = None if cloud_gpu is None else cloud_gpu + cloud_tokens
    saving = None if cloud is None or cost is None else cloud - cost
    return {
        "kwh": _r(kwh),
        "energy_cost": _r(energy_cost),
        "rent": _r(rent),
        "cost": _r(cost),
        "uptime_s": _r(sum(r["up_s"] for r in rows), 1),
        "gpu_hours": _r(sum(r["held_s"] for r in rows if r["kind"] != "host") / 3600),
        "gpu_busy_hours": _r(sum(r["busy_s"] for r in rows) / 3600),
        "tokens": int(tokens),
        "cloud_gpu": _r(cloud_gpu),
        "cloud_tokens": _r(cloud_tokens),
        "cloud_equivalent": _r(cloud),
        "saving": _r(saving),
        "saving_pct": _r(saving / cloud * 100, 2) if saving is not None and cloud else None,
        "missing": missing,
    }


# ---------------------------------------------------------------------------- attribution


def gpu_holders(jobs: list[JobInfo], models: list[ModelInfo]) -> dict[int, tuple[str, str, str]]:
    """GPU index -> (kind, owner, label) from the jobs and models sections."""
    holders: dict[int, tuple[str, str, str]] = {}
    for model in models:
        if model.state in MODEL_HOLDS_GPU:
            for index in model.gpus:
                holders[index] = ("model", model.name, model.name)
    for job in jobs:  # a job and a model on one GPU: the job is what the GPU works for
        if job.state in JOB_HOLDS_GPU:
            for index in job.gpus:
                holders[index] = ("job", job.id, job.recipe)
    return holders


def token_counts(models: list[ModelInfo]) -> dict[str, float]:
    """Tokens served so far by each model's engine (a counter that restarts with the engine)."""
    return {model.name: count for model in models if (count := model.tokens_total) is not None}


def readings(telemetry: Telemetry, machine: Machine, holders: dict[int, tuple[str, str, str]]) -> dict[str, Reading]:
    """This sample's power draws: the host's idle watts and each GPU's measured power, with owners."""
    gpus = [g for g in telemetry.gpus if not g.failed]
    out = {"host": Reading("host", "host", power_w=machine.idle_watts, rent_share=0.0 if gpus else 1.0, label=machine.name)}
    for gpu in gpus:
        kind, owner, label = holders.get(gpu.index, ("other", f"gpu{gpu.index}", ""))
        out[f"gpu{gpu.index}"] = Reading(
            kind,
            owner,
            gpu.name,
            power_w=gpu.power_w,
            busy=(gpu.util_pct or 0.0) > BUSY_UTIL_PCT,
            label=label,
            rent_share=1.0 / len(gpus),
        )
    return out


# ---------------------------------------------------------------------------- the component


def group_by(rows: list[dict[str, Any]], by: str, prices: Prices, machine: str) -> list[dict[str, Any]]:
    if by == "machine":
        return [{"machine": machine, **price(rows, prices)}]
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["kind"] == by:
            groups[row["owner"]].append(row)
    out = []
    for owner, group in sorted(groups.items()):
        label = next((r["label"] for r in group if r["label"]), "")
        out.append({by: owner, "label": label, "machine": machine, **price(group, prices)})
    return out


class CostsComponent(Hooks):
    """Component "costs": the ledger on every tick, `costs.get`, and a summary section for the header."""

    reads_tick = True

    name = "costs"

    def __init__(self, core: AgentCore) -> None:
        self.core = core
        self.tz = core.lab.costs.zone()
        self.prices = Prices.of(core.lab, core.machine)
        self._ledger: Ledger | None = None
        self._summary: CostsSummary | None = None
        self.now: dict[str, Any] = {}
        self._unbooked = False  # the last tick could not be booked (a full disk)

        @core.rpc.implements(COSTS_GET)
        async def get(peer: Peer, params: CostsParams) -> CostsReport:
            return CostsReport.model_validate(self.report(params.since, params.by))

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            raise RuntimeError("the costs ledger opens at start()")
        return self._ledger

    async def reconfigure(self, old: Lab, new: Lab) -> None:
        """A pushed lab.yaml: prices, currency and the lab's time zone count from the next tick on (booked days stay)."""
        self.tz = new.costs.zone()
        self.prices = Prices.of(new, new.machine(self.core.machine.name))
        if self._ledger is not None:
            self._ledger.tz = self.tz

    async def start(self) -> None:
        self._ledger = Ledger(self.core.store, self.core.interval_s, self.tz)

    def ledger_totals(self) -> list[LedgerTotal]:  # CostsPort
        return [LedgerTotal.model_validate(row) for row in self.ledger.totals()]

    async def stop(self) -> None:
        pass

    def on_tick(self, tick: Tick) -> None:
        """Book this tick: the GPUs' owners are the jobs and models of the same tick."""
        telemetry = tick.telemetry
        models = tick.model_list()
        holders = gpu_holders(tick.jobs, models)
        try:
            self.ledger.add(telemetry.t, readings(telemetry, self.core.machine, holders), token_counts(models))
        except DiskFull as exc:  # the disk alert says it on consoles; the log says it once per episode, not every tick
            if not self._unbooked:
                log.error("the ledger cannot book: %s", exc)
            self._unbooked = True
        else:
            self._unbooked = False
        self.now = self.rate_now(telemetry)
        today, month = self._windows(telemetry.t)
        self._summary = CostsSummary(
            currency=self.prices.currency,
            power_w=self.now["power_w"],
            now_per_hour=self.now["per_hour"],
            today=today["cost"],
            month=month["cost"],
            cloud_equivalent_month=month["cloud_equivalent"],
            missing=sorted(set(self.now["missing"] + today["missing"] + month["missing"])),
            simulated=telemetry.simulated,
            api=self._provider_spend(),
        )

    def _provider_spend(self) -> list[ProviderSpend]:
        gateway = self.core.find(GatewayPort)
        return gateway.provider_spend() if gateway is not None else []

    def api_report(self, today: str, month_start: str, since_day: str) -> dict[str, Any] | None:
        """API spend per provider (today, this month, since a day) against its budget: on the gateway's machine only."""
        gateway = self.core.find(GatewayPort)
        spend = gateway.provider_spend() if gateway is not None else []
        if gateway is None or not spend:
            return None
        by_day = gateway.spend_by_day(min(since_day, month_start))
        providers: list[dict[str, Any]] = []
        for p in spend:
            days = by_day.get(p.name, {})
            providers.append(
                {
                    "provider": p.name,
                    "simulated": p.simulated,
                    "monthly_budget": p.monthly_budget,
                    "today": _r(days.get(today, 0.0), 8),  # API spend comes in fractions of a cent
                    "month": _r(sum(v for d, v in days.items() if d >= month_start), 8),
                    "since": _r(sum(v for d, v in days.items() if d >= since_day), 8),
                    "budget_pct": _r(sum(v for d, v in days.items() if d >= month_start) / p.monthly_budget * 100, 2)
                    if p.monthly_budget
                    else None,
                }
            )
        return {
            "providers": providers,
            **{period: _r(sum(p[period] for p in providers), 8) for period in ("today", "month", "since")},
            "days": {
                day: _r(sum(days.get(day, 0.0) for days in by_day.values()), 8)
                for day in sorted({d for v in by_day.values() for d in v})
            },
        }

    def section(self) -> CostsSummary | None:
        return self._summary

    def rate_now(self, telemetry: Telemetry) -> dict[str, Any]:
        """What the machine costs per hour at this sample's power draw."""
        power_w = self.core.machine.idle_watts + sum(g.power_w or 0.0 for g in telemetry.gpus if not g.failed)
        missing = []
        if self.prices.rented:
            per_hour: float | None = self.prices.hourly_rate
        elif self.prices.electricity_per_kwh is None:
            per_hour = None
            missing.append("missing: costs.electricity_per_kwh")
        else:
            per_hour = power_w / 1000 * self.prices.electricity_per_kwh
        return {"power_w": round(power_w, 1), "per_hour": _r(per_hour), "missing": missing}

    def _windows(self, t: float) -> tuple[dict[str, Any], dict[str, Any]]:
        today = local_day(t, self.tz)
        rows = self.ledger.rows(today[:8] + "01")
        return price([r for r in rows if r["day"] == today], self.prices), price(rows, self.prices)

    def report(self, since: date | None, by: str) -> dict[str, Any]:
        t = time.time()
        today = local_day(t, self.tz)
        month_start = today[:8] + "01"
        since_day = since.isoformat() if since else month_start
        rows = self.ledger.rows(min(since_day, month_start))
        window = [r for r in rows if r["day"] >= since_day]
        days = defaultdict(list)
        for row in rows:
            days[row["day"]].append(row)
        latest = self.core.latest
        return {
            "machine": self.core.machine.name,
            "currency": self.prices.currency,
            "timezone": self.core.lab.costs.timezone or "local",
            "rented": self.prices.rented,
            "simulated": bool(latest and latest.simulated),
            "now": self.rate_now(latest) if latest else {"power_w": None, "per_hour": None, "missing": []},
            "today": price([r for r in rows if r["day"] == today], self.prices),
            "month": price([r for r in rows if r["day"] >= month_start], self.prices),
            "since": {"day": since_day, **price(window, self.prices)},
            "by": group_by(window, by, self.prices, self.core.machine.name),
            "days": [{"day": day, **price(group, self.prices)} for day, group in sorted(days.items()) if day >= since_day],
            "api": self.api_report(today, month_start, since_day),
        }
