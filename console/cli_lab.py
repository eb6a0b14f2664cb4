"""`cetlab lab check [PATH]`: lab.yaml validated offline; `cetlab lab schema [-o FILE]`: its JSON Schema;
`cetlab lab push` and `cetlab lab rollback [MACHINE...]`: the workstation's lab.yaml onto every agent, and back.

Neither check nor schema dials a machine. The check prints each problem as ``lab.yaml:LINE:COL: message`` (the form
editors and CI annotate) and exits 2 on any, as every `cetlab` verb does for an invalid lab.yaml; the schema is what the yaml-language-server modeline at the top of a
lab.yaml names, so an editor checks keys and types while one types. Push sends the text with the console's pinned
host keys of the lab's machines and the peer keys each agent said in its hello; each agent validates, keeps the
previous one, and applies what it can live (agents/shell/labpush.py); exit 1 when any machine did not take it.
`cetlab lab doctor` (console/cli_doctor.py) runs every machine's doctor over the wire.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agents.runtime.labfile import calls_peers
from agents.wire.catalogue.agent import HELLO
from agents.wire.catalogue.lab import LAB_APPLY, LAB_ROLLBACK, LabApplied, LabApplyParams, LabRollbackParams
from agents.wire.catalogue.method import request_all
from agents.wire.lab.check import check, lab_schema
from agents.wire.lab.model import Lab
from agents.wire.protocol import ErrorCode, PeerKeys, RemoteError
from agents.wire.words import plural
from console.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Context, find_lab, say
from console.client import FleetClient, host_pattern


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


def pinned_host_lines(lab: Lab, known_hosts: Path) -> list[str]:
    """The console's pinned host keys of the lab's machines (those its agents serve SSH for), as known_hosts lines the
    agents write as their peer known hosts: the key the console checks is the key the peers check."""
    import asyncssh

    if not known_hosts.exists():
        return []
    known = asyncssh.read_known_hosts(str(known_hosts))
    lines = []
    for machine in lab.machines:
        if machine.via != "agent":
            continue  # reached through its own sshd: no peer links to it
        for key in known.match(machine.host, "", machine.port)[0]:
            kind, blob = key.export_public_key().decode().split()[:2]
            line = f"{host_pattern(machine.host, machine.port)} {kind} {blob}"
            if line not in lines:
                lines.append(line)
    return lines


def said_line(name: str, reply: LabApplied | RemoteError) -> str:
    if isinstance(reply, RemoteError):
        return f"{name}: NOT APPLIED: {reply.message}"
    verb = "would apply" if reply.dry_run else "runs"
    head = f"{name}: {verb} lab.yaml {reply.version}" + (f" (was {reply.previous})" if reply.changed else " (unchanged)")
    parts = [head]
    if reply.live:
        parts.append(f"  live: {'; '.join(reply.live)}")
    if reply.restart:
        parts.append(f"  at the agent's next start: {'; '.join(reply.restart)}")
    if reply.peer_hosts or reply.authorized:
        parts.append(f"  peers: {reply.peer_hosts} host keys pinned, authorized: {', '.join(reply.authorized) or 'none'}")
    return "\n".join(parts)


def _report(ctx: Context, replies: dict[str, LabApplied | RemoteError]) -> int:
    data = {
        name: ({"error": {"code": str(r.code), "message": r.message}} if isinstance(r, RemoteError) else r.to_wire())
        for name, r in replies.items()
    }
    ctx.out(data, lambda _: "\n".join(said_line(name, r) for name, r in replies.items()))
    return EXIT_FAILED if any(isinstance(r, RemoteError) for r in replies.values()) else EXIT_OK


async def push_lab(lab: Lab, client: FleetClient, dry_run: bool) -> tuple[dict[str, LabApplied | RemoteError], list[str]]:
    """lab.yaml's text onto every agent the client reaches, with the peer trust it carries; each machine's reply, and
    the machines that call peers and gave no peer key (to push again once they are online). `cetlab lab push`, and
    `cetlab machine add/remove` after the machine joined or left."""
    source = lab.source
    if source is None:
        raise RemoteError(ErrorCode.INVALID_PARAMS, "the lab was not read from a file: nothing to push")
    text = source.read_text()
    state = client.state
    said = {name: view.hello.peer_keys for name, view in state.machines.items() if view.hello is not None}
    keys = {name: k for name, k in said.items() if k is not None and (k.peer or k.node)}
    callers = [m for m in state.machines if calls_peers(lab, m)]
    known_hosts = "\n".join(pinned_host_lines(lab, client.known_hosts))

    async def push(keys: dict[str, PeerKeys]) -> dict[str, LabApplied | RemoteError]:
        """The machines that let peers in first, then those that call them (the gateway's, a multi-node recipe's first
        node): a caller retries its links once its trust is written, and finds the other side ready."""
        params = LabApplyParams(text=text, known_hosts=known_hosts, peer_keys=keys, dry_run=dry_run)
        replies = await request_all(client, [m for m in state.machines if m not in callers], LAB_APPLY, params)
        replies.update(await request_all(client, callers, LAB_APPLY, params) if callers else {})
        return replies

    replies = await push(keys)
    # a machine that calls peers under this lab.yaml only (the gateway's, once a second machine joins) made its keys
    # with the push: ask for them, and push again so that the others let it in (the same text: trust only)
    late = [m for m in callers if m not in keys and isinstance(replies.get(m), LabApplied)]
    if late and not dry_run:
        hellos = await request_all(client, late, HELLO, None)
        fresh = {n: h.peer_keys for n, h in hellos.items() if not isinstance(h, RemoteError) and h.peer_keys is not None}
        keys.update({n: k for n, k in fresh.items() if k.peer or k.node})
        if any(m in keys for m in late):
            again = await push(keys)
            for name, first in replies.items():
                second = again.get(name)
                if isinstance(first, LabApplied) and isinstance(second, LabApplied):
                    replies[name] = first.model_copy(update={"peer_hosts": second.peer_hosts, "authorized": second.authorized})
    missing = [m.name for m in lab.machines if m.name not in keys and calls_peers(lab, m.name)]
    return {name: replies[name] for name in state.machines}, missing


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
    from console.cli_doctor import register as register_doctor  # the one lab verb that dials the machines

    register_doctor(verbs)
    from console.cli_machine import register_upgrade  # the roll-out shares machine add's steps

    register_upgrade(verbs)
