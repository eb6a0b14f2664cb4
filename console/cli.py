"""`cetlab`: the console's operations as a scriptable CLI (`--json` for machines).

Exit codes: 0 done (for `status`: the lab loaded, whatever the machines say); 1 the
operation failed (the agent answered with an error, or no machine could be reached
for it); 2 bad usage or an invalid lab.yaml (`lab check` too); 130 interrupted; 141
the reader of its output left (agents/wire/entry.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from agents.wire.catalogue.method import Method, params_error, request, request_all
from agents.wire.catalogue.verbs import lacking_said
from agents.wire.lab.model import Lab, LabError, load_lab
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.states import ModelState
from agents.wire.words import plural
from console import openssh
from console.client import FleetClient
from console.state import LabState
from widgets.format import fmt, fmt_bytes
from widgets.terminal import log_visibly, visible

P = TypeVar("P", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# a GPU in `cetlab --json status` (documented in docs/cli.md)
STATUS_GPU_KEYS = {
    "index",
    "name",
    "util_pct",
    "mem_used_bytes",
    "mem_total_bytes",
    "temp_c",
    "power_w",
    "power_limit_w",
    "failed",
    "simulated",
    "compute_capability",
}

# Verb modules: each has register(subparsers) adding parsers whose `func(ctx)` is async.
VERB_MODULES: list[str] = [
    "console.cli_costs",
    "console.cli_jobs",
    "console.cli_models",
    "console.cli_checkpoints",
    "console.cli_audit",
    "console.cli_gateway",
    "console.cli_sim",
    "console.cli_lab",
    "console.cli_machine",
]


class Context:
    """What a verb gets: the parsed args, the lab, a connected FleetClient, output helpers."""

    def __init__(self, args: argparse.Namespace, lab: Lab, client: FleetClient) -> None:
        self.args, self.lab, self.client = args, lab, client

    @property
    def state(self) -> LabState:
        return self.client.state

    def out(self, data: Any, human: Callable[[Any], str]) -> None:
        if self.args.json:
            print(json.dumps(data, indent=2, default=str))  # JSON escapes every control character itself
        else:
            say(human(data))

    async def call(self, machine: str, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        return await self.client.call(machine, method, params, timeout)

    async def request(self, machine: str, method: Method[P, R], params: P | None = None, timeout: float | None = None) -> R:
        """The method's typed reply (agents/wire/catalogue/); RemoteError, or ReplyInvalid naming the field that did not validate."""
        return await request(self.client, machine, method, params, timeout)

    async def request_all(
        self, method: Method[P, R], params: P | None = None, machines: list[str] | None = None, timeout: float | None = None
    ) -> dict[str, R | RemoteError]:
        """Every machine's typed reply (or the RemoteError it gave: offline, refused, a reply that did not validate)."""
        return await request_all(
            self.client, list(self.state.machines) if machines is None else machines, method, params, timeout
        )


def say(text: str, *, err: bool = False, flush: bool = False) -> None:
    """The CLI's human output: every line of it holds text an agent sent (names, messages, log lines), so its control
    characters (ESC, BEL, CR, C1, DEL) and bidi overrides are printed visible, never interpreted by the terminal."""
    print(visible(text), file=sys.stderr if err else sys.stdout, flush=flush)


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above zero (0 or less would give up before connecting)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} s: must be more than 0")
    return value


