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
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from agents.wire.catalogue.method import Method, params_error, request, request_all
from agents.wire.lab.model import Lab, LabError, load_lab
from agents.wire.protocol import ErrorCode, RemoteError
from console.lab import openssh
from console.lab.client import FleetClient
from console.lab.state import LabState
from console.lab.status import find_lab, status_human, status_json
from widgets.terminal import log_visibly, visible

P = TypeVar("P", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# Verb modules: each has register(subparsers) adding parsers whose `func(ctx)` is async.
VERB_MODULES: list[str] = [
    "console.cli.costs",
    "console.cli.jobs",
    "console.cli.queue",
    "console.cli.models",
    "console.cli.checkpoints",
    "console.cli.audit",
    "console.cli.gateway",
    "console.cli.sim",
    "console.cli.lab",
    "console.cli.machine",
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


async def cmd_status(ctx: Context) -> int:
    ctx.out(status_json(ctx.state), status_human)
    return EXIT_OK


async def cmd_demo(args: argparse.Namespace) -> int:
    from agents.runtime.demo import demo_cli_line
    from console.lab.demo import DemoProcess, default_demo_dir, demo_quit_message, describe_gateway, describe_notify

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
    from console.lab.demo import default_demo_dir, is_demo_source

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
