"""`cetlab costs` and `cetlab alerts`: the lab's money and alerts, summed over its machines."""

from __future__ import annotations

import argparse
import time
from datetime import date
from typing import Any

from agents.wire.catalogue.alerts import ALERTS_ACK, ALERTS_LIST, AckParams, AlertListParams
from agents.wire.catalogue.costs import COSTS_GET, CostsParams
from agents.wire.catalogue.notify import NOTIFY_STATUS, NOTIFY_TEST, NotifyTestParams
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.alerts import ALERT_ID_FORM, parse_alert_id
from agents.wire.sections.notify import NotifyStatus, RouteStatus
from console.cli.main import Context
from console.lab.alerts import offline_alerts
from console.lab.costs import LabCosts, lab_costs
from console.lab.notify import route_line, route_statuses, routes_json
from console.lab.replies import Answers
from widgets.format import fmt_money as money
from widgets.format import fmt_pct as pct
from widgets.format import fmt_saving, fmt_time

EXIT_OK, EXIT_FAILED = 0, 1


def costs_human(report: LabCosts) -> str:
    """The lab's figures, then each machine's breakdown rows and API providers as they answered."""
    c = report.currency
    sim = "  (SIM: simulated GPU power)" if report.simulated else ""
    lines = [
        f"now        {money(report.now_per_hour, c)}/h at {report.power_w or 0:,.0f} W{sim}",
        f"today      {money(report.today, c):>14}   cloud {money(report.cloud_equivalent_today, c)}   {report.kwh_today or 0:.2f} kWh",
        f"this month {money(report.month, c):>14}   cloud {money(report.cloud_equivalent_month, c)}   saving {fmt_saving(report.saving_pct_month)}",
        f"since {report.since} {money(report.since_total, c):>10}   cloud {money(report.cloud_equivalent_since, c)}   saving {fmt_saving(report.saving_pct_since)}",
    ]
    lines += api_lines(report)
    key = report.by_kind
    lines.append(f"by {key}:")
    for entry in report.by:
        owner = entry.job if key == "job" else entry.model if key == "model" else entry.machine
        name = entry.machine if key == "machine" else f"{owner} {entry.label or ''}".strip() + f" @{entry.machine}"
        lines.append(
            f"  {name:<32} {entry.kwh or 0:>9.3f} kWh  {money(entry.cost, c):>14}  cloud {money(entry.cloud_equivalent, c):>14}"
            f"  {entry.gpu_hours or 0:.2f} GPU-h" + (f"  {entry.tokens:,} tokens" if entry.tokens else "")
        )
    if not report.by:
        lines.append("  (nothing recorded)")
    lines += [f"{m}" for m in report.missing]
    lines += [f"not counted, offline: {name}: {why}" for name, why in report.offline.items()]
    return "\n".join(lines)


def api_lines(report: LabCosts) -> list[str]:
    """The gateway's API spend per provider against its monthly budget, and the lab's month with it."""
    if not report.api_providers:
        return []
    c = report.currency
    lines = [
        f"API        today {money(report.api_today, c)}   this month {money(report.api_month, c)}   "
        f"lab total this month {money(report.total_month, c)}"
    ]
    for p in report.api_providers:
        budget = f" of {money(p.monthly_budget, c)} ({pct(p.budget_pct)})" if p.monthly_budget is not None else " (no budget)"
        lines.append(
            f"  {p.provider + (' SIM' if p.simulated else ''):<20} today {money(p.today, c):>12}   "
            f"this month {money(p.month, c)}{budget}"
        )
    return lines


async def cmd_costs(ctx: Context) -> int:
    params = CostsParams(by=ctx.args.by, since=ctx.args.since) if ctx.args.since else CostsParams(by=ctx.args.by)
    results = await ctx.request_all(COSTS_GET, params)
    report = lab_costs(ctx.lab.costs.currency, results, ctx.args.by)
    ctx.out(report.to_json(), lambda _: costs_human(report))
    return EXIT_OK if len(report.offline) < len(results) else EXIT_FAILED


def alerts_human(data: dict[str, Any], routes: list[tuple[str, RouteStatus]]) -> str:
    """The alerts, a line for each machine whose alerts were not read (offline, or a reply that did not validate), then the
    notification routes, with a line for each machine whose route status was not read."""
    lines = []
    for alert in data["alerts"]:
        since = fmt_time(alert["fired_at"])
        state = "CLEARED" if alert["cleared_at"] else ("acked" if alert["acked_at"] else "ACTIVE")
        lines.append(
            f"{alert['id']:<16} {state:<8} {alert['level']:<8} {alert['machine']:<12} {alert['target']:<14} {since}  {alert['message']}"
        )
    if not lines:
        lines.append("no alerts" + (" from the machines that answered" if data["offline"] else ""))
    lines += [f"{name}: alerts not read: {error}" for name, error in data["offline"].items()]
    shown = [route_line(machine, route) for machine, route in routes]
    shown += [f"{name}: route status not read: {error}" for name, error in data["routes_offline"].items()]
    return "\n".join(lines) + ("\nnotification routes:\n" + "\n".join(f"  {line}" for line in shown) if shown else "")


def alert_id_arg(text: str) -> str:
    """--ack's argument: an alert id as `cetlab alerts` lists it; anything else (a job id, a typo) is a usage error."""
    if parse_alert_id(text) is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an alert id: alert ids are {ALERT_ID_FORM}, e.g. m5#12 (see `cetlab alerts --all`)"
        )
    return text


