"""`cetlab-agent`: serve a machine, manage its keys."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import os
import signal
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from agents.orchestra.engines import ENGINES
from agents.runtime.keys import AUTHORIZED_KEYS_NAME, HOST_KEY_NAME, AuthorizedKeys, KeyFileError, ensure_key
from agents.runtime.limits import RepeatFilter, ThrottledLog
from agents.runtime.store import StoreError
from agents.shell.systemd import Notifier, enable_commands, render_unit, status_line, tmp_path_warnings, unit_path
from agents.wire.entry import quiet_pipe
from agents.wire.lab.model import Lab, LabError, load_lab
from agents.wire.protocol import Role

log = logging.getLogger("cetlab.agent")

STOP_GRACE_S = 25.0  # SIGTERM to exit, whatever hangs; under the unit's TimeoutStopSec=30 (engines get 10 s of it)
EXIT_STOP_TIMEOUT = 70  # EX_SOFTWARE: the orderly stop did not finish


def default_state_dir(machine: str) -> Path:
    from platformdirs import user_state_path  # not needed where --state-dir is given

    return user_state_path("cetlab") / f"agent-{machine}"


def parse_listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def _setup_logging(level: str) -> None:
    # stderr, no timestamps of our own under systemd (journald stamps every line)
    fmt = (
        "%(levelname)s %(name)s: %(message)s"
        if os.environ.get("INVOCATION_ID")
        else "%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.basicConfig(level=getattr(logging, level.upper()), format=fmt, stream=sys.stderr)
    logging.getLogger("asyncssh").setLevel(logging.WARNING if level != "debug" else logging.INFO)
    logging.getLogger("asyncio").addFilter(RepeatFilter())  # its per-write warnings for peers that left, once per 10 s


async def serve(args: argparse.Namespace) -> int:
    from agents.shell.agent import Agent

    lab = load_lab(args.lab, engines=ENGINES)
    names = [m.name for m in lab.machines]
    for machine in args.machine:
        if machine not in names:
            raise LabError([f"{args.lab}: no machine named {machine!r} (machines: {', '.join(names)})"])
    if len(args.machine) > 1 and (args.listen or args.unix_socket):
        raise LabError(["--listen and --unix-socket serve one machine; with several --machine each listens where lab.yaml says"])
    agents = []
    for machine in args.machine:
        if args.state_dir:
            state_dir = Path(args.state_dir) if len(args.machine) == 1 else Path(args.state_dir) / machine
        else:
            state_dir = default_state_dir(machine)
        agents.append(
            Agent(
                lab,
                machine,
                state_dir.resolve(),
                listen=args.listen,
                keep_engines=args.keep_engines,
                unix_socket=Path(args.unix_socket).resolve() if args.unix_socket else None,
            )
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(_throttled_exception_handler())
    _stop_on_signals(loop, stop, args.stop_grace)
    for agent in agents:
        await agent.start()
    if args.metrics_port is not None:
        from agents.shell import metrics

        await metrics.serve(agents, args.metrics_listen, args.metrics_port)  # closes with the loop
    if args.ready_file:  # for scripts and tests: the port actually bound, once listening
        Path(args.ready_file).write_text(str(agents[0].bound_port))
    if args.parent_pid:
        asyncio.create_task(_exit_with_parent(args.parent_pid, stop))
    notifier = Notifier()
    if notifier.enabled:
        notifier.send(READY=1, STATUS=status_line(agents), MAINPID=os.getpid())
        watchdog = asyncio.create_task(notifier.run(agents), name="sd-notify")
    await stop.wait()
    log.info("stopping")
    if notifier.enabled:
        watchdog.cancel()
        notifier.send(STOPPING=1, STATUS="stopping")
    for agent in agents:
        await agent.stop()
    return 0


def _stop_on_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event, grace_s: float) -> None:
    """SIGTERM/SIGINT stop the agent, and it is gone within grace_s whatever a component does.

    Plain signal handlers (not the loop's) run even while a task hogs the loop; the timer thread
    then ends the process if the orderly stop has not finished in time.
    """

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(stop.set)
        if not any(t.name == "stop-deadline" for t in threading.enumerate()):
            threading.Thread(
                target=_deadline, args=(grace_s, signal.Signals(signum).name), name="stop-deadline", daemon=True
            ).start()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)


def _deadline(grace_s: float, signame: str) -> None:
    time.sleep(grace_s)
    log.critical("did not stop within %.0f s of %s (a component hangs): exiting now", grace_s, signame)
    logging.shutdown()
    os._exit(EXIT_STOP_TIMEOUT)


def _throttled_exception_handler() -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """The loop's error reports (e.g. accept() out of file descriptors, many per second) at most once per 10 s each."""
    throttled = ThrottledLog(logging.getLogger("cetlab.loop"))

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = context.get("message", "unhandled error in the event loop")
        exc = context.get("exception")
        throttled(logging.ERROR, message, "%s", message, exc_info=exc)

    return handler


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


def pick_machine(lab_path: str, machine: str | None) -> tuple[Lab, str]:
    """The lab and this machine's name: given, or the lab's machine named like this host."""
    lab = load_lab(lab_path, engines=ENGINES)
    names = [m.name for m in lab.machines]
    if machine is None:
        host = socket.gethostname().split(".")[0]
        if host not in names:
            raise LabError(
                [f"{lab_path}: no machine named like this host ({host!r}); pass --machine (one of {', '.join(names)})"]
            )
        machine = host
    if machine not in names:
        raise LabError([f"{lab_path}: no machine named {machine!r} (machines: {', '.join(names)})"])
    return lab, machine


def cmd_install_unit(args: argparse.Namespace) -> int:
    lab, machine = pick_machine(args.lab, args.machine)
    if args.state_dir:
        state_dir = Path(args.state_dir).resolve()
    else:
        state_dir = default_state_dir(machine) if args.user else Path("/var/lib/cetlab") / machine
    run_as = None if args.user else (args.run_as or os.environ.get("SUDO_USER") or getpass.getuser())
    cache_dir = Path(args.cache_dir).resolve() if args.cache_dir else None
    text = render_unit(
        lab,
        Path(args.lab).resolve(),
        machine,
        state_dir,
        user_unit=args.user,
        run_as=run_as,
        unix_socket=Path(args.unix_socket).resolve() if args.unix_socket else None,
        cache_dir=cache_dir,
    )
    for warning in tmp_path_warnings(lab, Path(args.lab).resolve(), machine, state_dir, cache_dir, user_unit=args.user):
        print(f"warning: {warning}", file=sys.stderr)
    if args.print:
        sys.stdout.write(text)
        return 0
    path = unit_path(args.user)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}; now run:")
    for command in enable_commands(args.user, path):
        print(f"  {command}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from agents.shell.doctor import FAIL, run_checks, run_machine_checks

    lab_path = Path(args.lab)
    host = socket.gethostname().split(".")[0]
    names = [m.name for m in load_lab(lab_path, engines=ENGINES).machines] if lab_path.exists() else []
    if not lab_path.exists():  # a new machine, pre-flighted before its lab.yaml is written
        machine = args.machine or host
        checks = run_machine_checks(lab_path, machine, Path(args.state_dir) if args.state_dir else None)
    elif args.machine is None and host not in names:  # a lab.yaml here (a checkout's) that does not name this machine
        machine = host
        checks = run_machine_checks(lab_path, machine, Path(args.state_dir) if args.state_dir else None, names)
    else:
        lab, machine = pick_machine(args.lab, args.machine)
        checks = run_checks(lab, machine, Path(args.state_dir) if args.state_dir else doctor_state_dir(lab_path, machine))
    failed = any(c.level == FAIL for c in checks)
    if args.json:
        print(json.dumps({"machine": machine, "ok": not failed, "checks": [c.to_json() for c in checks]}, indent=2))
    else:
        width = max(len(c.name) for c in checks)
        for check in checks:
            print(f"{check.level:<4}  {check.name:<{width}}  {check.message}")
            if check.fix:
                print(f"{'':<4}  {'':<{width}}  fix: {check.fix}")
    return 1 if failed else 0


def doctor_state_dir(lab_path: Path, machine: str) -> Path:
    """The state dir doctor checks: a demo's (DIR/agents/MACHINE beside the lab.yaml `cetlab demo` wrote), else the default."""
    demo = lab_path.resolve().parent / "agents" / machine
    return demo if (demo / HOST_KEY_NAME).exists() else default_state_dir(machine)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cetlab-agent", description="The cetlab agent for one lab machine.")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="sample this machine and serve consoles over SSH")
    p.add_argument("--lab", required=True, help="path to lab.yaml")
    p.add_argument(
        "--machine",
        required=True,
        action="append",
        help="this machine's name in lab.yaml (repeat to serve several, for emulation)",
    )
    p.add_argument("--listen", type=parse_listen, help="HOST:PORT (default: the machine's host and port)")
    p.add_argument("--state-dir", help="keys, SQLite state and logs (default: the user state dir)")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port (default: off)")
    p.add_argument("--metrics-listen", default="127.0.0.1", help="address for --metrics-port (default 127.0.0.1)")
    p.add_argument(
        "--unix-socket",
        help="serve consoles that come through this machine's sshd (via: sshd) here (default: STATE_DIR/agent.sock)",
    )
    p.add_argument(
        "--keep-engines",
        action="store_true",
        help="leave model servers running when the agent stops; the next agent re-adopts them (the systemd unit sets this)",
    )
    p.add_argument("--stop-grace", type=float, default=STOP_GRACE_S, help=argparse.SUPPRESS)
    p.add_argument("--ready-file", help=argparse.SUPPRESS)
    p.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    p.set_defaults(run=lambda a: asyncio.run(serve(a)))

    p = sub.add_parser("install-unit", help="write a systemd unit that runs this agent headless, and say how to enable it")
    p.add_argument("--user", action="store_true", help="a user unit (~/.config/systemd/user) instead of a system one")
    p.add_argument("--lab", default="lab.yaml", help="path to lab.yaml (default ./lab.yaml)")
    p.add_argument("--machine", help="this machine's name in lab.yaml (default: the one whose name is this host's name)")
    p.add_argument("--state-dir", help="default: /var/lib/cetlab/MACHINE (system unit) or the user state dir (--user)")
    p.add_argument("--unix-socket", help="the socket consoles reach through sshd (default: STATE_DIR/agent.sock)")
    p.add_argument("--run-as", help="system unit: the user the agent runs as (default: the invoking user)")
    p.add_argument(
        "--cache-dir", help="system unit: the Hugging Face, vLLM, Triton and Inductor caches (default: STATE_DIR/cache)"
    )
    p.add_argument("--print", action="store_true", help="write the unit to stdout instead of installing it")
    p.set_defaults(run=cmd_install_unit)

    p = sub.add_parser(
        "doctor", help="check this machine: driver, NVML, what each GPU can run, engines, state dir, keys, disk, clock"
    )
    p.add_argument(
        "--lab", default="lab.yaml", help="path to lab.yaml (default ./lab.yaml; missing: this machine's own checks only)"
    )
    p.add_argument("--machine", help="this machine's name in lab.yaml (default: the one whose name is this host's name)")
    p.add_argument("--state-dir", help="default: a demo's DIR/agents/MACHINE beside its lab.yaml, else the user state dir")
    p.add_argument("--json", action="store_true", help="one JSON object: checks and whether any failed")
    p.set_defaults(run=cmd_doctor)

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


@quiet_pipe
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
    try:
        return args.run(args) or 0
    except (LabError, KeyFileError) as exc:
        print(f"cetlab-agent: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `cetlab-agent doctor | head -3`: quiet_pipe ends it
        raise
    except (OSError, StoreError) as exc:  # e.g. the port is taken, state.db cannot be opened
        print(f"cetlab-agent: {exc}", file=sys.stderr)
        return 1
    except sqlite3.Error as exc:  # a write at start failed: a full disk, most likely
        print(f"cetlab-agent: state.db: {exc}; check free disk space in the state dir", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
