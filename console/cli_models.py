"""`cetlab models`, `warm`, `sleep`, `cold`, `swap`, `cache`, `pin`, `rotate`: the model pool from scripts."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from agents.protocol import ErrorCode, RemoteError
from console.cli import positive_seconds
from widgets.format import NA, fmt, fmt_duration, fmt_gib

EXIT_OK, EXIT_FAILED = 0, 1
POLL_S = 0.25
STOP_TIMEOUT_S = 30.0  # models.cold waits for the engine to exit (its grace period is 10 s)

# The stable JSON of one model (documented in the README); the agent's extra keys stay in `models.get`.
MODEL_KEYS = ("name", "machine", "engine", "state", "gpus", "vram_bytes", "cached_fraction", "load_s", "warmup_s",
              "wake_s", "requests_running", "endpoint", "simulated")
EXTRA_KEYS = ("served_name", "requests_waiting", "tokens_per_s", "tokens_per_s_window_s", "kv_cache_pct", "ttft_s", "swap_s", "pinned", "progress", "error", "op", "size_bytes")


def model_json(model: dict[str, Any]) -> dict[str, Any]:
    return {k: model.get(k) for k in (*MODEL_KEYS, *EXTRA_KEYS)}


def _secs(value: float | None) -> str:
    return fmt(value, ".1f", "s")


def _pct(fraction: float | None) -> str:
    return fmt(fraction, ".0%")


def state_text(model: dict[str, Any]) -> str:
    text = model["state"]
    progress = model.get("progress")
    if progress:
        phase = "" if progress.get("phase") == model["state"] else progress.get("phase", "")  # not "loading (loading)"
        if progress.get("total_bytes"):
            phase += f" {progress['done_bytes'] / progress['total_bytes']:.0%}"
        if phase.strip():
            text += f" ({phase.strip()})"
    return text + (" PINNED" if model.get("pinned") else "")


def models_human(data: dict[str, Any]) -> str:
    rows = [("MODEL", "MACHINE", "GPUS", "ENGINE", "STATE", "VRAM", "RUN/WAIT", "TOK/S", "KV", "LOAD", "WARM-UP", "WAKE", "RAM")]
    for m in data["models"]:
        running = NA if m.get("requests_running") is None else f"{m['requests_running']:.0f}/{m.get('requests_waiting') or 0:.0f}"
        rows.append((
            m["name"], m["machine"], ",".join(map(str, m["gpus"])) or "cpu", m["engine"] + (" SIM" if m["simulated"] else ""),
            state_text(m), fmt_gib(m["vram_bytes"]), running,
            fmt(m.get("tokens_per_s")), fmt(m.get("kv_cache_pct"), ".0f", "%"),
            _secs(m["load_s"]), _secs(m["warmup_s"]), _secs(m["wake_s"]), _pct(m["cached_fraction"]),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    if len(rows) == 1:
        lines.append("(no models in lab.yaml)")
    windows = sorted({m["tokens_per_s_window_s"] for m in data["models"] if m.get("tokens_per_s_window_s")})
    if windows:
        lines.append(f"TOK/S: generated tokens per second over the last {' or '.join(f'{w:g}' for w in windows)} s")
    for m in data["models"]:
        if m.get("error"):
            lines.append(f"{m['name']}: {m['error']['message']}")
    for machine, rotation in data.get("rotation", {}).items():
        if rotation and rotation.get("plan"):
            step = f"not rotated yet ({len(rotation['plan'])} sets)" if rotation["index"] is None else f"step {rotation['index'] + 1} of {len(rotation['plan'])}"
            lines.append(f"{machine}: rotation {step}, {rotation_schedule(rotation, time.time())}")
    lines += [f"{name}: OFFLINE {error}" for name, error in data.get("offline", {}).items()]
    return "\n".join(lines)


def rotation_schedule(rotation: dict[str, Any], now: float) -> str:
    """One machine's rotation clock in human durations: `next in 3h51m, overhead 0.012% (target < 1%)`."""
    when = "not scheduled" if rotation.get("next_at") is None else f"in {fmt_duration(max(0.0, rotation['next_at'] - now))}"
    return f"next {when}, overhead {rotation['overhead_pct']:.3f}% (target < {rotation['target_pct']}%)"