def alert_machine(ctx: Context, alert_id: str) -> str:
    """The machine that raised an alert (its id is "<machine>#<n>", checked by alert_id_arg); a clear error for any other."""
    parsed = parse_alert_id(alert_id)
    if parsed is None:
        raise RemoteError(ErrorCode.INVALID_PARAMS, f"{alert_id!r} is not an alert id: alert ids are {ALERT_ID_FORM}")
    machine, n = parsed
    names = [m.name for m in ctx.lab.machines]
    if machine not in names:
        raise RemoteError(
            ErrorCode.NOT_FOUND,
            f"no alert {alert_id!r} in {ctx.lab.lab}: there is no machine {machine!r} (machines: {', '.join(names)})",
        )
    if n == "offline":
        raise RemoteError(
            ErrorCode.CONFLICT, f"{alert_id} is raised by this console, not an agent: it clears when {machine} answers again"
        )
    return machine


async def cmd_notify_test(ctx: Context) -> int:
    """`cetlab alerts notify-test ROUTE`: each machine that sends on the route sends a test; what each endpoint answered."""
    names = [r.name for r in ctx.lab.notify.routes]
    route = ctx.lab.notify.route(ctx.args.route)
    if route is None:
        raise RemoteError(
            ErrorCode.NOT_FOUND,
            f"no route {ctx.args.route!r} in {ctx.lab.lab}'s notify.routes"
            + (f" (routes: {', '.join(names)})" if names else ' (it has none; see docs/alerts.md, "Notifications")'),
        )
    machines = route.machines or [m.name for m in ctx.lab.machines]
    results = await ctx.request_all(
        NOTIFY_TEST, NotifyTestParams(route=route.name), machines, max(ctx.args.timeout, route.timeout_s + 5)
    )
    answers: list[dict[str, Any]] = []
    for machine, result in results.items():
        if isinstance(result, RemoteError):
            answers.append({"route": route.name, "machine": machine, "ok": False, "answer": result.message, "sent": False})
        else:
            answers.append({**result.model_dump(mode="json"), "sent": True})
    ctx.out(
        {"tests": answers},
        lambda d: "\n".join(
            f"{a['route']} from {a['machine']}: {'OK' if a['ok'] else 'FAILED'}: {a['answer']}" for a in d["tests"]
        ),
    )
    return EXIT_OK if answers and all(a["ok"] for a in answers) else EXIT_FAILED


def check_alerts_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors argparse cannot see, found before any machine is dialled (exit 2, as every usage error)."""
    if args.action == "notify-test" and not args.route:
        parser.error("notify-test needs ROUTE: cetlab alerts notify-test ROUTE (a name from lab.yaml's notify.routes)")
    if args.action is None and args.route:
        parser.error(f"a route is given with notify-test only: cetlab alerts notify-test {args.route}")
    if args.action and args.ack:
        parser.error("--ack and notify-test are separate calls")


async def cmd_alerts(ctx: Context) -> int:
    if ctx.args.action == "notify-test":
        return await cmd_notify_test(ctx)
    if ctx.args.ack:
        machine = alert_machine(ctx, ctx.args.ack)
        acked = await ctx.request(machine, ALERTS_ACK, AckParams(id=ctx.args.ack))
        ctx.out(acked.model_dump(mode="json"), lambda _: f"acknowledged {acked.id}: {acked.message}")
        return EXIT_OK
    answers = Answers.of(await ctx.request_all(ALERTS_LIST, AlertListParams(active=not ctx.args.all, limit=ctx.args.limit)))
    alerts = offline_alerts(ctx.state, time.time(), 0.0)
    for reply in answers.replies.values():
        alerts += [alert.model_dump(mode="json") for alert in reply.alerts]
    alerts.sort(key=lambda a: (a["cleared_at"] is not None, -(a["fired_at"] or 0)))
    # every machine that gave no alerts (offline, refused, a reply that did not validate) is said, as `jobs` and `models` do
    statuses: Answers[NotifyStatus] = Answers.of(await ctx.request_all(NOTIFY_STATUS)) if ctx.lab.notify.routes else Answers()
    routes = route_statuses(dict(statuses.replies))
    data = {"alerts": alerts, "routes": routes_json(routes), "offline": answers.messages(), "routes_offline": statuses.messages()}
    ctx.out(data, lambda d: alerts_human(d, routes))
    return EXIT_OK if answers.replies else EXIT_FAILED


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("costs", help="energy and money: now, today, this month, the cloud equivalent, the saving")
    p.add_argument("--since", type=date.fromisoformat, help="YYYY-MM-DD, the lab's local date (default: the 1st of this month)")
    p.add_argument("--by", choices=["machine", "job", "model"], default="machine", help="the breakdown (default: machine)")
    p.set_defaults(func=cmd_costs)

    p = sub.add_parser("alerts", help="active alerts (and, with --all, their history); --ack ID acknowledges one")
    p.add_argument("--all", action="store_true", help="include cleared alerts")
    p.add_argument("--limit", type=int, default=100, help="at most this many per machine (default 100)")
    p.add_argument("--ack", metavar="ID", type=alert_id_arg, help="acknowledge the alert with this id (e.g. m5#12)")
    p.add_argument("action", nargs="?", choices=["notify-test"], help="notify-test ROUTE: send a test notification on a route")
    p.add_argument("route", nargs="?", help="the route's name (lab.yaml notify.routes)")
    p.set_defaults(func=cmd_alerts, check=lambda args: check_alerts_args(p, args))
