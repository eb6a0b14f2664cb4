"""`cetlab-agent`: serve a machine, manage its keys."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from platformdirs import user_state_path

from agents.keys import AUTHORIZED_KEYS_NAME, HOST_KEY_NAME, AuthorizedKeys, KeyFileError, ensure_key
from agents.lab import LabError, load_lab
from agents.protocol import Role

log = logging.getLogger("cetlab.agent")


def default_state_dir(machine: str) -> Path:
    return user_state_path("cetlab") / f"agent-{machine}"


def parse_listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def _setup_logging(level: str) -> None:
    # stderr, no timestamps of our own under systemd (journald stamps every line)
    fmt = "%(levelname)s %(name)s: %(message)s" if os.environ.get("INVOCATION_ID") else "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=getattr(logging, level.upper()), format=fmt, stream=sys.stderr)
    logging.getLogger("asyncssh").setLevel(logging.WARNING)


async def serve(args: argparse.Namespace) -> int:
    from agents.agent import Agent

    lab = load_lab(args.lab)
    names = [m.name for m in lab.machines]
    for machine in args.machine:
        if machine not in names:
            raise LabError([f"{args.lab}: no machine named {machine!r} (machines: {', '.join(names)})"])
    if len(args.machine) > 1 and args.listen:
        raise LabError(["--listen serves one machine; with several --machine each listens where lab.yaml says"])
    agents = []
    for machine in args.machine:
        if args.state_dir:
            state_dir = Path(args.state_dir) if len(args.machine) == 1 else Path(args.state_dir) / machine
        else:
            state_dir = default_state_dir(machine)
        agents.append(Agent(lab, machine, state_dir.resolve(), listen=args.listen))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    for agent in agents:
        await agent.start()
    if args.metrics_port is not None:
        from agents import metrics

        await metrics.serve(agents, args.metrics_listen, args.metrics_port)  # closes with the loop
    if args.ready_file:  # for scripts and tests: the port actually bound, once listening
        Path(args.ready_file).write_text(str(agents[0].bound_port))
    if args.parent_pid:
        asyncio.create_task(_exit_with_parent(args.parent_pid, stop))
    await stop.wait()
    log.info("stopping")
    for agent in agents:
        await agent.stop()
    return 0


async def _exit_with_parent(pid: int, stop: asyncio.Event) -> None:
    """Demo agents follow their console: stop when it is gone, even after a crash."""
    while True:
        await asyncio.sleep(1.0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            stop.set()
            return


def cmd_keys(args: argparse.Namespace) -> int:
    """Create the host key if missing and print its public half (for known_hosts)."""
    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir(args.machine)
    key = ensure_key(state_dir / HOST_KEY_NAME, comment=f"cetlab-agent@{args.machine}")
    print(key.export_public_key().decode().strip())
    return 0


def cmd_authorize(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir(args.machine)
    text = sys.stdin.read() if args.public_key == "-" else Path(args.public_key).expanduser().read_text()
    entry = AuthorizedKeys(state_dir / AUTHORIZED_KEYS_NAME).add(Role(args.role), text)
    print(f"authorized {entry.who} as {entry.role} in {state_dir / AUTHORIZED_KEYS_NAME}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cetlab-agent", description="The cetlab agent for one lab machine.")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="sample this machine and serve consoles over SSH")
    p.add_argument("--lab", required=True, help="path to lab.yaml")
    p.add_argument("--machine", required=True, action="append", help="this machine's name in lab.yaml (repeat to serve several, for emulation)")
    p.add_argument("--listen", type=parse_listen, help="HOST:PORT (default: the machine's host and port)")
    p.add_argument("--state-dir", help="keys, SQLite state and logs (default: the user state dir)")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port (default: off)")
    p.add_argument("--metrics-listen", default="127.0.0.1", help="address for --metrics-port (default 127.0.0.1)")
    p.add_argument("--ready-file", help=argparse.SUPPRESS)
    p.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    p.set_defaults(run=lambda a: asyncio.run(serve(a)))

    for name, func, helptext in (
        ("host-key", cmd_keys, "print the agent's public host key (creating it if missing)"),
        ("authorize", cmd_authorize, "authorize a console's public key with a role"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--machine", required=True)
        p.add_argument("--state-dir")
        if name == "authorize":
            p.add_argument("--role", choices=[r.value for r in Role], default="viewer")
            p.add_argument("public_key", help="a .pub file, or - for stdin")
        p.set_defaults(run=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
    try:
        return args.run(args) or 0
    except (LabError, KeyFileError) as exc:
        print(f"cetlab-agent: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. the port is taken
        print(f"cetlab-agent: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
