"""`cetlab costs` and `cetlab alerts`: the lab's money and alerts, summed over its machines."""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import date
from typing import Any

from agents.protocol import ErrorCode, RemoteError
from agents.notify.wire import RouteStatus
from agents.sections import ALERT_ID_FORM, parse_alert_id
from console.alerts import offline_alerts
from console.costs import lab_costs
from console.notify import route_line, route_statuses, routes_json
from widgets.format import fmt_money as money
from widgets.format import fmt_pct as pct
from widgets.format import fmt_time

EXIT_OK, EXIT_FAILED = 0, 1


def costs_human(data: dict[str, Any]) -> str:
    c = data["currency"]
    sim = "  (SIM: simulated GPU power)" if data["simulated"] else ""
    lines = [
        f"now        {money(data['now_per_hour'], c)}/h at {data['power_w'] or 0:,.0f} W{sim}",
        f"today      {money(data['today'], c):>14}   cloud {money(data['cloud_equivalent_today'], c)}   {data['kwh_today'] or 0:.2f} kWh",
        f"this month {money(data['month'], c):>14}   cloud {money(data['cloud_equivalent_month'], c)}   saving {pct(data['saving_pct_month'])}",
        f"since {data['since']} {money(data['since_total'], c):>10}   cloud {money(data['cloud_equivalent_since'], c)}   saving {pct(data['saving_pct_since'])}",
    ]
    lines += api_lines(data)
    lines.append(f"by {data['by_kind']}:")
    key = data["by_kind"]
    for entry in data["by"]:
        name = entry[key] if key == "machine" else f"{entry[key]} {entry.get('label') or ''}".strip() + f" @{entry['machine']}"
        lines.append(
            f"  {name:<32} {entry['kwh']:>9.3f} kWh  {money(entry['cost'], c):>14}  cloud {money(entry['cloud_equivalent'], c):>14}"
            f"  {entry['gpu_hours']:.2f} GPU-h" + (f"  {entry['tokens']:,} tokens" if entry.get("tokens") else "")
        )
    if not data["by"]:
        lines.append("  (nothing recorded)")
    lines += [f"{m}" for m in data["missing"]]
    lines += [f"not counted, offline: {name}: {why}" for name, why in data["offline"].items()]
    return "\n".join(lines)


def api_lines(data: dict[str, Any]) -> list[str]:
    """The gateway's API spend per provider against its monthly budget, and the lab's month with it."""
    if not data["api_providers"]:
        return []
    c = data["currency"]
    lines = [f"API        today {money(data['api_today'], c)}   this month {money(data['api_month'], c)}   "
             f"lab total this month {money(data['total_month'], c)}"]
    for p in data["api_providers"]:
        budget = f" of {money(p['monthly_budget'], c)} ({pct(p['budget_pct'])})" if p["monthly_budget"] is not None else " (no budget)"
        lines.append(f"  {p['provider'] + (' SIM' if p['simulated'] else ''):<20} today {money(p['today'], c):>12}   "
                     f"this month {money(p['month'], c)}{budget}")
    return lines


async def cmd_costs(ctx) -> int:
    params: dict[str, Any] = {"by": ctx.args.by}
    if ctx.args.since:
        params["since"] = ctx.args.since.isoformat()
    results = await ctx.client.call_all("costs.get", params)
    data = lab_costs(ctx.lab.costs.currency, results, ctx.args.by)
    ctx.out(data, costs_human)
    return EXIT_OK if len(data["offline"]) < len(results) else EXIT_FAILED


def alerts_human(data: dict[str, Any]) -> str:
    lines = []
    for alert in data["alerts"]:
        since = fmt_time(alert.get("fired_at"))
        state = "CLEARED" if alert.get("cleared_at") else ("acked" if alert.get("acked_at") else "ACTIVE")
        lines.append(f"{alert['id']:<16} {state:<8} {alert['level']:<8} {alert['machine']:<12} {alert['target']:<14} {since}  {alert['message']}")
    text = "\n".join(lines) or "no alerts"
    routes = [route_line(r["machine"], RouteStatus.model_validate(r)) for r in data.get("routes", [])]
    return text + ("\nnotification routes:\n" + "\n".join(f"  {line}" for line in routes) if routes else "")


