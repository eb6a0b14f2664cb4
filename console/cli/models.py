"""`cetlab models`, `warm`, `sleep`, `cold`, `swap`, `cache`, `pin`, `rotate`: the model pool from scripts."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from agents.wire.catalogue.method import Method
from agents.wire.catalogue.models import (
    MODELS_CACHE,
    MODELS_COLD,
    MODELS_GET,
    MODELS_LIST,
    MODELS_PIN,
    MODELS_ROTATE,
    MODELS_ROTATION,
    MODELS_SLEEP,
    MODELS_SWAP,
    MODELS_WARM,
    ModelDetail,
    ModelParams,
    PinParams,
    SwapParams,
)
from agents.wire.engine_address import UNIX_PREFIX
from agents.wire.lab.replicas import machines_of
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.models import ModelInfo, Rotation
from agents.wire.states import ModelState
from agents.wire.vram_fit import GIB, where_fits
from console.cli.main import Context, positive_seconds, say
from console.lab.replicas import grouped
from console.lab.replies import not_reached
from console.lab.rotation import overhead_words
from widgets.format import NA, fmt, fmt_duration, fmt_gib, machines_text

EXIT_OK, EXIT_FAILED = 0, 1
POLL_S = 0.25
STOP_TIMEOUT_S = 30.0  # models.cold waits for the engine to exit (its grace period is 10 s)

# The stable JSON of one model (documented in docs/engines.md); the agent's extra keys stay in `models.get`.
MODEL_KEYS = (
    "name",
    "machine",
    "engine",
    "state",
    "gpus",
    "vram_bytes",
    "cached_fraction",
    "load_s",
    "warmup_s",
    "wake_s",
    "requests_running",
    "endpoint",
    "simulated",
    "vram_gib",  # what it needs on its GPUs altogether (null: unknown), from vram_source
    "vram_source",  # "lab.yaml", "estimated from GGUF header", "estimated from safetensors header" or "unknown"
    "fits",  # where that fits in the lab: "fits on m5 GPU 1-4, irina GPU 0", or the split it needs
)
EXTRA_KEYS = (
    "served_name",
    "requests_waiting",
    "tokens_per_s",
    "tokens_per_s_window_s",
    "kv_cache_pct",
    "ttft_s",
    "swap_s",
    "pinned",
    "progress",
    "error",
    "op",
    "size_bytes",
    "draining",
)


def model_json(model: ModelInfo, fits: str = "") -> dict[str, Any]:
    dumped = model.model_dump(mode="json", include={*MODEL_KEYS, *EXTRA_KEYS})
    dumped["vram_gib"] = None if model.vram_need_bytes is None else round(model.vram_need_bytes / GIB, 2)
    dumped["fits"] = fits
    return {k: dumped[k] for k in (*MODEL_KEYS, *EXTRA_KEYS)}


def replicas_json(ctx: Context, models: list[ModelInfo]) -> dict[str, list[dict[str, Any]]]:
    """Each model with replicas: its placements (machine, GPUs, state, draining, the engine's running and queued)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for entry in ctx.lab.models:
        if entry.replicas:
            out[entry.name] = [
                {
                    "machine": m.machine,
                    "gpus": m.gpus,
                    "state": str(m.state),
                    "draining": m.draining,
                    "requests_running": m.requests_running,
                    "requests_waiting": m.requests_waiting,
                }
                for m in models
                if m.name == entry.name
            ]
    return out


def need_line(m: ModelInfo, fits: str) -> str:
    """One model's VRAM need, where it comes from, and where it fits (or why it is unknown)."""
    if m.vram_need_bytes is None:
        return f"{m.name}: unknown ({m.vram_detail or 'no estimate'})"
    line = f"{m.name}: {fmt_gib(m.vram_need_bytes)} {m.vram_source}"
    return line + (f"; {fits}" if fits else "")


def _secs(value: float | None) -> str:
    return fmt(value, ".1f", "s")


def _pct(fraction: float | None) -> str:
    return fmt(fraction, ".0%")


def state_text(model: ModelInfo) -> str:
    text = str(model.state)
    progress = model.progress
    if progress is not None:
        phase: str = "" if progress.phase == model.state else progress.phase  # not "loading (loading)"
        if progress.total_bytes:
            phase += f" {(progress.done_bytes or 0) / progress.total_bytes:.0%}"
        if phase.strip():
            text += f" ({phase.strip()})"
    if model.draining:
        text += " (draining)"
    return text + (" PINNED" if model.pinned else "")


def models_human(
    models: list[ModelInfo],
    rotations: dict[str, Rotation | None],
    offline: Mapping[str, RemoteError],
    fits: Mapping[str, str] | None = None,
) -> str:
    rows = [("MODEL", "MACHINE", "GPUS", "ENGINE", "STATE", "VRAM", "RUN/WAIT", "TOK/S", "KV", "LOAD", "WARM-UP", "WAKE", "RAM")]
    placed = Counter(m.name for m in models)
    shown: set[str] = set()
    for m in models:
        running = NA if m.requests_running is None else f"{m.requests_running:.0f}/{m.requests_waiting or 0:.0f}"
        # a model with replicas: its name once, with how many, then one row per placement
        name = m.name if placed[m.name] == 1 else (f"  {m.name}" if m.name in shown else f"{m.name} ({placed[m.name]} replicas)")
        shown.add(m.name)
        rows.append(
            (
                name,
                machines_text(m.machine, m.machines),
                ",".join(map(str, m.gpus)) or "cpu",
                m.engine + (" SIM" if m.simulated else ""),
                state_text(m),
                fmt_gib(m.vram_bytes),
                running,
                fmt(m.tokens_per_s),
                fmt(m.kv_cache_pct, ".0f", "%"),
                _secs(m.load_s),
                _secs(m.warmup_s),
                _secs(m.wake_s),
                _pct(m.cached_fraction),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    if len(rows) == 1:
        lines.append("(no models in lab.yaml)")
    windows = sorted({m.tokens_per_s_window_s for m in models if m.tokens_per_s_window_s})
    if windows:
        lines.append(f"TOK/S: generated tokens per second over the last {' or '.join(f'{w:g}' for w in windows)} s")
    if fits is not None and models:
        lines.append("VRAM needed:")
        # a model's replicas need the same: its line once
        lines += list(dict.fromkeys(f"  {need_line(m, fits.get(m.name, ''))}" for m in models))
    lines += [f"{m.name}: {m.error.message}" for m in models if m.error is not None]
    for machine, rotation in rotations.items():
        if rotation is not None and rotation.plan:
            step = (
                f"not rotated yet ({len(rotation.plan)} sets)"
                if rotation.index is None
                else f"step {rotation.index + 1} of {len(rotation.plan)}"
            )
            lines.append(f"{machine}: rotation {step}, {rotation_schedule(rotation, time.time())}")
    lines += not_reached(offline)
    return "\n".join(lines)


def rotation_schedule(rotation: Rotation, now: float) -> str:
    """One machine's rotation clock in human durations: `next in 3h51m, overhead 0.012% of 5h10m (target < 1%)`."""
    when = "not scheduled" if rotation.next_at is None else f"in {fmt_duration(max(0.0, rotation.next_at - now))}"
    return f"next {when}, {overhead_words(rotation)}"


def rotation_human(data: dict[str, Rotation], now: float | None = None, models_on: dict[str, set[str]] | None = None) -> str:
    """What `cetlab rotate` did on each machine: the set it moved to (the machine's own models of it: ``models_on``,
    machine -> its models; None: the whole set), the moves, what is not warm, the next rotation."""
    now = time.time() if now is None else now
    lines = []
    for machine, rotation in data.items():
        sets, last = rotation.plan, rotation.last

        def own(names: list[str]) -> str:
            return ", ".join(n for n in names if models_on is None or n in models_on.get(machine, set())) or (
                f"it has none of {machine}'s models"
            )

        if rotation.running and rotation.index is not None:  # the index moves when a rotation starts
            lines.append(
                f"{machine}: rotating to set {rotation.index + 1} of {len(sets)} "
                f"({own(sets[rotation.index])}); `cetlab models` to watch"
            )
        elif last is None:
            lines.append(f"{machine}: not rotated yet")
        else:
            target = sets[last.index] if 0 <= last.index < len(sets) else []
            lines.append(
                f"{machine}: rotated to set {last.index + 1} of {len(sets)} ({own(target)}) "
                f"in {fmt(last.duration_s, '.1f', ' s')}, {fmt_duration(now - last.t)} ago"
            )
            lines += [f"  swapped {out} out for {incoming}" for out, incoming in last.swaps]
            if last.out:
                lines.append(f"  freed: {', '.join(last.out)}")
            if last.up:
                lines.append(f"  brought up: {', '.join(last.up)}")
            if last.not_warm:
                lines.append(f"  NOT WARM: {', '.join(last.not_warm)}")
            lines += [f"  problem: {problem}" for problem in last.problems]
            if not (last.swaps or last.out or last.up):
                lines.append("  nothing to move: its set was already up")
        if rotation.pinned:
            lines.append(f"  pinned (never rotated out): {', '.join(rotation.pinned)}")
        lines.append(f"  {rotation_schedule(rotation, now)}")
    return "\n".join(lines)


def model_human(m: ModelInfo) -> str:
    where = f"GPU {','.join(map(str, m.gpus))}" if m.gpus else "CPU"
    line = f"{m.name} on {machines_text(m.machine, m.machines)} {where}: {state_text(m)}"
    if m.endpoint and m.state == ModelState.WARM:
        line += f"  {m.endpoint} (model name: {m.served_name or m.name})"
        if not m.endpoint.startswith(UNIX_PREFIX):  # 127.0.0.1 is no boundary on a shared machine
            line += "\n  WARN: its engine listens on 127.0.0.1: any user of that machine can reach it with no key"
    if m.error is not None:
        line += f"\n  error: {m.error.message}"
        line += "".join(f"\n  | {text}" for text in m.error.log_tail[-8:])
    return line


def model_machine(ctx: Context, name: str) -> str:
    """The machine whose placement of the model a verb acts on: --machine for a model with replicas, else its own."""
    chosen: str | None = getattr(ctx.args, "machine", None)
    for model in ctx.lab.models:
        if model.name == name:
            where = machines_of(model)
            if chosen is None:
                if len(where) > 1:
                    raise RemoteError(
                        ErrorCode.INVALID_PARAMS,
                        f"{name} has replicas on {', '.join(where)}: say which with --machine (e.g. --machine {where[0]})",
                    )
                return model.machine
            if chosen not in where:
                raise RemoteError(ErrorCode.NOT_FOUND, f"{name} has no placement on {chosen} (it runs on {', '.join(where)})")
            return chosen
    known = ", ".join(m.name for m in ctx.lab.models) or "none"
    raise RemoteError(ErrorCode.NOT_FOUND, f"no model named {name!r} in {ctx.lab.lab} (models: {known})")


BRINGING_UP = (
    ModelState.LOADING,
    ModelState.WARMING,
)  # the states an operation passes through; every other one is where a model settles


class SettledElsewhere(RemoteError):
    """The model settled in a state other than the one asked for; the message says where and why."""

    def __init__(self, model: ModelDetail, wanted: tuple[ModelState, ...]) -> None:
        super().__init__(
            ErrorCode.CONFLICT, f"{model.name} settled {model.state}, not {' or '.join(wanted)}: {settled_reason(model)}"
        )
        self.model = model


def settled_reason(model: ModelDetail) -> str:
    """Why a model is where it is: its error, else the last move in its history."""
    if model.error is not None:
        return model.error.message
    for event in model.history:
        if event.to_state == model.state:
            when = time.strftime("%H:%M:%S", time.localtime(event.t))
            return f"its last move was {event.event} ({event.from_state} → {event.to_state}) at {when}; `cetlab models` to see it"
    return "`cetlab models` to see it"


async def wait_settled(ctx: Context, name: str, wanted: tuple[ModelState, ...], timeout_s: float) -> ModelDetail:
    """Poll models.get until the model settles; SettledElsewhere when that is not a state in `wanted`.

    A model settles when no operation runs on it and it is not on its way up: a wait for `warm`
    ends as soon as something else (the start plan, a rotation, another operator) put it to sleep.
    Progress lines go to stderr for people.
    """
    machine = model_machine(ctx, name)
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        model = await ctx.request(machine, MODELS_GET, ModelParams(model=name))
        text = state_text(model)
        if text != last and not ctx.args.json:
            say(f"{name}: {text}", err=True, flush=True)
            last = text
        if not model.op and model.state not in BRINGING_UP:
            if model.state in wanted:
                return model
            raise SettledElsewhere(model, wanted)
        if time.monotonic() > deadline:
            raise RemoteError(
                ErrorCode.TIMEOUT, f"{name} is still {model.state} after {timeout_s:.0f} s (it goes on; `cetlab models` to watch)"
            )
        await asyncio.sleep(POLL_S)


async def cmd_models(ctx: Context) -> int:
    machines = sorted({machine for m in ctx.lab.models for machine in machines_of(m)})
    replies = await ctx.request_all(MODELS_LIST, machines=machines)
    models: list[ModelInfo] = []
    rotations: dict[str, Rotation | None] = {}
    offline: dict[str, RemoteError] = {}
    for machine, reply in replies.items():
        if isinstance(reply, RemoteError):
            offline[machine] = reply
            continue
        models += reply.models
        rotations[machine] = reply.rotation
    models = grouped(models)
    gpus = ctx.state.gpu_memory()
    fits = {m.name: where_fits(m.vram_need_bytes, gpus) for m in models}
    data = {
        "lab": ctx.lab.lab,
        "models": [model_json(m, fits[m.name]) for m in models],
        "replicas": replicas_json(ctx, models),
        "rotation": {machine: r.model_dump(mode="json") if r is not None else None for machine, r in rotations.items()},
        "offline": {machine: exc.message for machine, exc in offline.items()},
    }
    ctx.out(data, lambda _: models_human(models, rotations, offline, fits))
    return EXIT_FAILED if offline and not models else EXIT_OK


async def _act(ctx: Context, method: Method[Any, ModelInfo], name: str, until: tuple[ModelState, ...]) -> int:
    machine = model_machine(ctx, name)
    timeout = STOP_TIMEOUT_S if method is MODELS_COLD else None
    model: ModelInfo = await ctx.request(machine, method, ModelParams(model=name), timeout)
    if not ctx.args.no_wait:
        try:
            model = await wait_settled(ctx, name, until, ctx.args.wait_timeout)
        except SettledElsewhere as exc:
            ctx.out(model_json(exc.model) if ctx.args.json else exc.model, model_human)
            say(f"error: {exc.message}", err=True)
            return EXIT_FAILED
    ctx.out(model_json(model) if ctx.args.json else model, model_human)
    return EXIT_FAILED if model.state == ModelState.FAILED else EXIT_OK


async def cmd_warm(ctx: Context) -> int:
    return await _act(ctx, MODELS_WARM, ctx.args.model, (ModelState.WARM,))


async def cmd_sleep(ctx: Context) -> int:
    return await _act(ctx, MODELS_SLEEP, ctx.args.model, (ModelState.SLEEPING,))


async def cmd_cold(ctx: Context) -> int:
    return await _act(ctx, MODELS_COLD, ctx.args.model, (ModelState.COLD, ModelState.CACHED))


async def cmd_cache(ctx: Context) -> int:
    return await _act(
        ctx, MODELS_CACHE, ctx.args.model, (ModelState.COLD, ModelState.CACHED, ModelState.WARM, ModelState.SLEEPING)
    )


def pin_human(m: ModelInfo) -> str:
    """What `cetlab pin` changed, then where the model stands."""
    said = "pinned: rotation never takes it out" if m.pinned else "unpinned: rotation may take it out"
    return f"{m.name} {said}\n{model_human(m)}"


async def cmd_pin(ctx: Context) -> int:
    machine = model_machine(ctx, ctx.args.model)
    model = await ctx.request(machine, MODELS_PIN, PinParams(model=ctx.args.model, pinned=not ctx.args.unpin))
    ctx.out(model_json(model), lambda _: pin_human(model))
    return EXIT_OK


async def cmd_swap(ctx: Context) -> int:
    out, incoming = ctx.args.out, ctx.args.incoming
    machine, in_machine = model_machine(ctx, out), model_machine(ctx, incoming)
    if machine != in_machine:
        raise RemoteError(
            ErrorCode.CONFLICT,
            f"{out} runs on {machine} and {incoming} on {in_machine}: a swap shares GPUs on one "
            f"machine; use `cetlab sleep {out}` and `cetlab warm {incoming}`",
        )
    started = time.monotonic()
    await ctx.request(machine, MODELS_SWAP, SwapParams.model_validate({"out": out, "in": incoming}))
    result: dict[str, ModelDetail] = {}
    problems = []
    if not ctx.args.no_wait:
        for key, name, wanted in (
            ("in", incoming, (ModelState.WARM,)),
            ("out", out, (ModelState.SLEEPING, ModelState.COLD, ModelState.CACHED)),
        ):
            try:
                result[key] = await wait_settled(ctx, name, wanted, ctx.args.wait_timeout)
            except SettledElsewhere as exc:
                result[key] = exc.model
                problems.append(exc.message)
    else:
        result = {k: await ctx.request(machine, MODELS_GET, ModelParams(model=n)) for k, n in (("out", out), ("in", incoming))}
    elapsed_s = round(time.monotonic() - started, 3)
    data = {"out": model_json(result["out"]), "in": model_json(result["in"]), "elapsed_s": elapsed_s}
    ctx.out(data, lambda _: f"{model_human(result['out'])}\n{model_human(result['in'])}\nswap took {elapsed_s:.1f} s")
    for problem in problems:
        say(f"error: {problem}", err=True)
    return EXIT_FAILED if problems or result["in"].state == ModelState.FAILED else EXIT_OK


async def cmd_rotate(ctx: Context) -> int:
    machines = sorted({machine for m in ctx.lab.models for machine in machines_of(m)})
    if not ctx.lab.orchestra.rotation:
        raise RemoteError(ErrorCode.UNAVAILABLE, "lab.yaml has no orchestra.rotation plan")
    results = {m: await ctx.request(m, MODELS_ROTATE) for m in machines}
    if not ctx.args.no_wait:
        deadline = time.monotonic() + ctx.args.wait_timeout
        while any(r.running for r in results.values()) and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            results = {m: await ctx.request(m, MODELS_ROTATION) for m in machines}
    models_on: dict[str, set[str]] = {}
    for model in ctx.lab.models:
        for machine in machines_of(model):
            models_on.setdefault(machine, set()).add(model.name)
    ctx.out({m: r.model_dump(mode="json") for m, r in results.items()}, lambda _: rotation_human(results, models_on=models_on))
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def waiting(p: argparse.ArgumentParser) -> None:
        p.add_argument("--no-wait", action="store_true", help="return at once with the new state")
        p.add_argument(
            "--wait-timeout", type=positive_seconds, default=1800.0, help="seconds to wait for the final state (default 1800)"
        )

    def placement(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--machine",
            metavar="NAME",
            help="the replica on this machine (needed for a model with replicas: lab.yaml's replicas)",
        )

    p = sub.add_parser("models", help="the model pool: state, load / warm-up / wake times, RAM cache")
    p.set_defaults(func=cmd_models)
    for verb, func, text in (
        ("warm", cmd_warm, "bring a model up (or wake it) and wait until it answers"),
        ("sleep", cmd_sleep, "put a warm model to sleep: GPU freed, wakes in seconds"),
        ("cold", cmd_cold, "stop a model's engine"),
        ("cache", cmd_cache, "pre-read a model's files into RAM (page cache)"),
    ):
        p = sub.add_parser(verb, help=text)
        p.add_argument("model")
        placement(p)
        waiting(p)
        p.set_defaults(func=func)
    p = sub.add_parser("swap", help="free OUT's GPUs (sleep or stop) and bring IN up there")
    p.add_argument("out")
    p.add_argument("incoming", metavar="in")
    placement(p)
    waiting(p)
    p.set_defaults(func=cmd_swap)
    p = sub.add_parser("pin", help="pin a model: rotation never takes it out (--unpin to undo)")
    p.add_argument("model")
    placement(p)
    p.add_argument("--unpin", action="store_true")
    p.set_defaults(func=cmd_pin)
    p = sub.add_parser("rotate", help="run the next step of the orchestra's rotation plan now")
    waiting(p)
    p.set_defaults(func=cmd_rotate)
