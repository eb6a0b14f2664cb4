"""The method catalogue: every RPC method with its params model, its result model, its role and its doc: costs."""

from __future__ import annotations

from datetime import date
from typing import Literal

from pydantic import Field

from agents.wire.catalogue.method import Method, Params
from agents.wire.protocol import (
    Finite,
)
from agents.wire.schema import Day
from agents.wire.sections.base import Section


class CostsParams(Params):
    since: date | None = None  # the lab's local date, YYYY-MM-DD; default: this month
    by: Literal["machine", "job", "model"] = "machine"


class CostsNow(Section):
    power_w: Finite = None
    per_hour: Finite = None
    missing: list[str] = Field(default_factory=list)


class Priced(Section):
    """Money for a span of the ledger: what it cost here, what the same work would cost in the cloud."""

    kwh: Finite = None
    energy_cost: Finite = None  # null: no electricity price in lab.yaml
    rent: Finite = None
    cost: Finite = None
    uptime_s: Finite = None
    gpu_hours: Finite = None
    gpu_busy_hours: Finite = None
    tokens: int = 0
    cloud_gpu: Finite = None
    # money (tokens / 1e6 x each model's price), as the agent sent it: its empty sum is the int 0, kept an int in --json
    cloud_tokens: int | Finite = None
    cloud_equivalent: Finite = None
    saving: Finite = None
    saving_pct: Finite = None
    missing: list[str] = Field(default_factory=list)  # prices lab.yaml lacks


class PricedDay(Priced):
    day: Day  # YYYY-MM-DD, the lab's local date


class PricedGroup(Priced):
    """One row of `by`: the machine, or one job or model (by: job | model)."""

    machine: str
    job: str | None = None
    model: str | None = None
    label: str | None = None


class ApiProviderSpend(Section):
    provider: str
    simulated: bool = False
    monthly_budget: Finite = None
    # money as the gateway sent it: a sum over nothing is its int 0, kept an int in --json (as cloud_tokens)
    today: int | Finite = None
    month: int | Finite = None
    since: int | Finite = None
    budget_pct: Finite = None


class ApiSpend(Section):
    providers: list[ApiProviderSpend] = Field(default_factory=list)
    today: int | Finite = None
    month: int | Finite = None
    since: int | Finite = None
    days: dict[Day, Finite] = Field(default_factory=dict)


class CostsReport(Section):
    """`costs.get`: energy and money of one machine: now, today, this month, since a day, by job or model, per day."""

    machine: str
    currency: str
    timezone: str
    rented: bool = False
    simulated: bool = False
    now: CostsNow = Field(default_factory=CostsNow)
    today: Priced = Field(default_factory=Priced)
    month: Priced = Field(default_factory=Priced)
    since: PricedDay
    by: list[PricedGroup] = Field(default_factory=list)
    days: list[PricedDay] = Field(default_factory=list)
    api: ApiSpend | None = None  # the gateway's machine only


COSTS_GET = Method(
    "costs.get",
    CostsParams,
    CostsReport,
    doc="Energy and money of this machine: now, today, this month, since a date, by job or model.",
)
