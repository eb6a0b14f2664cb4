"""`cetlab queue`, `cancel`, `hold`, `release`: the lab queue (agents/scheduler/), as its keeper's agent has it."""

from __future__ import annotations

import argparse
import time

from agents.wire.catalogue.method import Method
from agents.wire.catalogue.queue import (
    QUEUE_CANCEL,
    QUEUE_HOLD,
    QUEUE_LIST,
    QUEUE_RELEASE,
    EntryParams,
    QueueListParams,
)
from agents.wire.lab.queue import scheduler_machine
from agents.wire.sections.queue import EntryState, QueueEntry
from console.cli.main import Context
from console.lab.replies import sent
from widgets.format import NA

EXIT_OK = 0


def _clock(t: float | None) -> str:
    return time.strftime("%H:%M", time.localtime(t)) if t is not None else NA


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def entry_line(entry: QueueEntry) -> str:
    """One entry in words: what became of it, or where it stands in line and why it waits."""
    head = f"entry {entry.id} ({entry.recipe}, {entry.user})"
    if entry.state in (EntryState.RUNNING, EntryState.STARTING):
        gpus = ",".join(map(str, entry.gpus)) or "no GPU"
        job = f"job {entry.job_id}" if entry.job_id else "its job"
        return f"{head}: {entry.state}: {job} on {entry.machine} (GPUs {gpus})"
    if entry.state is EntryState.QUEUED:
        place = f"{_ordinal(entry.position)} in line" if entry.position else "queued"
        start = f"; expected start about {_clock(entry.expected_start)}" if entry.expected_start else ""
        return f"{head}: {place}: {entry.reason or 'waiting for its turn'}{start}"
    if entry.state is EntryState.ENDED:
        how = entry.job_state or "ended"
        return (
            f"{head}: {how}" + (f" (job {entry.job_id})" if entry.job_id else "") + (f": {entry.reason}" if entry.reason else "")
        )
    return f"{head}: {entry.state}" + (f": {entry.reason}" if entry.reason else "")


def queue_human(entries: list[QueueEntry], machine: str) -> str:
    if not entries:
        return f"the lab queue on {machine} is empty"
    rows = [f"{'ID':>4}  {'STATE':<9}  {'PRI':>4}  {'RECIPE':<16}  {'USER':<18}  {'SUBMITTED':<9}  WHERE / WHY"]
    for e in entries:
        if e.state in (EntryState.RUNNING, EntryState.STARTING, EntryState.ENDED) and e.machine:
            where = f"{e.machine} GPUs {','.join(map(str, e.gpus)) or '-'}" + (f" job {e.job_id}" if e.job_id else "")
            if e.state is EntryState.ENDED:
                where += f" {e.job_state or ''}".rstrip() + (f": {e.reason}" if e.reason else "")
        else:
            where = (f"#{e.position} " if e.position else "") + (e.reason or e.need)
            if e.expected_start:
                where += f" (start about {_clock(e.expected_start)})"
        rows.append(
            f"{e.id:>4}  {e.state:<9}  {e.priority:>4}  {e.recipe[:16]:<16}  {e.user[:18]:<18}  {_clock(e.submitted_at):<9}  {where}"
        )
    return "\n".join(rows)


async def cmd_queue(ctx: Context) -> int:
    machine = scheduler_machine(ctx.lab)
    listing = await ctx.request(machine, QUEUE_LIST, QueueListParams(ended=not ctx.args.waiting))
    entries = listing.root
    ctx.out({"machine": machine, "queue": [sent(e) for e in entries]}, lambda _: queue_human(entries, machine))
    return EXIT_OK


async def _entry_verb(ctx: Context, method: Method[EntryParams, QueueEntry]) -> int:
    machine = scheduler_machine(ctx.lab)
    entry = await ctx.request(machine, method, EntryParams(id=ctx.args.entry))
    ctx.out(sent(entry), lambda _: entry_line(entry))
    return EXIT_OK


async def cmd_cancel(ctx: Context) -> int:
    return await _entry_verb(ctx, QUEUE_CANCEL)


async def cmd_hold(ctx: Context) -> int:
    return await _entry_verb(ctx, QUEUE_HOLD)


async def cmd_release(ctx: Context) -> int:
    return await _entry_verb(ctx, QUEUE_RELEASE)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("queue", help="the lab queue: what waits, why, and what it started")
    p.add_argument("--waiting", action="store_true", help="only the entries waiting or running, not the ended ones")
    p.set_defaults(func=cmd_queue)
    for verb, func, words in (
        ("cancel", cmd_cancel, "take a waiting entry out of the lab queue"),
        ("hold", cmd_hold, "keep a queued entry from starting until it is released"),
        ("release", cmd_release, "let a held entry start when it can"),
    ):
        p = sub.add_parser(verb, help=words)
        p.add_argument("entry", type=int, help="the entry's number (`cetlab queue`)")
        p.set_defaults(func=func)
