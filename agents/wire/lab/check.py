"""`cetlab lab check` and `cetlab lab schema`: lab.yaml validated offline, its errors as ``file:line:col: message``
(the form editors jump to), and the JSON Schema of its models (for the yaml-language-server modeline)."""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

from agents.wire.lab.model import Lab, LabError, load_lab
from agents.wire.lab.yaml_doc import Problem

_AT = re.compile(r"^(?P<source>.*?):(?P<line>\d+): (?P<detail>.*)$", re.S)


def lab_schema() -> dict[str, Any]:
    """The JSON Schema of lab.yaml, as its pydantic models validate it (what an editor checks while one types)."""
    schema = Lab.model_json_schema(mode="validation")
    schema.get("properties", {}).pop("source", None)  # the file's own path, set by the loader, never written in it
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def editor_line(problem: str, shown: str) -> str:
    """One problem as ``shown:line:col: detail`` (a problem without a line points at the file's start)."""
    if isinstance(problem, Problem):
        return f"{shown}:{problem.line}:{problem.col}: {problem.detail}"
    found = _AT.match(problem)
    if found is None:
        detail = problem.split(": ", 1)[1] if ": " in problem else problem
        return f"{shown}:1:1: {detail}"
    return f"{shown}:{found['line']}:1: {found['detail']}"


def check(path: Path, engines: Collection[str] | None = None) -> tuple[Lab | None, list[str]]:
    """The lab (None when invalid) and its problems, each as ``path:line:col: message``."""
    try:
        return load_lab(path, engines=engines), []
    except LabError as exc:
        return None, [editor_line(p, str(path)) for p in exc.problems]