def alert_id_arg(text: str) -> str:
    """--ack's argument: an alert id as `cetlab alerts` lists it; anything else (a job id, a typo) is a usage error."""
    if parse_alert_id(text) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an alert id: alert ids are {ALERT_ID_FORM}, e.g. m5#12 "
                                         "(see `cetlab alerts --all`)")
    return text


def alert_machine(ctx, alert_id: str) -> str:
    """The machine that raised an alert (its id is "<machine>#<n>", checked by alert_id_arg); a clear error for any other."""
    machine, n = parse_alert_id(alert_id)
    names = [m.name for m in ctx.lab.machines]
    if machine not in names:
        raise RemoteError(ErrorCode.NOT_FOUND, f"no alert {alert_id!r} in {ctx.lab.lab}: there is no machine {machine!r} "
                          f"(machines: {', '.join(names)})")
    if n == "offline":
        raise RemoteError(ErrorCode.CONFLICT, f"{alert_id} is raised by this console, not an agent: it clears when {machine} answers again")
    return machine


async def cmd_notify_test(ctx) -> int:
    """`cetlab alerts notify-test ROUTE`: each machine that sends on the route sends a test; what each endpoint answered."""
    names = [r.name for r in ctx.lab.notify.routes]
    route = ctx.lab.notify.route(ctx.args.route)
    if route is None:
        raise RemoteError(ErrorCode.NOT_FOUND, f"no route {ctx.args.route!r} in {ctx.lab.lab}'s notify.routes"
                          + (f" (routes: {', '.join(names)})" if names else " (it has none; see the README's \"Notifications\")"))
    machines = route.machines or [m.name for m in ctx.lab.machines]
    results = await asyncio.gather(*(ctx.call(m, "notify.test", {"route": route.name}, max(ctx.args.timeout, route.timeout_s + 5))
                                     for m in machines), return_exceptions=True)
    answers = []
    for machine, result in zip(machines, results):
        if isinstance(result, BaseException):
            answers.append({"route": route.name, "machine": machine, "ok": False, "answer": getattr(result, "message", str(result)),
                            "sent": False})
        else:
            answers.append({**result, "sent": True})
    ctx.out({"tests": answers}, lambda d: "\n".join(
        f"{a['route']} from {a['machine']}: {'OK' if a['ok'] else 'FAILED'}: {a['answer']}" for a in d["tests"]))
    return EXIT_OK if answers and all(a["ok"] for a in answers) else EXIT_FAILED


def check_alerts_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors argparse cannot see, found before any machine is dialled (exit 2, as every usage error)."""
    if args.action == "notify-test" and not args.route:
        parser.error("notify-test needs ROUTE: cetlab alerts notify-test ROUTE (a name from lab.yaml's notify.routes)")
    if args.action is None and args.route:
        parser.error(f"a route is given with notify-test only: cetlab alerts notify-test {args.route}")
    if args.action and args.ack:
        parser.error("--ack and notify-test are separate calls")


async def cmd_alerts(ctx) -> int:
    if ctx.args.action == "notify-test":
        return await cmd_notify_test(ctx)
    if ctx.args.ack:
        machine = alert_machine(ctx, ctx.args.ack)
        result = await ctx.call(machine, "alerts.ack", {"id": ctx.args.ack})
        ctx.out(result, lambda r: f"acknowledged {r['id']}: {r['message']}")
        return EXIT_OK
    results = await ctx.client.call_all("alerts.list", {"active": not ctx.args.all, "limit": ctx.args.limit})
    alerts = offline_alerts(ctx.state, time.time(), 0.0)
    for name, result in results.items():
        if isinstance(result, dict):
            alerts += result["alerts"]
    alerts.sort(key=lambda a: (a.get("cleared_at") is not None, -(a.get("fired_at") or 0)))
    routes = routes_json(route_statuses(await ctx.client.call_all("notify.status"))) if ctx.lab.notify.routes else []
    ctx.out({"alerts": alerts, "routes": routes}, alerts_human)
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
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
