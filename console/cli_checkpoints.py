"""`cetlab checkpoints`, `resume`, `serve-checkpoint`, `prune`, `keep`, `delete-checkpoint`: checkpoints from scripts."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any, Sequence

from agents.protocol import ErrorCode, RemoteError
from agents.sections import CheckpointInfo
from agents.served import is_served, serve_failed
from console.cli_jobs import job_human, parse_sets
from console.runs import RunKey, one_row_per_run
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


def runs_human(data: dict[str, Any]) -> str:
    rows = [("RUN", "MACHINE", "JOB", "CKPTS", "NEWEST", "BEST", "BEST LOSS", "DISK", "SAVE TIME", "PATH")]
    for run in data["runs"]:
        share = f" ({run['save_share_pct']:.1f}%)" if run.get("save_share_pct") is not None else ""
        rows.append((run["run"], run["machine"], run.get("job_state") or NA,
                     f"{run['count']}" + (f"+{run['incomplete']}?" if run["incomplete"] else ""),
                     fmt(run["newest_step"], "d"),
                     fmt(run["best_step"], "d"), fmt_loss(run.get("best_loss")),
                     fmt_bytes(run["disk_bytes"]), fmt_secs(run.get("save_s_total")) + share, run["path"]))
    lines = table(rows) if len(rows) > 1 else ["(no checkpoints found)"]
    return "\n".join(lines + [f"{name}: OFFLINE {error}" for name, error in data["offline"].items()])


def run_human(run: dict[str, Any]) -> str:
    share = f", {run['save_share_pct']:.2f}% of {fmt_duration(run['wall_s'])} wall time" if run.get("save_share_pct") is not None else ""
    lines = [f"run {run['run']} on {run['machine']} ({run['path']}): {plural(run['count'], 'checkpoint')}, {fmt_bytes(run['disk_bytes'])}, "
             f"saves {fmt_secs(run.get('save_s_total'))}{share}"]
    rows = [("STEP", "EPOCH", "LOSS", "EVAL", "SIZE", "SAVE", "KIND", "WRITTEN", "")]
    for c in (CheckpointInfo.model_validate(c) for c in run["checkpoints"]):
        kind = c.kind + ("+optim" if c.has_optimizer else "")
        written = fmt_time(c.written_at, "%m-%d %H:%M:%S")
        rows.append((str(c.step), fmt(c.epoch, ".2f"), fmt_loss(c.loss), fmt_loss(c.eval_loss), fmt_bytes(c.size_bytes),
                     fmt(c.save_s, ".2f", "s"), kind, written, marks(c)))
    return "\n".join(lines + table(rows))


def prune_human(data: dict[str, Any]) -> str:
    lines = [f"pruned run {data['run']}: deleted {plural(len(data['deleted']), 'checkpoint')}, freed {fmt_bytes(data['freed_bytes'])}"]
    lines += [f"  deleted step {c['step']}" for c in data["deleted"]]
    lines += [f"  kept    step {c['step']} ({c['reason']})" for c in data["kept"]]
    lines += [f"  skipped step {c['step']} ({c['reason']})" for c in data["skipped"]]
    return "\n".join(lines)


def serve_human(data: dict[str, Any]) -> str:
    where = f" at {data['endpoint']} as {data.get('served_name') or data['model']!r}" if data.get("endpoint") else ""
    sim = " (SIM)" if data.get("simulated") else ""
    error = f": {data['error']}" if data.get("error") else ""
    return f"{data['run']} step {data['step']}: {data['mode']} on model {data['model']}, {data['state']}{error}{where}{sim}"


def listed_runs(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every agent's runs, a multi-node job's run once (each node's agent sees its folder on shared storage)."""
    runs = [run for r in results.values() if isinstance(r, list) for run in r]
    return one_row_per_run(runs, lambda x: RunKey(x["machine"], x["run"], x.get("job"), x.get("count") or 0))


async def locate(ctx, run: str) -> str:
    """The machine holding a run: --machine, else whichever agent knows it (runs are job ids or folder names)."""
    if ctx.args.machine:
        return ctx.args.machine
    results = await ctx.client.call_all("checkpoints.runs")
    holders = [x["machine"] for x in listed_runs(results) if x["run"] == run]
    if len(holders) > 1:
        raise RemoteError(ErrorCode.CONFLICT, f"run {run!r} exists on {', '.join(holders)}; pick one with --machine")
    if not holders:
        known = sorted(x["run"] for r in results.values() if isinstance(r, list) for x in r)
        offline = [n for n, r in results.items() if not isinstance(r, list)]
        hint = f"; offline: {', '.join(offline)}" if offline else ""
        raise RemoteError(ErrorCode.NOT_FOUND, f"no run {run!r} (runs: {', '.join(known) or 'none'}{hint}); see `cetlab checkpoints`")
    return holders[0]


