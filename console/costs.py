"""The lab's money, summed over its machines: from `costs.get` answers, or live from the costs sections."""

from __future__ import annotations

from typing import Any, Mapping

from agents.catalogue import COSTS_GET, CostsReport, ReplyInvalid, validate_reply
from agents.protocol import ErrorCode, RemoteError
from console.state import LabState


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


def lab_costs(currency: str, results: Mapping[str, Any], by: str = "machine") -> dict[str, Any]:
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
            days.setdefault(day_name, {"cost": [0.0], "cloud_equivalent": [0.0], "kwh": [0.0]}).setdefault("api", []).append(spend)
    missing = sorted({m for r in parts for m in (*r.now.missing, *r.today.missing, *r.month.missing, *r.since.missing)})
    month = _sum([r.month.cost for r in parts])
    cloud_month = _sum([r.month.cloud_equivalent for r in parts])
    since = _sum([r.since.cost for r in parts])
    cloud_since = _sum([r.since.cloud_equivalent for r in parts])
    return {
        "currency": currency,
        "now_per_hour": _sum([r.now.per_hour for r in parts]),
        "power_w": _sum([r.now.power_w for r in parts]),
        "today": _sum([r.today.cost for r in parts]),
        "month": month,
        "kwh_today": _sum([r.today.kwh for r in parts]),
        "kwh_month": _sum([r.month.kwh for r in parts]),
        "cloud_equivalent_today": _sum([r.today.cloud_equivalent for r in parts]),
        "cloud_equivalent_month": cloud_month,
        "saving_month": None if month is None or cloud_month is None else round(cloud_month - month, 6),
        "saving_pct_month": _saving_pct(month, cloud_month),
        "since": min((r.since.day for r in parts), default=None),
        "since_total": since,
        "cloud_equivalent_since": cloud_since,
        "saving_pct_since": _saving_pct(since, cloud_since),
        "api_providers": [p.model_dump(mode="json", exclude_unset=True) for api in apis for p in api.providers],
        "api_today": _sum([api.today for api in apis]),
        "api_month": _sum([api.month for api in apis]),
        "api_since": _sum([api.since for api in apis]),
        "total_month": None if month is None else _sum([month, *(api.month for api in apis)]),
        "by_kind": by,
        "by": [entry.model_dump(mode="json", exclude_unset=True) for r in parts for entry in r.by],
        "days": [{"day": d, "api": 0.0, **{k: _sum(v) for k, v in e.items()}} for d, e in sorted(days.items())],
        "missing": missing,
        "offline": offline,
        "simulated": any(r.simulated for r in parts),
    }


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