def rotation_human(data: dict[str, dict[str, Any]], now: float | None = None, models_on: dict[str, set[str]] | None = None) -> str:
    """What `cetlab rotate` did on each machine: the set it moved to (the machine's own models of it: ``models_on``,
    machine -> its models; None: the whole set), the moves, what is not warm, the next rotation."""
    now = time.time() if now is None else now
    lines = []
    for machine, rotation in data.items():
        sets, last = rotation.get("plan") or [], rotation.get("last")
        def own(names: list[str]) -> str:
            return ", ".join(n for n in names if models_on is None or n in models_on.get(machine, set())) or "none of its models"

        if rotation.get("running") and rotation.get("index") is not None:  # the index moves when a rotation starts
            lines.append(f"{machine}: rotating to set {rotation['index'] + 1} of {len(sets)} "
                         f"({own(sets[rotation['index']])}); `cetlab models` to watch")
        elif last is None:
            lines.append(f"{machine}: not rotated yet")
        else:
            target = sets[last["index"]] if 0 <= last["index"] < len(sets) else []
            lines.append(f"{machine}: rotated to set {last['index'] + 1} of {len(sets)} ({own(target)}) "
                         f"in {last['duration_s']:.1f} s, {fmt_duration(now - last['t'])} ago")
            lines += [f"  swapped {out} out for {incoming}" for out, incoming in last.get("swaps") or []]
            if last.get("out"):
                lines.append(f"  freed: {', '.join(last['out'])}")
            if last.get("up"):
                lines.append(f"  brought up: {', '.join(last['up'])}")
            if last.get("not_warm"):
                lines.append(f"  NOT WARM: {', '.join(last['not_warm'])}")
            lines += [f"  problem: {problem}" for problem in last.get("problems") or []]
            if not (last.get("swaps") or last.get("out") or last.get("up")):
                lines.append("  nothing to move: its set was already up")
        if rotation.get("pinned"):
            lines.append(f"  pinned (never rotated out): {', '.join(rotation['pinned'])}")
        lines.append(f"  {rotation_schedule(rotation, now)}")
    return "\n".join(lines)


def model_human(m: dict[str, Any]) -> str:
    line = f"{m['name']} on {m['machine']} GPU {','.join(map(str, m['gpus'])) or 'cpu'}: {state_text(m)}"
    if m.get("endpoint") and m["state"] == "warm":
        line += f"  {m['endpoint']} (model name: {m.get('served_name') or m['name']})"
    if m.get("error"):
        line += f"\n  error: {m['error']['message']}"
        line += "".join(f"\n  | {text}" for text in (m["error"].get("log_tail") or [])[-8:])
    return line


def model_machine(ctx, name: str) -> str:
    for model in ctx.lab.models:
        if model.name == name:
            return model.machine
    known = ", ".join(m.name for m in ctx.lab.models) or "none"
    raise RemoteError(ErrorCode.NOT_FOUND, f"no model named {name!r} in {ctx.lab.lab} (models: {known})")


BRINGING_UP = ("loading", "warming")  # the states an operation passes through; every other one is where a model settles


class SettledElsewhere(RemoteError):
    """The model settled in a state other than the one asked for; the message says where and why."""

    def __init__(self, model: dict[str, Any], wanted: tuple[str, ...]) -> None:
        super().__init__(ErrorCode.CONFLICT, f"{model['name']} settled {model['state']}, not {' or '.join(wanted)}: {settled_reason(model)}")
        self.model = model


