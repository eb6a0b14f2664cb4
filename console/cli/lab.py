"""`cetlab lab check [PATH]`: lab.yaml validated offline; `cetlab lab schema [-o FILE]`: its JSON Schema;
`cetlab lab push` and `cetlab lab rollback [MACHINE...]`: the workstation's lab.yaml onto every agent, and back.

Neither check nor schema dials a machine. The check prints each problem as ``lab.yaml:LINE:COL: message`` (the form
editors and CI annotate) and exits 2 on any, as every `cetlab` verb does for an invalid lab.yaml; the schema is what the yaml-language-server modeline at the top of a
lab.yaml names, so an editor checks keys and types while one types. Push sends the text with the console's pinned
host keys of the lab's machines and the peer keys each agent said in its hello; each agent validates, keeps the
previous one, and applies what it can live (agents/shell/labpush.py); exit 1 when any machine did not take it.
`cetlab lab doctor` (console/cli/doctor.py) runs every machine's doctor over the wire.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agents.wire.catalogue.lab import LAB_ROLLBACK, LabApplied, LabRollbackParams
from agents.wire.lab.check import check, lab_schema
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.words import plural
from console.cli.main import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Context, say
from console.lab.push import push_lab, said_line
from console.lab.status import find_lab


async def cmd_check(args: argparse.Namespace) -> int:
    path = Path(args.path) if args.path else find_lab(args.lab)
    lab, problems = check(path)
    if args.json:
        print(json.dumps({"path": str(path), "ok": not problems, "problems": problems}))
    for problem in problems if not args.json else []:
        say(problem)  # a lab file from elsewhere may hold control characters: shown visible
    if lab is not None and not args.json:
        print(f"{path}: lab {lab.lab}: {plural(len(lab.machines), 'machine')}, {plural(len(lab.models), 'model')}: valid")
    return EXIT_USAGE if problems else EXIT_OK


async def cmd_schema(args: argparse.Namespace) -> int:
    text = json.dumps(lab_schema(), indent=2) + "\n"
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _report(ctx: Context, replies: dict[str, LabApplied | RemoteError]) -> int:
    data = {
        name: ({"error": {"code": str(r.code), "message": r.message}} if isinstance(r, RemoteError) else r.to_wire())
        for name, r in replies.items()
    }
    ctx.out(data, lambda _: "\n".join(said_line(name, r) for name, r in replies.items()))
    return EXIT_FAILED if any(isinstance(r, RemoteError) for r in replies.values()) else EXIT_OK


async def cmd_push(ctx: Context) -> int:
    replies, missing = await push_lab(ctx.lab, ctx.client, ctx.args.dry_run)
    if missing and not ctx.args.dry_run:
        say(f"cetlab: no peer key from {', '.join(missing)} (offline, or an older agent): push again once it is online", err=True)
    return _report(ctx, replies)


async def cmd_rollback(ctx: Context) -> int:
    unknown = [m for m in ctx.args.machines if m not in ctx.state.machines]
    if unknown:
        raise RemoteError(ErrorCode.INVALID_PARAMS, f"no machine {', '.join(unknown)} in {ctx.lab.source or 'the lab'}")
    replies = await ctx.request_all(LAB_ROLLBACK, LabRollbackParams(dry_run=ctx.args.dry_run), machines=ctx.args.machines or None)
    return _report(ctx, replies)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "lab",
        help="lab.yaml itself: check it offline, write its JSON Schema, push it, upgrade the agents, every machine's doctor",
    )
    verbs = p.add_subparsers(dest="lab_verb", required=True, metavar="check|schema|push|rollback|upgrade|doctor")
    check_p = verbs.add_parser(
        "check", help="validate lab.yaml without dialling any machine (exit 2 on problems, as for an invalid lab.yaml)"
    )
    check_p.add_argument("path", nargs="?", help="the file (default: --lab, $CETLAB_LAB, else ./lab.yaml)")
    check_p.set_defaults(standalone=cmd_check)
    schema_p = verbs.add_parser("schema", help="the JSON Schema of lab.yaml (for editors: yaml-language-server)")
    schema_p.add_argument("-o", "--output", help="write it to this file (default: stdout)")
    schema_p.set_defaults(standalone=cmd_schema)
    push_p = verbs.add_parser(
        "push", help="send this lab.yaml (--lab) to every agent: validated there, applied live, the previous one kept"
    )
    push_p.add_argument("--lab", default=argparse.SUPPRESS, help="the lab.yaml to push (as `cetlab --lab`)")
    push_p.add_argument("--dry-run", action="store_true", help="each agent validates it and says what would change")
    push_p.set_defaults(func=cmd_push)
    rollback_p = verbs.add_parser("rollback", help="put back the lab.yaml each agent ran before the last push")
    rollback_p.add_argument("machines", nargs="*", metavar="MACHINE", help="only these (default: every machine)")
    rollback_p.add_argument("--lab", default=argparse.SUPPRESS, help="the lab.yaml naming the machines (as `cetlab --lab`)")
    rollback_p.add_argument("--dry-run", action="store_true", help="say what would change; change nothing")
    rollback_p.set_defaults(func=cmd_rollback)
    from console.cli.doctor import register as register_doctor  # the one lab verb that dials the machines

    register_doctor(verbs)
    from console.cli.machine import register_upgrade  # the roll-out shares machine add's steps

    register_upgrade(verbs)
