"""`cetlab checkpoints`, `resume`, `serve-checkpoint`, `prune`, `keep`, `delete-checkpoint`: checkpoints from scripts."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from agents.wire.catalogue.checkpoints import (
    CHECKPOINTS_DELETE,
    CHECKPOINTS_KEEP,
    CHECKPOINTS_LIST,
    CHECKPOINTS_PRUNE,
    CHECKPOINTS_RESUME,
    CHECKPOINTS_RUNS,
    CHECKPOINTS_SERVE,
    DeleteParams,
    KeepParams,
    Pruned,
    PruneParams,
    ResumeParams,
    RunCheckpoints,
    RunParams,
    RunSummaryList,
    Served,
    ServeParams,
)
from agents.wire.catalogue.method import request
from agents.wire.catalogue.models import MODELS_GET, ModelParams
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.checkpoints import CheckpointInfo, RunSummary
from agents.wire.served import is_served, serve_failed
from agents.wire.states import ModelState
from console.cli.jobs import job_human, parse_sets
from console.cli.main import Context
from console.lab.replies import Answers, not_reached, sent
from console.lab.runs import RunKey, one_row_per_run
from widgets.format import NA, fmt, fmt_bytes, fmt_duration, fmt_secs, fmt_time, plural

EXIT_OK, EXIT_FAILED = 0, 1
SERVE_WAIT_S = 600.0


def fmt_loss(value: float | None) -> str:
    return fmt(value, ".4f")


def marks(ckpt: CheckpointInfo) -> str:
    flags = [f for f, on in (("BEST", ckpt.is_best), ("newest", ckpt.newest), ("kept", ckpt.kept)) if on]
    if ckpt.serving is not None and is_served(ckpt.serving):
        flags.append(f"served:{ckpt.serving.model}")
    elif ckpt.serving is not None and serve_failed(ckpt.serving):
        flags.append(f"serve-failed:{ckpt.serving.model}")
    if not ckpt.complete:
        flags.append(f"INCOMPLETE: {ckpt.problem}")
    return " ".join(flags)


def table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def runs_human(runs: list[RunSummary], offline: Mapping[str, RemoteError]) -> str:
    rows = [("RUN", "MACHINE", "JOB", "CKPTS", "NEWEST", "BEST", "BEST LOSS", "DISK", "SAVE TIME", "PATH")]
    for run in runs:
        share = f" ({run.save_share_pct:.1f}%)" if run.save_share_pct is not None else ""
        rows.append(
            (
                run.run,
                run.machine,
                run.job_state or NA,
                f"{run.count}" + (f"+{run.incomplete}?" if run.incomplete else ""),
                fmt(run.newest_step, "d"),
                fmt(run.best_step, "d"),
                fmt_loss(run.best_loss),
                fmt_bytes(run.disk_bytes),
                fmt_secs(run.save_s_total) + share,
                run.path,
            )
        )
    lines = table(rows) if len(rows) > 1 else ["(no checkpoints found)"]
    return "\n".join(lines + not_reached(offline))


def run_human(run: RunCheckpoints) -> str:
    share = f", {run.save_share_pct:.2f}% of {fmt_duration(run.wall_s)} wall time" if run.save_share_pct is not None else ""
    lines = [
        f"run {run.run} on {run.machine} ({run.path}): {plural(run.count, 'checkpoint')}, {fmt_bytes(run.disk_bytes)}, "
        f"saves {fmt_secs(run.save_s_total)}{share}"
    ]
    rows = [("STEP", "EPOCH", "LOSS", "EVAL", "SIZE", "SAVE", "KIND", "WRITTEN", "")]
    for c in run.checkpoints:
        kind = c.kind + ("+optim" if c.has_optimizer else "")
        written = fmt_time(c.written_at, "%m-%d %H:%M:%S")
        rows.append(
            (
                str(c.step),
                fmt(c.epoch, ".2f"),
                fmt_loss(c.loss),
                fmt_loss(c.eval_loss),
                fmt_bytes(c.size_bytes),
                fmt(c.save_s, ".2f", "s"),
                kind,
                written,
                marks(c),
            )
        )
    return "\n".join(lines + table(rows))


def prune_human(data: Pruned) -> str:
    lines = [f"pruned run {data.run}: deleted {plural(len(data.deleted), 'checkpoint')}, freed {fmt_bytes(data.freed_bytes)}"]
    lines += [f"  deleted step {c.step}" for c in data.deleted]
    lines += [f"  kept    step {c.step} ({c.reason})" for c in data.kept]
    lines += [f"  skipped step {c.step} ({c.reason})" for c in data.skipped]
    return "\n".join(lines)


def serve_human(data: Served, error: str | None = None) -> str:
    where = f" at {data.endpoint} as {data.served_name or data.model!r}" if data.endpoint else ""
    sim = " (SIM)" if data.simulated else ""
    why = f": {error}" if error else ""
    return f"{data.run} step {data.step}: {data.mode} on model {data.model}, {data.state}{why}{where}{sim}"


def listed_runs(answers: Answers[RunSummaryList]) -> list[RunSummary]:
    """Every agent's runs, a multi-node job's run once (each node's agent sees its folder on shared storage)."""
    runs = [run for reply in answers.replies.values() for run in reply.root]
    return one_row_per_run(runs, lambda x: RunKey(x.machine, x.run, x.job, x.count or 0))


async def locate(ctx: Context, run: str) -> str:
    """The machine holding a run: --machine, else whichever agent knows it (runs are job ids or folder names)."""
    if ctx.args.machine:
        return str(ctx.args.machine)
    answers = Answers.of(await ctx.request_all(CHECKPOINTS_RUNS))
    holders = [x.machine for x in listed_runs(answers) if x.run == run]
    if len(holders) > 1:
        raise RemoteError(ErrorCode.CONFLICT, f"run {run!r} exists on {', '.join(holders)}; pick one with --machine")
    if not holders:
        known = sorted(x.run for reply in answers.replies.values() for x in reply.root)
        hint = f"; offline: {', '.join(answers.errors)}" if answers.errors else ""
        raise RemoteError(
            ErrorCode.NOT_FOUND, f"no run {run!r} (runs: {', '.join(known) or 'none'}{hint}); see `cetlab checkpoints`"
        )
    return holders[0]


async def cmd_checkpoints(ctx: Context) -> int:
    if ctx.args.run is None:
        answers = Answers.of(await ctx.request_all(CHECKPOINTS_RUNS))
        runs = listed_runs(answers)
        ctx.out({"runs": [sent(r) for r in runs], "offline": answers.messages()}, lambda _: runs_human(runs, answers.errors))
        return EXIT_OK if answers.replies else EXIT_FAILED
    machine = await locate(ctx, ctx.args.run)
    run = await request(ctx.client, machine, CHECKPOINTS_LIST, RunParams(run=ctx.args.run))
    ctx.out(sent(run), lambda _: run_human(run))
    return EXIT_OK


async def cmd_resume(ctx: Context) -> int:
    machine = await locate(ctx, ctx.args.run)
    params = ResumeParams(run=ctx.args.run, step=ctx.args.step, params=parse_sets(ctx.args.set))
    job = await request(ctx.client, machine, CHECKPOINTS_RESUME, params)
    ctx.out(sent(job), lambda _: f"resumed {ctx.args.run} from step {ctx.args.step}\n" + job_human(job))
    return EXIT_OK


async def cmd_serve(ctx: Context) -> int:
    machine = await locate(ctx, ctx.args.run)
    params = ServeParams(run=ctx.args.run, step=ctx.args.step, **({"model": ctx.args.model} if ctx.args.model else {}))
    served = await request(ctx.client, machine, CHECKPOINTS_SERVE, params)
    waited, error = False, None
    deadline = time.monotonic() + SERVE_WAIT_S
    while ctx.args.wait and served.state not in (ModelState.WARM, ModelState.FAILED):
        if time.monotonic() > deadline:
            raise RemoteError(ErrorCode.TIMEOUT, f"{served.model} is still {served.state} after {SERVE_WAIT_S:.0f} s")
        await asyncio.sleep(0.5)
        served, error = await serving_state(ctx, machine, served)
        waited = True
    ctx.out({**sent(served), "error": error} if waited else sent(served), lambda _: serve_human(served, error))
    return EXIT_FAILED if served.state == ModelState.FAILED else EXIT_OK


async def serving_state(ctx: Context, machine: str, served: Served) -> tuple[Served, str | None]:
    """The checkpoint's serving state as its run's listing shows it (and why it failed), with the model's endpoint once up."""
    run = await request(ctx.client, machine, CHECKPOINTS_LIST, RunParams(run=served.run))
    serving = next((c.serving for c in run.checkpoints if c.step == served.step), None)
    if serving is not None:
        served = served.model_copy(update={"state": serving.state})
    if served.state == ModelState.WARM:
        model = await request(ctx.client, machine, MODELS_GET, ModelParams(model=served.model))
        served = served.model_copy(update={"endpoint": model.endpoint, "served_name": served.served_name or model.served_name})
    return served, serving.error if serving is not None else None


async def cmd_prune(ctx: Context) -> int:
    machine = await locate(ctx, ctx.args.run)
    pruned = await request(ctx.client, machine, CHECKPOINTS_PRUNE, PruneParams(run=ctx.args.run, keep_last=ctx.args.keep_last))
    ctx.out(sent(pruned), lambda _: prune_human(pruned))
    return EXIT_OK


async def cmd_keep(ctx: Context) -> int:
    machine = await locate(ctx, ctx.args.run)
    ckpt = await request(
        ctx.client, machine, CHECKPOINTS_KEEP, KeepParams(run=ctx.args.run, step=ctx.args.step, kept=not ctx.args.off)
    )
    ctx.out(sent(ckpt), lambda _: f"{ckpt.run} step {ckpt.step}: {'kept' if ckpt.kept else 'not kept'}")
    return EXIT_OK


async def cmd_delete(ctx: Context) -> int:
    machine = await locate(ctx, ctx.args.run)
    params = DeleteParams(run=ctx.args.run, step=ctx.args.step, confirm_special=ctx.args.force)
    deleted = await request(ctx.client, machine, CHECKPOINTS_DELETE, params)
    ctx.out(sent(deleted), lambda _: f"deleted {deleted.run} step {ctx.args.step}, freed {fmt_bytes(deleted.freed_bytes)}")
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def add(name: str, help: str, func: Callable[[Context], Awaitable[int]], step: bool = True) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help)
        p.add_argument(
            "run", nargs="?" if name == "checkpoints" else None, help="a run: its job id (m5-3) or its output folder's name"
        )
        if step:
            p.add_argument("step", type=int, help="the checkpoint's step")
        p.add_argument("--machine", help="the machine holding the run (default: whichever knows it)")
        p.set_defaults(func=func)
        return p

    add(
        "checkpoints",
        "runs with checkpoints; with RUN, its checkpoints (loss, size, save time, best)",
        cmd_checkpoints,
        step=False,
    )
    p = add("resume", "start a new job of the run's recipe from a checkpoint", cmd_resume)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe param, e.g. max_steps=200")
    p = add("serve-checkpoint", "serve a checkpoint: adapter into a warm model, or as a new model", cmd_serve)
    p.add_argument("--model", help="load the adapter into this warm model (or lend its engine and GPUs)")
    p.add_argument("--wait", action="store_true", help="wait until the model answers (or fails)")
    p = add("prune", "delete all checkpoints of a run but the best, the last N and the kept ones", cmd_prune, step=False)
    p.add_argument("--keep-last", type=int, required=True, metavar="N", help="how many of the newest to keep")
    p = add("keep", "mark a checkpoint kept: prune never deletes it", cmd_keep)
    p.add_argument("--off", action="store_true", help="un-keep it")
    p = add("delete-checkpoint", "delete one checkpoint", cmd_delete)
    p.add_argument("--force", action="store_true", help="also when it is the best or the newest")