def find_lab(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    if os.environ.get("CETLAB_LAB"):
        return Path(os.environ["CETLAB_LAB"])
    return Path("lab.yaml")


# ---------------------------------------------------------------------------- formatting


def status_json(state: LabState) -> dict[str, Any]:
    now = time.time()
    machines = []
    for view in state.machines.values():
        age_s = view.age_s(now)
        entry: dict[str, Any] = {
            "name": view.name,
            "online": view.online,
            "simulated": view.simulated,
            "age_s": None if age_s is None else round(age_s, 3),
            "cpu_pct": view.host.cpu_pct,
            "ram_used_bytes": view.host.ram_used_bytes,
            "ram_total_bytes": view.host.ram_total_bytes,
            "disk_used_bytes": view.host.disk_used_bytes,
            "disk_total_bytes": view.host.disk_total_bytes,
            "gpu_status": view.gpu_status.status if view.gpu_status else None,
            "gpus": [g.model_dump(include=STATUS_GPU_KEYS) for g in sorted(view.gpus.values(), key=lambda g: g.index)],
        }
        # sections whose component fails on the agent now: their figures elsewhere are the last ones before it failed
        entry["sections_failed"] = [f.to_wire() for f in view.section_faults()]  # and those refused here as sent
        if (
            view.gpu_support is not None
        ):  # which stacks each GPU can run, with the reason and the fix (docs/engines.md, "Older GPUs")
            entry["gpu_support"] = view.gpu_support.to_wire()
        entry["lab_version"] = view.lab_version  # the lab.yaml it runs (None: unknown, an older agent)
        entry["lab_differs"] = view.lab_differs(state.lab_version)  # not the workstation's: `cetlab lab push`
        if view.lab is not None and view.lab.restart_pending:
            entry["lab_restart_pending"] = view.lab.restart_pending
        if not view.online:
            entry["error"] = view.error or view.link
            entry["last_seen"] = view.last_seen
        entry["agent_version"] = view.agent_version  # and what this console can do that it cannot: `cetlab lab upgrade`
        entry["lacks"] = view.lacking()
        machines.append(entry)
    return {
        "lab": state.lab.lab,
        "lab_version": state.lab_version,
        "gateway": gateway_status(state),
        "models": models_status(state),
        "machines": machines,
    }


def gateway_status(state: LabState) -> dict[str, Any] | None:
    """Where lab.yaml puts the gateway and whether it serves there now (None: the lab has no gateway)."""
    config = state.lab.gateway
    if config is None:
        return None
    view = state.machines.get(config.machine)
    section = view.gateway if view is not None and view.online else None
    up = section is not None and section.url is not None and section.error is None
    if view is None or not view.online:
        error: str | None = f"{config.machine} is offline"
    elif section is None:
        error = f"{config.machine}'s agent serves no gateway (is its lab.yaml the workstation's? `cetlab lab push`)"
    else:
        error = None if up else section.error or "not listening yet"
    return {
        "machine": config.machine,
        "listen": f"{config.host}:{config.port}",
        "url": section.url if section is not None and section.url else config.url,
        "up": up,
        "error": error,
    }


# serving first, then on the way up, resting, and what needs a look
STATUS_MODEL_ORDER = [
    ModelState.WARM,
    ModelState.WARMING,
    ModelState.LOADING,
    ModelState.SLEEPING,
    ModelState.CACHED,
    ModelState.COLD,
    ModelState.FAILED,
]
assert set(STATUS_MODEL_ORDER) == set(ModelState)


def models_status(state: LabState) -> dict[str, int]:
    """How many of lab.yaml's models are in each state, as their machines say (`unknown`: its machine is offline)."""
    counts = {str(s): 0 for s in STATUS_MODEL_ORDER}
    counts["unknown"] = 0
    for model in state.lab.models:
        view = state.machines.get(model.machine)
        info = None
        if view is not None and view.online and view.models is not None:
            info = next((m for m in view.models.models if m.name == model.name), None)
        counts[str(info.state) if info is not None else "unknown"] += 1
    return {"total": len(state.lab.models), **counts}


def models_said(counts: dict[str, int]) -> str:
    """`5 models: 2 warm, 1 sleeping, 1 cached, 1 cold` (the states with none left out)."""
    parts = [f"{n} {name}" for name, n in counts.items() if name != "total" and n]
    return f"{plural(counts['total'], 'model')}" + (f": {', '.join(parts)}" if parts else "")


def gateway_said(gateway: dict[str, Any]) -> str:
    state = "up" if gateway["up"] else f"DOWN: {gateway['error']}"
    return f"gateway on {gateway['machine']}: {gateway['url']} (listens on {gateway['listen']}), {state}"


def status_human(data: dict[str, Any]) -> str:
    lines = [f"lab {data['lab']}" + (f"  lab.yaml {data['lab_version']}" if data.get("lab_version") else "")]
    if data.get("gateway") is not None:
        lines.append(gateway_said(data["gateway"]))
    if data.get("models") and data["models"]["total"]:  # a lab without models (yet) has no line for them
        lines.append(models_said(data["models"]))
    for m in data["machines"]:
        sim = " SIM" if m["simulated"] else ""
        if not m["online"]:
            lines.append(f"{m['name']:<14} OFFLINE  {m['error']}")
            continue
        lines.append(
            f"{m['name']:<14} online{sim}  cpu {fmt(m['cpu_pct'], '.0f', '%')}  ram {fmt_bytes(m['ram_used_bytes'])}/{fmt_bytes(m['ram_total_bytes'])}"
            f"  lab.yaml {m['lab_version'] or '?'}" + (f"  cetlab {m['agent_version']}" if m["agent_version"] else "")
        )
        if m["lab_differs"]:
            lines.append(f"  runs lab.yaml {m['lab_version']}, not the workstation's {data['lab_version']}: `cetlab lab push`")
        if m.get("lab_restart_pending"):
            lines.append(f"  lab.yaml at the next start: {', '.join(m['lab_restart_pending'])}")
        if m["lacks"]:
            lines.append(f"  {lacking_said(m['agent_version'], m['lacks'])}")
        if m["gpu_status"]:
            lines.append(f"  {m['gpu_status']}")
        lines += [f"  section {f['section']} FAILED ({f['phase']}): {f['error']}" for f in m["sections_failed"]]
        for g in m["gpus"]:
            if g["failed"]:
                lines.append(f"  gpu{g['index']} {g['name']:<26} FAILED: {g['failed']}")
                continue
            lines.append(
                f"  gpu{g['index']} {g['name']:<26} {fmt(g['util_pct'], '>3.0f', '%')}  "
                f"{fmt_bytes(g['mem_used_bytes']):>6}/{fmt_bytes(g['mem_total_bytes']):<6} "
                f"{fmt(g['temp_c'], '>3.0f', 'C')}  {fmt(g['power_w'], '>4.0f', 'W')}"
            )
    return "\n".join(lines)


async def cmd_status(ctx: Context) -> int:
    ctx.out(status_json(ctx.state), status_human)
    return EXIT_OK


async def cmd_demo(args: argparse.Namespace) -> int:
    from agents.runtime.demo import demo_cli_line
    from console.demo import DemoProcess, default_demo_dir, demo_quit_message, describe_gateway, describe_notify

    demo = DemoProcess(
        Path(args.dir) if args.dir else default_demo_dir(), scale=args.scale, agents_per_process=args.agents_per_process
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        try:
            await asyncio.to_thread(demo.start)
        except RuntimeError as exc:  # already running from that folder, or an agent did not start
            print(f"cetlab: {exc}", file=sys.stderr)
            return EXIT_FAILED
        print(f"demo lab running: {demo.lab_path}\n  try: {demo_cli_line(demo.dir)}", flush=True)
        described = describe_gateway(demo.dir, demo.lab_path, demo.source) + describe_notify(demo.dir, demo.lab_path)
        print(described + "  stop with Ctrl-C", flush=True)
        await stop.wait()
    finally:
        await asyncio.to_thread(demo.stop)
    # the start lines have scrolled away by now: where the gateway was, for the next start's clients
    print(demo_quit_message(demo.dir, describe_gateway(demo.dir, demo.lab_path, demo.source, try_line=False)), flush=True)
    return EXIT_OK


def hint_demo_lab(lab_path: Path) -> None:
    """No machine answered: if this is the demo's source lab, its ports are not the running demo's; say which file is."""
    from agents.runtime.demo import demo_cli_line, shown_path
    from console.demo import default_demo_dir, is_demo_source

    if not is_demo_source(lab_path):
        return
    print(
        f"cetlab: {shown_path(lab_path)} is the demo lab's source; the demo runs its agents with other ports and keys, "
        f"written to {shown_path(default_demo_dir() / 'lab.yaml')}. While the demo runs (`make demo`, or headless: "
        f"`cetlab demo`), use:\n  {demo_cli_line(default_demo_dir())}",
        file=sys.stderr,
    )


# ---------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cetlab", description="cetlab: operate a GPU lab from scripts.")
    parser.add_argument("--lab", help="lab.yaml (default: $CETLAB_LAB, else ./lab.yaml)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--timeout", type=positive_seconds, default=10.0, help="seconds to wait for the machines (default 10)")
    parser.add_argument("--trust-new-hosts", action="store_true", help="trust and record unknown host keys on first use")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    p = sub.add_parser("status", help="one snapshot of the whole lab")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("demo", help="run the demo lab's agents headless until Ctrl-C")
    p.add_argument(
        "--dir",
        help="where to keep lab.yaml, keys, agent state, runs and checkpoints "
        "(default: the checkout's .cetlab-demo/, the same as `make demo`)",
    )
    p.add_argument("--scale", type=int, help="emulate N machines of 8 GPUs instead of the demo lab")
    p.add_argument("--agents-per-process", type=int, help=argparse.SUPPRESS)
    p.set_defaults(standalone=cmd_demo)

    for name in VERB_MODULES:
        module = __import__(name, fromlist=["register"])
        module.register(sub)
    return parser


async def run(args: argparse.Namespace) -> int:
    if getattr(args, "standalone", None):
        code: int = await args.standalone(args)  # a verb that dials no machine (demo)
        return code
    lab_path = find_lab(args.lab)
    lab = load_lab(lab_path)
    client = FleetClient(
        lab, trust_on_first_use=args.trust_new_hosts or None, subscribe=[], reconnect=False, use_openssh=openssh.available()
    )
    async with client:
        await client.wait_connected(args.timeout)
        if not any(view.online for view in client.state.machines.values()):
            hint_demo_lab(lab_path)
        ctx = Context(args, lab, client)
        try:
            done: int = await args.func(ctx)
            return done
        except ValidationError as exc:  # a verb's params, checked here before they go out: said as the agent would
            raise RemoteError(ErrorCode.INVALID_PARAMS, params_error(exc)) from None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--json" in argv:  # accepted anywhere: `cetlab --json jobs` and `cetlab jobs --json`
        argv = ["--json"] + [a for a in argv if a != "--json"]
    log_visibly()  # agent text logged on the way (an unanswered error reply) never reaches the terminal raw
    args = build_parser().parse_args(argv)
    if getattr(args, "check", None):
        args.check(args)  # a verb's own usage errors (exit 2), before any machine is dialled
    try:
        return asyncio.run(run(args))
    except LabError as exc:
        say(f"cetlab: invalid lab file\n{exc}", err=True)
        return EXIT_USAGE
    except RemoteError as exc:
        if args.json:
            print(json.dumps({"error": {"code": str(exc.code), "message": exc.message}}))
        say(f"cetlab: {exc.message}", err=True)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