def settled_reason(model: dict[str, Any]) -> str:
    """Why a model is where it is: its error, else the last move in its history."""
    if model.get("error"):
        return model["error"]["message"]
    for event in model.get("history") or []:
        if event.get("to_state") == model["state"]:
            when = time.strftime("%H:%M:%S", time.localtime(event["t"]))
            return f"its last move was {event['event']} ({event['from_state']} → {event['to_state']}) at {when}; `cetlab models` to see it"
    return "`cetlab models` to see it"


async def wait_settled(ctx, name: str, wanted: tuple[str, ...], timeout_s: float) -> dict[str, Any]:
    """Poll models.get until the model settles; SettledElsewhere when that is not a state in `wanted`.

    A model settles when no operation runs on it and it is not on its way up: a wait for `warm`
    ends as soon as something else (the start plan, a rotation, another operator) put it to sleep.
    Progress lines go to stderr for people.
    """
    machine = model_machine(ctx, name)
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        model = await ctx.call(machine, "models.get", {"model": name})
        text = state_text(model)
        if text != last and not ctx.args.json:
            print(f"{name}: {text}", file=sys.stderr, flush=True)
            last = text
        if not model.get("op") and model["state"] not in BRINGING_UP:
            if model["state"] in wanted:
                return model
            raise SettledElsewhere(model, wanted)
        if time.monotonic() > deadline:
            raise RemoteError(ErrorCode.TIMEOUT, f"{name} is still {model['state']} after {timeout_s:.0f} s (it goes on; `cetlab models` to watch)")
        await asyncio.sleep(POLL_S)


async def cmd_models(ctx) -> int:
    machines = sorted({m.machine for m in ctx.lab.models})
    results = await asyncio.gather(*(ctx.call(m, "models.list") for m in machines), return_exceptions=True)
    data: dict[str, Any] = {"lab": ctx.lab.lab, "models": [], "rotation": {}, "offline": {}}
    for machine, result in zip(machines, results):
        if isinstance(result, RemoteError):
            data["offline"][machine] = result.message
            continue
        if isinstance(result, BaseException):
            raise result
        data["models"] += [model_json(m) for m in result["models"]]
        data["rotation"][machine] = result["rotation"]
    ctx.out(data, models_human)
    return EXIT_FAILED if data["offline"] and not data["models"] else EXIT_OK


async def _act(ctx, method: str, name: str, until: tuple[str, ...], params: dict | None = None) -> int:
    machine = model_machine(ctx, name)
    timeout = STOP_TIMEOUT_S if method == "models.cold" else None
    model = await ctx.call(machine, method, params or {"model": name}, timeout)
    if not ctx.args.no_wait:
        try:
            model = await wait_settled(ctx, name, until, ctx.args.wait_timeout)
        except SettledElsewhere as exc:
            ctx.out(model_json(exc.model) if ctx.args.json else exc.model, model_human)
            print(f"error: {exc.message}", file=sys.stderr)
            return EXIT_FAILED
    ctx.out(model_json(model) if ctx.args.json else model, model_human)
    return EXIT_FAILED if model["state"] == "failed" else EXIT_OK


async def cmd_warm(ctx) -> int:
    return await _act(ctx, "models.warm", ctx.args.model, ("warm",))


async def cmd_sleep(ctx) -> int:
    return await _act(ctx, "models.sleep", ctx.args.model, ("sleeping",))


async def cmd_cold(ctx) -> int:
    return await _act(ctx, "models.cold", ctx.args.model, ("cold", "cached"))


async def cmd_cache(ctx) -> int:
    return await _act(ctx, "models.cache", ctx.args.model, ("cold", "cached", "warm", "sleeping"))


def pin_human(m: dict[str, Any]) -> str:
    """What `cetlab pin` changed, then where the model stands."""
    said = "pinned: rotation never takes it out" if m.get("pinned") else "unpinned: rotation may take it out"
    return f"{m['name']} {said}\n{model_human(m)}"


async def cmd_pin(ctx) -> int:
    machine = model_machine(ctx, ctx.args.model)
    model = await ctx.call(machine, "models.pin", {"model": ctx.args.model, "pinned": not ctx.args.unpin})
    ctx.out(model_json(model), pin_human)
    return EXIT_OK


