"""`cetlab machine add NAME USER@HOST[:PORT]` and `cetlab machine remove NAME`: a machine into the lab over the
operator's own ssh, and out of it again (console/machine/steps.py says how each step works).

Neither dials an agent before it exists: both are standalone verbs. Exit 0 done, 1 a step failed (what and the fix
are said; running it again continues), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from agents.wire.protocol import Role
from console.cli.main import EXIT_FAILED, EXIT_OK, EXIT_USAGE, say
from console.lab.status import find_lab
from console.machine.ssh import MachineError, Target
from console.machine.steps import AddOptions, StepTime, add, remove
from console.machine.upgrade import upgrade


def _printer(args: argparse.Namespace) -> Callable[[str], None]:
    """Human lines on stdout; with --json they go to stderr and stdout carries one JSON object."""
    return (lambda text: say(text, err=True, flush=True)) if args.json else (lambda text: say(text, flush=True))


def _report(args: argparse.Namespace, verb: str, steps: list[StepTime], error: str | None) -> int:
    if args.json:
        print(
            json.dumps(
                {
                    "machine": args.name,
                    "verb": verb,
                    "ok": error is None,
                    "dry_run": args.dry_run,
                    "error": error,
                    "steps": [{"step": s.name, "seconds": round(s.seconds, 3), "said": s.said} for s in steps],
                }
            )
        )
    if error is not None:
        say(f"cetlab: {error}", err=True)
        return EXIT_FAILED
    total = sum(s.seconds for s in steps)
    done = "planned (dry run: nothing changed)" if args.dry_run else "done"
    say(f"machine {verb} {args.name}: {done} in {total:.1f} s", err=args.json)
    return EXIT_OK


async def cmd_add(args: argparse.Namespace) -> int:
    try:
        target = Target.parse(args.target)
    except MachineError as exc:
        say(f"cetlab: {exc}", err=True)
        return EXIT_USAGE
    options = AddOptions(
        lab_path=find_lab(args.lab),
        name=args.name,
        target=target,
        agent_port=args.agent_port,
        role=args.role,
        gpus=args.gpus,
        ssh_config=Path(args.ssh_config) if args.ssh_config else None,
        dry_run=args.dry_run,
        timeout_s=args.wait,
        lab_name=args.lab_name,
    )
    steps: list[StepTime] = []
    try:
        steps = await add(options, _printer(args))
    except MachineError as exc:
        return _report(args, "add", steps, str(exc))
    return _report(args, "add", steps, None)


async def cmd_remove(args: argparse.Namespace) -> int:
    try:
        steps = await remove(find_lab(args.lab), args.name, args.purge, args.dry_run, _printer(args))
    except MachineError as exc:
        return _report(args, "remove", [], str(exc))
    return _report(args, "remove", steps, None)


async def cmd_upgrade(args: argparse.Namespace) -> int:
    args.name = ",".join(args.machine) if args.machine else "all"
    try:
        steps, rolled_back = await upgrade(find_lab(args.lab), args.machine or [], args.dry_run, args.wait, _printer(args))
    except MachineError as exc:
        return _report(args, "upgrade", [], str(exc))
    if rolled_back:
        return _report(args, "upgrade", steps, f"rolled back: {', '.join(rolled_back)} (see above why)")
    return _report(args, "upgrade", steps, None)


def register_upgrade(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`cetlab lab upgrade`, under `lab` (console/cli/lab.py)."""
    u = verbs.add_parser("upgrade", help="roll this build out to the machines added here, one at a time (rolls back)")
    u.add_argument("--machine", action="append", type=_name, help="only this machine (repeat for several)")
    u.add_argument("--wait", type=_seconds, default=60.0, help="seconds a machine has to come back (default 60)")
    u.add_argument("--dry-run", action="store_true", help="print every command that would change something; change nothing")
    u.set_defaults(standalone=cmd_upgrade)


def _name(text: str) -> str:
    from pydantic import TypeAdapter, ValidationError

    from agents.wire.schema import Name

    try:
        return str(TypeAdapter(Name).validate_python(text))
    except ValidationError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a machine name (letters, digits, - and _)") from None


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (1-65535)")
    return int(text)


def _seconds(text: str) -> float:
    from console.cli.main import positive_seconds

    return positive_seconds(text)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("machine", help="bring a machine into the lab over your ssh, or take it out")
    verbs = p.add_subparsers(dest="machine_verb", required=True, metavar="add|remove")
    a = verbs.add_parser(
        "add",
        help="pre-flight, install the agent from a wheelhouse, pin its key, add it to lab.yaml, start it (idempotent)",
    )
    a.add_argument("name", type=_name, help="the machine's name in lab.yaml")
    a.add_argument("target", help="USER@HOST[:PORT] as your ssh reaches it (HOST may be a ~/.ssh/config alias)")
    a.add_argument("--agent-port", type=_port, help="the agent's SSH port there (default: lab.yaml's, else 7022)")
    a.add_argument("--role", choices=[r.value for r in Role], default="operator", help="this console's role there")
    a.add_argument("--gpus", choices=["nvml", "none"], help="lab.yaml's gpus (default: nvml where the driver sees GPUs)")
    a.add_argument("--ssh-config", help="an ssh config file to use instead of ~/.ssh/config")
    a.add_argument("--wait", type=_seconds, default=60.0, help="seconds to wait for the agent to answer (default 60)")
    a.add_argument("--lab-name", default="lab", help="the lab's name when lab.yaml does not exist yet (default: lab)")
    a.add_argument("--dry-run", action="store_true", help="print every command that would change something; change nothing")
    a.set_defaults(standalone=cmd_add)
    r = verbs.add_parser("remove", help="stop and remove the agent's service, its pinned key and lab.yaml entry")
    r.add_argument("name", type=_name)
    r.add_argument("--purge", action="store_true", help="also delete its state (runs, checkpoints, keys) and venvs there")
    r.add_argument("--dry-run", action="store_true", help="print every command that would change something; change nothing")
    r.set_defaults(standalone=cmd_remove)
