"""`cetlab lab doctor`: every machine's doctor (`doctor.run`, an operator method) over the wire, as one matrix.

Machines are columns, checks are rows (OK, WARN, FAIL; `-` where a machine has no such check); then each WARN and FAIL
with the one command that fixes it. A machine that cannot be asked is a column that says so, with its own fix (the
doctor can still be run there without its agent: `cetlab-agent doctor`). Peer rows read as pairs: the row
`peer → m5` in the column `pharaoh` is pharaoh's link to m5. Exit 1 when any check FAILs or a machine was not asked.
"""

from __future__ import annotations

import argparse
from typing import Any

from agents.wire.catalogue.doctor import DOCTOR_MAX_TIMEOUT_S, DOCTOR_RUN, DOCTOR_TIMEOUT_S, DoctorParams, DoctorReport
from agents.wire.lab.model import Lab
from agents.wire.protocol import ErrorCode, LinkStatus, RemoteError
from agents.wire.words import plural
from console.cli.main import EXIT_FAILED, EXIT_OK, Context, positive_seconds
from console.lab.client import FleetClient

RANK = {"OK": 0, "WARN": 1, "FAIL": 2}
SAID = {"OK": "ok", "WARN": "WARN", "FAIL": "FAIL"}


def within_seconds(text: str) -> float:
    """An argparse type: seconds above 0, at most what doctor.run takes (DoctorParams)."""
    value = positive_seconds(text)
    if value > DOCTOR_MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"{text} s: at most {DOCTOR_MAX_TIMEOUT_S:.0f}")
    return value


def unreachable_fix(lab: Lab, client: FleetClient, machine: str, exc: RemoteError) -> str:
    """The one command that lets the doctor through to this machine (or runs it there without its agent)."""
    here = lab.machine(machine)
    view = client.state.machines.get(machine)
    link = view.link if view is not None else None
    if exc.code == ErrorCode.FORBIDDEN or link is LinkStatus.REFUSED:
        return f"ssh {here.host} cetlab-agent authorize --machine {machine} --role operator - < ~/.ssh/id_ed25519.pub"
    if link is LinkStatus.UNTRUSTED:
        return "cetlab --trust-new-hosts lab doctor  (after checking the host key with `cetlab-agent host-key` there)"
    if exc.code == ErrorCode.METHOD_NOT_FOUND:
        return "cetlab lab upgrade"
    return f"ssh {here.host} cetlab-agent doctor --machine {machine}  (the checks, without its agent)"


def doctor_json(lab: Lab, client: FleetClient, results: dict[str, DoctorReport | RemoteError]) -> dict[str, Any]:
    machines: dict[str, Any] = {}
    for name, result in results.items():
        if isinstance(result, RemoteError):
            machines[name] = {
                "reached": False,
                "error": {"code": str(result.code), "message": result.message},
                "fix": unreachable_fix(lab, client, name, result),
            }
        else:
            machines[name] = {"reached": True, **result.model_dump(mode="json", exclude={"machine"})}
    failed = any(
        not m["reached"] or any(c["level"] == "FAIL" for c in m["checks"]) or not m["complete"] for m in machines.values()
    )
    return {"lab": lab.lab, "ok": not failed, "machines": machines}


def doctor_human(data: dict[str, Any]) -> str:
    machines: dict[str, Any] = data["machines"]
    rows: dict[str, dict[str, str]] = {}  # check -> machine -> level (the worst, where a machine says one twice)
    for name, m in machines.items():
        for check in m.get("checks", []):
            cells = rows.setdefault(check["name"], {})
            if RANK[check["level"]] >= RANK.get(cells.get(name, "OK"), 0):
                cells[name] = check["level"]
    names = list(machines)
    agents = [f"cetlab {machines[n]['agent_version']}" if machines[n]["reached"] else "UNREACHABLE" for n in names]
    first = max([len("check"), *(len(r) for r in rows)])
    widths = [max(len(n), len(a)) for n, a in zip(names, agents)]
    lines = [f"lab {data['lab']}: doctor of {plural(len(names), 'machine')}", ""]
    lines.append(f"{'check':<{first}}  " + "  ".join(f"{n:<{w}}" for n, w in zip(names, widths)).rstrip())
    lines.append(f"{'agent':<{first}}  " + "  ".join(f"{a:<{w}}" for a, w in zip(agents, widths)).rstrip())
    for row, cells in rows.items():
        lines.append(
            f"{row:<{first}}  "
            + "  ".join(f"{SAID[cells[n]] if n in cells else '-':<{w}}" for n, w in zip(names, widths)).rstrip()
        )
    problems = []
    for name, m in machines.items():
        if not m["reached"]:
            problems.append(f"{name}: not asked: {m['error']['message']}\n    fix: {m['fix']}")
            continue
        for check in m["checks"]:
            if check["level"] == "OK":
                continue
            problems.append(
                f"{name}: {check['level']} {check['name']}: {check['message']}"
                + (f"\n    fix: {check['fix']}" if check.get("fix") else "")
            )
    lines += ["", *problems] if problems else ["", "every check OK on every machine"]
    return "\n".join(lines)


async def cmd_doctor(ctx: Context) -> int:
    within = ctx.args.within
    machines = ctx.args.machine or list(ctx.state.machines)
    results = await ctx.request_all(DOCTOR_RUN, DoctorParams(timeout_s=within), machines, timeout=within + 15.0)
    data = doctor_json(ctx.lab, ctx.client, results)
    ctx.out(data, doctor_human)
    return EXIT_OK if data["ok"] else EXIT_FAILED


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = verbs.add_parser(
        "doctor",
        help="run every machine's doctor over the wire and print one matrix, each problem with its fix (operator key)",
    )
    p.add_argument("machine", nargs="*", help="only these machines (default: all)")
    p.add_argument(
        "--within",
        type=within_seconds,
        default=DOCTOR_TIMEOUT_S,
        help=f"seconds each machine has for its checks (default {DOCTOR_TIMEOUT_S:.0f}, at most {DOCTOR_MAX_TIMEOUT_S:.0f})",
    )
    p.set_defaults(func=cmd_doctor)
