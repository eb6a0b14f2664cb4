"""Notification routes as the console and the CLI show them: each machine's `notify.status`, one line per route."""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError

from agents.wire.sections.notify import NotifyStatus, RouteStatus
from widgets.format import fmt_ago


def route_statuses(results: dict[str, Any]) -> list[tuple[str, RouteStatus]]:
    """(machine, route) for every route of every machine that answered `notify.status`, typed or raw (an error or an old
    agent: none)."""
    out: list[tuple[str, RouteStatus]] = []
    for machine, result in results.items():
        if isinstance(result, NotifyStatus):  # typed where it entered (request)
            status = result
        elif not isinstance(result, dict):
            continue
        else:
            try:
                status = NotifyStatus.model_validate(result)
            except ValidationError:
                continue
        out += [(machine, route) for route in status.routes]
    return sorted(out, key=lambda mr: (mr[1].name, mr[0]))


def routes_json(routes: list[tuple[str, RouteStatus]]) -> list[dict[str, Any]]:
    """`cetlab --json alerts`' "routes": each route on each machine that sends on it, with its delivery state."""
    return [{"machine": machine, **route.model_dump(mode="json")} for machine, route in routes]


def troubled_first(routes: list[tuple[str, RouteStatus]]) -> list[tuple[str, RouteStatus]]:
    """The routes as :alerts lists them in its few lines: a problem, a failing or a waiting one before those that deliver
    (with two routes on four machines the last lines are cut at 80x24: the cut ones are then the healthy ones)."""

    def troubled(route: RouteStatus) -> bool:
        failing = route.last_failure is not None and (
            route.last_delivery is None or route.last_failure.at > route.last_delivery.at
        )
        return bool(route.problem or failing or route.queued or route.dropped)

    return sorted(routes, key=lambda mr: not troubled(mr[1]))  # stable: by name and machine within each


def route_line(machine: str, route: RouteStatus, now: float | None = None) -> str:
    """One line: the route, where it sends, its last delivery, what waits and the last failure."""
    now = now or time.time()
    kind = route.kind + (f" {route.format}" if route.format else "")
    parts = [f"{route.name}{' SIM' if route.simulated else ''} ({kind} → {route.target}) from {machine}"]
    if route.last_delivery is not None:
        parts.append(f"last delivered {fmt_ago(route.last_delivery.at, now)}: {route.last_delivery.answer}")
    else:
        parts.append("nothing delivered yet")
    parts.append(f"{route.delivered} delivered")
    if route.queued:
        parts.append(f"{route.queued} queued" + (" (rate limit)" if route.rate_limited else ""))
    if route.failures:
        parts.append(f"{route.failures} failed attempts")
    if route.dropped:
        parts.append(f"{route.dropped} dropped")
    if route.problem:
        parts.append(f"PROBLEM: {route.problem}")
    elif route.last_failure is not None and (route.last_delivery is None or route.last_failure.at > route.last_delivery.at):
        parts.append(f"FAILING {fmt_ago(route.last_failure.at, now)}: {route.last_failure.answer}")
    return " · ".join(parts)