async def cmd_checkpoints(ctx) -> int:
    if ctx.args.run is None:
        results = await ctx.client.call_all("checkpoints.runs")
        runs = listed_runs(results)
        offline = {n: str(r.message if isinstance(r, RemoteError) else r) for n, r in results.items() if not isinstance(r, list)}
        ctx.out({"runs": runs, "offline": offline}, runs_human)
        return EXIT_OK if len(offline) < len(results) else EXIT_FAILED
    machine = await locate(ctx, ctx.args.run)
    ctx.out(await ctx.call(machine, "checkpoints.list", {"run": ctx.args.run}), run_human)
    return EXIT_OK


async def cmd_resume(ctx) -> int:
    machine = await locate(ctx, ctx.args.run)
    params = {"run": ctx.args.run, "step": ctx.args.step, "params": parse_sets(ctx.args.set)}
    job = await ctx.call(machine, "checkpoints.resume", params)
    ctx.out(job, lambda j: f"resumed {ctx.args.run} from step {ctx.args.step}\n" + job_human(j))
    return EXIT_OK


async def cmd_serve(ctx) -> int:
    machine = await locate(ctx, ctx.args.run)
    params: dict[str, Any] = {"run": ctx.args.run, "step": ctx.args.step}
    if ctx.args.model:
        params["model"] = ctx.args.model
    data = await ctx.call(machine, "checkpoints.serve", params)
    deadline = time.monotonic() + SERVE_WAIT_S
    while ctx.args.wait and data["state"] not in ("warm", "failed"):
        if time.monotonic() > deadline:
            raise RemoteError(ErrorCode.TIMEOUT, f"{data['model']} is still {data['state']} after {SERVE_WAIT_S:.0f} s")
        await asyncio.sleep(0.5)
        data = await serving_state(ctx, machine, data)
    ctx.out(data, serve_human)
    return EXIT_FAILED if data["state"] == "failed" else EXIT_OK


async def serving_state(ctx, machine: str, data: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's serving state as its run's listing shows it, with the model's endpoint once up."""
    run = await ctx.call(machine, "checkpoints.list", {"run": data["run"]})
    ckpt = next((c for c in run["checkpoints"] if c["step"] == data["step"]), None)
    serving = (ckpt or {}).get("serving") or {}
    data = {**data, "state": serving.get("state", data["state"]), "error": serving.get("error")}
    if data["state"] == "warm":
        model = await ctx.call(machine, "models.get", {"model": data["model"]})
        data.update(endpoint=model["endpoint"], served_name=data.get("served_name") or model["served_name"])
    return data


async def cmd_prune(ctx) -> int:
    machine = await locate(ctx, ctx.args.run)
    ctx.out(await ctx.call(machine, "checkpoints.prune", {"run": ctx.args.run, "keep_last": ctx.args.keep_last}), prune_human)
    return EXIT_OK


async def cmd_keep(ctx) -> int:
    machine = await locate(ctx, ctx.args.run)
    ckpt = await ctx.call(machine, "checkpoints.keep", {"run": ctx.args.run, "step": ctx.args.step, "kept": not ctx.args.off})
    ctx.out(ckpt, lambda c: f"{c['run']} step {c['step']}: {'kept' if c['kept'] else 'not kept'}")
    return EXIT_OK


async def cmd_delete(ctx) -> int:
    machine = await locate(ctx, ctx.args.run)
    data = await ctx.call(machine, "checkpoints.delete", {"run": ctx.args.run, "step": ctx.args.step, "confirm_special": ctx.args.force})
    ctx.out(data, lambda d: f"deleted {d['run']} step {ctx.args.step}, freed {fmt_bytes(d['freed_bytes'])}")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    def add(name: str, help: str, func, step: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument("run", **({"nargs": "?"} if name == "checkpoints" else {}), help="a run: its job id (m5-3) or its output folder's name")
        if step:
            p.add_argument("step", type=int, help="the checkpoint's step")
        p.add_argument("--machine", help="the machine holding the run (default: whichever knows it)")
        p.set_defaults(func=func)
        return p

    add("checkpoints", "runs with checkpoints; with RUN, its checkpoints (loss, size, save time, best)", cmd_checkpoints, step=False)
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
