"""`cetlab lab check [PATH]`: lab.yaml validated offline; `cetlab lab schema [-o FILE]`: its JSON Schema.

Neither dials a machine. The check prints each problem as ``lab.yaml:LINE:COL: message`` (the form editors and CI
annotate) and exits 1 on any; the schema is what the yaml-language-server modeline at the top of a lab.yaml names,
so an editor checks keys and types while one types.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agents.wire.lab.check import check, lab_schema
from console.cli import EXIT_FAILED, EXIT_OK, find_lab


async def cmd_check(args: argparse.Namespace) -> int:
    path = Path(args.path) if args.path else find_lab(args.lab)
    lab, problems = check(path)
    if args.json:
        print(json.dumps({"path": str(path), "ok": not problems, "problems": problems}))
    for problem in problems if not args.json else []:
        print(problem)
    if lab is not None and not args.json:
        print(f"{path}: lab {lab.lab}: {len(lab.machines)} machines, {len(lab.models)} models: valid")
    return EXIT_FAILED if problems else EXIT_OK


async def cmd_schema(args: argparse.Namespace) -> int:
    text = json.dumps(lab_schema(), indent=2) + "\n"
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("lab", help="lab.yaml itself: check it offline, write its JSON Schema")
    verbs = p.add_subparsers(dest="lab_verb", required=True, metavar="check|schema|upgrade")
    check_p = verbs.add_parser("check", help="validate lab.yaml without dialling any machine (exit 1 on problems)")
    check_p.add_argument("path", nargs="?", help="the file (default: --lab, $CETLAB_LAB, else ./lab.yaml)")
    check_p.set_defaults(standalone=cmd_check)
    schema_p = verbs.add_parser("schema", help="the JSON Schema of lab.yaml (for editors: yaml-language-server)")
    schema_p.add_argument("-o", "--output", help="write it to this file (default: stdout)")
    schema_p.set_defaults(standalone=cmd_schema)
    from console.cli_machine import register_upgrade  # the roll-out shares machine add's steps

    register_upgrade(verbs)
