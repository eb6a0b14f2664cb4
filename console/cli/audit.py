"""`cetlab audit`: who did what on the lab's agents (operator actions, newest first)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from agents.wire.catalogue.audit import AUDIT_LIST, AuditListParams
from console.cli.main import Context
from console.lab.audit import merge_trails

EXIT_OK, EXIT_FAILED = 0, 1


def audit_human(data: dict[str, Any]) -> str:
    lines = []
    for e in data["entries"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["t"]))
        outcome = e["outcome"] if e["outcome"] == "ok" else f"{e['outcome']}: {e['message'] or ''}"
        lines.append(f"{when}  {e['machine']:<12} {e['who']:<24} {e['method']:<20} {e['params'] or '':<40} {outcome}")
    lines += [f"{machine}: {why}" for machine, why in data["unavailable"].items()]
    return "\n".join(lines) or "no operator actions recorded"


async def cmd_audit(ctx: Context) -> int:
    wanted: dict[str, Any] = {"limit": ctx.args.limit}
    for key in ("who", "method"):
        if getattr(ctx.args, key):
            wanted[key] = getattr(ctx.args, key)
    if ctx.args.since_s:
        wanted["since"] = time.time() - ctx.args.since_s
    machines = [ctx.args.machine] if ctx.args.machine else list(ctx.state.machines)
    results = await ctx.request_all(AUDIT_LIST, AuditListParams(**wanted), machines)
    data = merge_trails(results, ctx.args.limit)
    ctx.out(data, audit_human)
    return EXIT_OK if len(data["unavailable"]) < len(results) else EXIT_FAILED


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("audit", help="the audit trail: every operator action (who, what, params, outcome); operator keys only")
    p.add_argument("--machine", help="one machine (default: all)")
    p.add_argument("--who", help="only this caller (key comment, or socket user as shown)")
    p.add_argument("--method", help="only this method, e.g. jobs.start")
    p.add_argument("--since-s", type=float, help="only the last N seconds")
    p.add_argument("--limit", type=int, default=50, help="at most this many entries (default 50)")
    p.set_defaults(func=cmd_audit)
