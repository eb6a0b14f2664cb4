"""The lab's money, summed over its machines: from `costs.get` answers, or live from the costs sections."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel

from agents.wire.catalogue.costs import COSTS_GET, ApiProviderSpend, CostsReport, PricedGroup
from agents.wire.catalogue.method import ReplyInvalid, validate_reply
from agents.wire.protocol import ErrorCode, RemoteError
from console.lab.state import LabState

Breakdown = Literal["machine", "job", "model"]  # `costs.get`'s by
# a lab total: None when one part is unknown; the int 0 when nothing was summed (no gateway's API spend, no machine
# answered), as `cetlab costs --json` has always written it
Total = float | int | None


def _sum(values: list[float | None]) -> float | None:
    """A total that is unknown when one part is unknown (a missing price), never a wrong number."""
    known = [v for v in values if v is not None]
    return None if len(known) < len(values) else round(sum(known), 6)


def _saving_pct(cost: float | None, cloud: float | None) -> float | None:
    return None if cost is None or not cloud else round((cloud - cost) / cloud * 100, 2)


def _report(result: Any) -> CostsReport | RemoteError:
    """One machine's `costs.get` answer, typed (a raw one is validated here), or why there is none."""
    if isinstance(result, (CostsReport, RemoteError)):
        return result
    if isinstance(result, dict):
        try:
            return validate_reply(COSTS_GET, result)
        except ReplyInvalid as exc:
            return exc
    return RemoteError(ErrorCode.INTERNAL, str(result))


class LabDay(BaseModel):
    """One day of the lab's spend: its machines' (unknown when one lacks a price) and the gateway's API spend."""

    day: str  # YYYY-MM-DD, the lab's local date
    api: Total
    cost: Total
    cloud_equivalent: Total
    kwh: Total


class LabCosts(BaseModel):
    """The lab's money, summed over the machines that answered `costs.get` (what `cetlab costs --json` prints).

    Every figure is None where one machine's is unknown (a missing price), never a partial sum. ``by`` and
    ``api_providers`` are the machines' own rows as they answered them.
    """

    currency: str
    now_per_hour: Total
    power_w: Total
    today: Total
    month: Total
    kwh_today: Total
    kwh_month: Total
    cloud_equivalent_today: Total
    cloud_equivalent_month: Total
    saving_month: Total
    saving_pct_month: Total
    since: str | None  # the first day counted (YYYY-MM-DD); None when no machine answered
    since_total: Total
    cloud_equivalent_since: Total
    saving_pct_since: Total
    api_providers: list[ApiProviderSpend]
    api_today: Total
    api_month: Total
    api_since: Total
    total_month: Total  # the machines' month and the API's
    by_kind: Breakdown
    by: list[PricedGroup]
    days: list[LabDay]
    missing: list[str]  # the prices lab.yaml lacks
    offline: dict[str, str]  # machine -> why it is not counted
    simulated: bool  # some GPU power is simulated

    def to_json(self) -> dict[str, Any]:
        """As JSON; the machines' rows as they sent them (fields they left out stay out)."""
        return self.model_dump(mode="json", exclude_unset=True)


def lab_costs(currency: str, results: Mapping[str, Any], by: Breakdown = "machine") -> LabCosts:
    """Sum `costs.get` answers (typed, or raw and validated here; or the RemoteErrors of machines not reached) into the
    lab's figures."""
    checked = {name: _report(r) for name, r in results.items()}
    parts = [r for r in checked.values() if isinstance(r, CostsReport)]
    offline = {name: r.message for name, r in checked.items() if isinstance(r, RemoteError)}
    days: dict[str, dict[str, list[float | None]]] = {}
    for report in parts:
        for day in report.days:
            entry = days.setdefault(day.day, {"cost": [], "cloud_equivalent": [], "kwh": []})
            entry["cost"].append(day.cost)
            entry["cloud_equivalent"].append(day.cloud_equivalent)
            entry["kwh"].append(day.kwh)
    apis = [r.api for r in parts if r.api is not None]  # the gateway's machine reports the API spend
    for api in apis:
        for day_name, spend in api.days.items():
            days.setdefault(day_name, {"cost": [0.0], "cloud_equivalent": [0.0], "kwh": [0.0]}).setdefault("api", []).append(
                spend
            )
    missing = sorted({m for r in parts for m in (*r.now.missing, *r.today.missing, *r.month.missing, *r.since.missing)})
    month = _sum([r.month.cost for r in parts])
    cloud_month = _sum([r.month.cloud_equivalent for r in parts])
    since = _sum([r.since.cost for r in parts])
    cloud_since = _sum([r.since.cloud_equivalent for r in parts])
    return LabCosts(
        currency=currency,
        now_per_hour=_sum([r.now.per_hour for r in parts]),
        power_w=_sum([r.now.power_w for r in parts]),
        today=_sum([r.today.cost for r in parts]),
        month=month,
        kwh_today=_sum([r.today.kwh for r in parts]),
        kwh_month=_sum([r.month.kwh for r in parts]),
        cloud_equivalent_today=_sum([r.today.cloud_equivalent for r in parts]),
        cloud_equivalent_month=cloud_month,
        saving_month=None if month is None or cloud_month is None else round(cloud_month - month, 6),
        saving_pct_month=_saving_pct(month, cloud_month),
        since=min((r.since.day for r in parts), default=None),
        since_total=since,
        cloud_equivalent_since=cloud_since,
        saving_pct_since=_saving_pct(since, cloud_since),
        api_providers=[p for api in apis for p in api.providers],
        api_today=_sum([api.today for api in apis]),
        api_month=_sum([api.month for api in apis]),
        api_since=_sum([api.since for api in apis]),
        total_month=None if month is None else _sum([month, *(api.month for api in apis)]),
        by_kind=by,
        by=[entry for r in parts for entry in r.by],
        days=[
            LabDay(
                day=d,
                api=_sum(e["api"]) if "api" in e else 0.0,
                cost=_sum(e["cost"]),
                cloud_equivalent=_sum(e["cloud_equivalent"]),
                kwh=_sum(e["kwh"]),
            )
            for d, e in sorted(days.items())
        ],
        missing=missing,
        offline=offline,
        simulated=any(r.simulated for r in parts),
    )


def live_totals(state: LabState) -> dict[str, Any] | None:
    """The header counter's figures from the "costs" sections the agents push every tick; None before any arrive."""
    parts = [v.costs for v in state.machines.values() if v.online and v.costs]
    if not parts:
        return None
    return {
        "currency": state.lab.costs.currency,
        "per_hour": _sum([p.now_per_hour for p in parts]),
        "today": _sum([p.today for p in parts]),
        "month": _sum([p.month for p in parts]),
        "power_w": _sum([p.power_w for p in parts]),
        "missing": sorted({m for p in parts for m in p.missing}),
        "simulated": any(p.simulated for p in parts),
        "not_counted": sorted(v.name for v in state.machines.values() if not (v.online and v.costs)),
    }