async def cmd_swap(ctx) -> int:
    out, incoming = ctx.args.out, ctx.args.incoming
    machine, in_machine = model_machine(ctx, out), model_machine(ctx, incoming)
    if machine != in_machine:
        raise RemoteError(ErrorCode.CONFLICT, f"{out} runs on {machine} and {incoming} on {in_machine}: a swap shares GPUs on one "
                          f"machine; use `cetlab sleep {out}` and `cetlab warm {incoming}`")
    started = time.monotonic()
    await ctx.call(machine, "models.swap", {"out": out, "in": incoming})
    result, problems = {}, []
    if not ctx.args.no_wait:
        for key, name, wanted in (("in", incoming, ("warm",)), ("out", out, ("sleeping", "cold", "cached"))):
            try:
                result[key] = await wait_settled(ctx, name, wanted, ctx.args.wait_timeout)
            except SettledElsewhere as exc:
                result[key] = exc.model
                problems.append(exc.message)
    else:
        result = {k: await ctx.call(machine, "models.get", {"model": n}) for k, n in (("out", out), ("in", incoming))}
    data = {"out": model_json(result["out"]), "in": model_json(result["in"]), "elapsed_s": round(time.monotonic() - started, 3)}
    ctx.out(data, lambda d: f"{model_human(d['out'])}\n{model_human(d['in'])}\nswap took {d['elapsed_s']:.1f} s")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return EXIT_FAILED if problems or data["in"]["state"] == "failed" else EXIT_OK


async def cmd_rotate(ctx) -> int:
    machines = sorted({m.machine for m in ctx.lab.models})
    if not ctx.lab.orchestra.rotation:
        raise RemoteError(ErrorCode.UNAVAILABLE, "lab.yaml has no orchestra.rotation plan")
    results = {m: await ctx.call(m, "models.rotate") for m in machines}
    if not ctx.args.no_wait:
        deadline = time.monotonic() + ctx.args.wait_timeout
        while any(r["running"] for r in results.values()) and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            results = {m: await ctx.call(m, "models.rotation") for m in machines}
    models_on: dict[str, set[str]] = {}
    for model in ctx.lab.models:
        models_on.setdefault(model.machine, set()).add(model.name)
    ctx.out(results, lambda data: rotation_human(data, models_on=models_on))
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    def waiting(p: argparse.ArgumentParser) -> None:
        p.add_argument("--no-wait", action="store_true", help="return at once with the new state")
        p.add_argument("--wait-timeout", type=positive_seconds, default=1800.0, help="seconds to wait for the final state (default 1800)")

    p = sub.add_parser("models", help="the model pool: state, load / warm-up / wake times, RAM cache")
    p.set_defaults(func=cmd_models)
    for verb, func, text in (("warm", cmd_warm, "bring a model up (or wake it) and wait until it answers"),
                             ("sleep", cmd_sleep, "put a warm model to sleep: GPU freed, wakes in seconds"),
                             ("cold", cmd_cold, "stop a model's engine"),
                             ("cache", cmd_cache, "pre-read a model's files into RAM (page cache)")):
        p = sub.add_parser(verb, help=text)
        p.add_argument("model")
        waiting(p)
        p.set_defaults(func=func)
    p = sub.add_parser("swap", help="free OUT's GPUs (sleep or stop) and bring IN up there")
    p.add_argument("out")
    p.add_argument("incoming", metavar="in")
    waiting(p)
    p.set_defaults(func=cmd_swap)
    p = sub.add_parser("pin", help="pin a model: rotation never takes it out (--unpin to undo)")
    p.add_argument("model")
    p.add_argument("--unpin", action="store_true")
    p.set_defaults(func=cmd_pin)
    p = sub.add_parser("rotate", help="run the next step of the orchestra's rotation plan now")
    waiting(p)
    p.set_defaults(func=cmd_rotate)
