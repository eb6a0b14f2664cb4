"""`cetlab gateway`: the lab gateway's URL, traffic, spend and keys; `cetlab gateway keys add|list|revoke`."""

from __future__ import annotations

import argparse
import time

from agents.wire.catalogue.gateway import (
    GATEWAY_KEYS_ADD,
    GATEWAY_KEYS_LIST,
    GATEWAY_KEYS_REVOKE,
    GATEWAY_STATUS,
    KeyAddParams,
    KeyList,
    KeyNameParams,
)
from agents.wire.protocol import ErrorCode, LinkStatus, RemoteError
from agents.wire.sections.gateway import GatewaySection
from agents.wire.words import plural
from console.cli.main import Context
from widgets.format import fmt, key_limits_text
from widgets.format import fmt_money as money

EXIT_OK = 0


def gateway_machine(ctx: Context) -> str:
    if ctx.lab.gateway is None:
        raise RemoteError(
            ErrorCode.UNAVAILABLE, "this lab has no gateway: add `gateway: {machine: NAME}` to lab.yaml (docs/gateway.md)"
        )
    return ctx.lab.gateway.machine


def gateway_human(data: GatewaySection) -> str:
    c = data.currency
    lines = [f"gateway {data.url or 'NOT SERVING'} on {data.machine}" + (f": {data.error}" if data.error else "")]
    down = {m: s for m, s in data.peers.items() if s != LinkStatus.ONLINE}
    if down:
        lines.append("peers not reachable: " + ", ".join(f"{m} ({s})" for m, s in down.items()))
    where = {id(m): (m.where or "") + (" SIM" if m.simulated else "") for m in data.models}
    wn = max([24, *(len(m.name) for m in data.models)])  # the columns fit their longest cell ("workstation SIM")
    ww = max([12, *map(len, where.values())])
    lines.append(
        f"{'model':<{wn}} {'tier':<8} {'where':<{ww}} {'state':<10} {'rps':>6} {'fly':>4} {'queue':>5} {'p50':>7} {'p95':>7} "
        f"{'ttft50':>7} {'wakes':>5} {'err':>4}"
    )
    for m in data.models:
        lines.append(
            f"{m.name:<{wn}} {m.tier:<8} {where[id(m)]:<{ww}} {m.state or '':<10} {m.rps:>6.2f} "
            f"{m.in_flight:>4} {m.queued:>5} {fmt(m.p50_latency_s, '.3f'):>7} {fmt(m.p95_latency_s, '.3f'):>7} "
            f"{fmt(m.p50_ttft_s, '.3f'):>7} {m.wakes:>5} {m.errors:>4}"
        )
    for p in data.providers:
        budget = f" of {money(p.monthly_budget, c)} ({fmt(p.budget_pct, '.0f', '%')})" if p.monthly_budget is not None else ""
        flags = (" SIM" if p.simulated else "") + ("" if p.key_set else "  API KEY NOT SET")
        lines.append(f"provider {p.name}{flags}: today {money(p.spend_today, c)}, this month {money(p.spend_month, c)}{budget}")
    for k in data.keys:
        state = "REVOKED" if k.revoked else f"{plural(k.requests, 'request')}, {key_limits_text(k, c)}"
        lines.append(f"key {k.name:<16} {state}")
    return "\n".join(lines)


async def cmd_gateway(ctx: Context) -> int:
    machine = gateway_machine(ctx)
    section = (await ctx.request(machine, GATEWAY_STATUS)).root
    if section is None:
        raise RemoteError(ErrorCode.UNAVAILABLE, f"the gateway does not run on {machine} (its agent has no gateway section)")
    ctx.out(section.model_dump(mode="json"), lambda _: gateway_human(section))
    return EXIT_OK


async def cmd_keys_add(ctx: Context) -> int:
    models = [m.strip() for m in (ctx.args.models or "").split(",") if m.strip()]
    params = KeyAddParams.model_validate(
        {
            "name": ctx.args.name,
            "rpm": ctx.args.rpm,
            "tokens_per_day": ctx.args.tokens_per_day,
            "models": models,
            "expires": ctx.args.expires,
            "budget": ctx.args.budget,
        }
    )
    issued = await ctx.request(gateway_machine(ctx), GATEWAY_KEYS_ADD, params)
    ctx.out(
        issued.model_dump(mode="json"),
        lambda _: (
            f"gateway key {issued.name} (shown once, keep it secret):\n{issued.key}\n"
            + "".join(
                f"{label}: {value}\n"
                for label, value in (
                    ("models", ", ".join(issued.models)),
                    ("expires", issued.expires),
                    ("budget", issued.budget),
                )
                if value
            )
            + f"use: curl -H 'Authorization: Bearer {issued.key}' {issued.url}/models"
        ),
    )
    return EXIT_OK


def keys_human(data: KeyList, currency: str) -> str:
    lines = []
    for k in data.keys:
        state = (
            f"revoked {time.strftime('%Y-%m-%d %H:%M', time.localtime(k.revoked_at))}"
            if k.revoked_at
            else "EXPIRED"
            if k.expired
            else "active"
        )
        lines.append(f"{k.name:<20} {state:<24} {plural(k.requests, 'request')}, {key_limits_text(k, currency)}")
    return "\n".join(lines) or "no gateway keys: `cetlab gateway keys add NAME`"


async def cmd_keys_list(ctx: Context) -> int:
    keys = await ctx.request(gateway_machine(ctx), GATEWAY_KEYS_LIST)
    ctx.out(keys.model_dump(mode="json"), lambda _: keys_human(keys, ctx.lab.costs.currency))
    return EXIT_OK


async def cmd_keys_revoke(ctx: Context) -> int:
    revoked = await ctx.request(gateway_machine(ctx), GATEWAY_KEYS_REVOKE, KeyNameParams(name=ctx.args.name))
    ctx.out(revoked.model_dump(mode="json"), lambda _: f"revoked gateway key {revoked.name}")
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("gateway", help="the lab gateway: url, traffic per model, provider spend, keys")
    p.set_defaults(func=cmd_gateway)
    verbs = p.add_subparsers(dest="gateway_verb", metavar="keys")
    keys = verbs.add_parser("keys", help="gateway API keys (add and revoke need an operator key)")
    key_verbs = keys.add_subparsers(dest="keys_verb", required=True, metavar="add|list|revoke")
    add = key_verbs.add_parser("add", help="issue a key (printed once)")
    add.add_argument("name")
    add.add_argument("--rpm", type=int, help="requests per minute")
    add.add_argument("--tokens-per-day", type=int, help="prompt + completion tokens per day")
    add.add_argument("--models", help="the models it may use: names and aliases, fnmatch patterns ('llama-*,tiny'); default all")
    add.add_argument("--expires", help="the date (in the lab's time zone) or ISO time it stops working: 2027-01-01")
    add.add_argument("--budget", help="what its requests may cost (providers' prices) per day or month: 5usd/day, 20/month")
    add.set_defaults(func=cmd_keys_add)
    key_verbs.add_parser("list", help="names, quotas and use (never the keys)").set_defaults(func=cmd_keys_list)
    revoke = key_verbs.add_parser("revoke", help="refuse a key from now on")
    revoke.add_argument("name")
    revoke.set_defaults(func=cmd_keys_revoke)
