"""YAML documents read safely, with errors that name the file, the line and the key path.

Used by lab.yaml (agents/wire/lab/model.py) and the trainer's config (agents/train/config.py). A
document is checked before anything is built from it: its size, its nesting, its aliases
(and what they expand to) and the length of its numbers, so a hostile or broken file gets a
one-line error, never a hang or a traceback. Keys given twice are found on the node tree,
which also maps every key path to its line for pydantic's errors (`problem_at`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails


KeyPath = tuple[str | int, ...]  # a key path in the document: ("machines", 0, "gpus")


class LineMap(dict[KeyPath, int]):
    """Each key path's 1-based line; ``cols``: its 1-based column (editors jump to file:line:col)."""

    def __init__(self) -> None:
        super().__init__()
        self.cols: dict[KeyPath, int] = {}


class Problem(str):
    """One problem as its line of text (``file:line: detail``), knowing its line, column and detail apart."""

    line: int
    col: int
    detail: str

    def __new__(cls, source: str, line: int, col: int, detail: str) -> Problem:
        problem = super().__new__(cls, f"{source}:{line}: {detail}")
        problem.line, problem.col, problem.detail = line, col, detail
        return problem


Dupes = list[tuple[KeyPath, int]]  # a key given twice in one mapping, and its line


class YamlDocError(Exception):
    """The document is unreadable or invalid; str() is one line per problem, file:line first."""

    def __init__(self, problems: Sequence[str]):
        super().__init__("\n".join(problems))
        self.problems = list(problems)


MAX_BYTES = 1024 * 1024  # a lab of a hundred machines is ~50 KB
MAX_DEPTH = 32  # lab.yaml nests 6 levels deep
MAX_ALIASES = 5_000  # anchors are handy (`<<: *p40-box` on each of 200 machines), bombs are not ...
MAX_NODES = 50_000  # ... nor is a document that holds or expands to more values (a big lab has ~5,000)
MAX_NUMBER_DIGITS = 30
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser where installed: ~10x faster


def check_shape(text: str, source: str) -> None:
    """Refuse deep nesting, alias bombs and huge documents from the event stream, before anything is built."""
    depth, aliases = 0, 0
    for count, event in enumerate(yaml.parse(text, Loader=LOADER)):
        if count > MAX_NODES:
            raise YamlDocError([f"{source}:{event.start_mark.line + 1}: more than {MAX_NODES} values; is this the right file?"])
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise YamlDocError([f"{source}:{event.start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels"])
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise YamlDocError([f"{source}:{event.start_mark.line + 1}: more than {MAX_ALIASES} aliases (*name)"])


def check_expansion(root: yaml.Node, source: str) -> None:
    """Refuse a document whose aliases expand past MAX_NODES values, and numbers too long to be real."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:  # depth is bounded by check_shape
        if id(node) in sizes:
            return sizes[id(node)]
        if isinstance(node, yaml.ScalarNode):
            total = 1
            if node.tag.endswith((":int", ":float")) and len(node.value) > MAX_NUMBER_DIGITS:
                raise YamlDocError(
                    [
                        f"{source}:{node.start_mark.line + 1}: a number of {len(node.value)} characters; "
                        f"numbers here have at most {MAX_NUMBER_DIGITS}"
                    ]
                )
        elif isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(item) for item in node.value)
        else:
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        if total > MAX_NODES:
            raise YamlDocError([f"{source}:{node.start_mark.line + 1}: its aliases expand to more than {MAX_NODES} values"])
        sizes[id(node)] = total
        return total

    size(root)


def load(text: str, source: str) -> tuple[LineMap, Dupes, Any]:
    """Parse once: line numbers and duplicate keys from the node tree, and the data built from it; YamlDocError otherwise."""
    if len(text) > MAX_BYTES:
        raise YamlDocError([f"{source}: {len(text)} characters; a file here may have at most {MAX_BYTES}"])
    try:
        check_shape(text, source)
        loader = LOADER(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return LineMap(), [], None
            check_expansion(node, source)
            lines, dupes = line_map(node)  # before construction, which flattens merge keys in place
            return lines, dupes, loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        problem = getattr(exc, "problem", None) or str(exc)
        raise YamlDocError([Problem(source, line, mark.column + 1 if mark else 1, f"not valid YAML: {problem}")]) from None
    except (ValueError, RecursionError, MemoryError) as exc:  # what construction can still raise: say it in one line
        raise YamlDocError([f"{source}: not a usable document: {type(exc).__name__}: {str(exc)[:200]}"]) from None


def line_map(
    node: yaml.Node, path: KeyPath = (), lines: LineMap | None = None, dupes: Dupes | None = None
) -> tuple[LineMap, Dupes]:
    """Map every key path in the YAML tree to its 1-based line; note duplicate keys."""
    lines = LineMap() if lines is None else lines
    dupes = [] if dupes is None else dupes
    lines.setdefault(path, node.start_mark.line + 1)
    lines.cols.setdefault(path, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else f"<{key_node.id} key>"
            if key in seen:
                dupes.append((path + (key,), key_node.start_mark.line + 1))
            seen.add(key)
            lines[path + (key,)] = key_node.start_mark.line + 1
            lines.cols[path + (key,)] = key_node.start_mark.column + 1
            line_map(value_node, path + (key,), lines, dupes)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            lines.cols[path + (i,)] = item.start_mark.column + 1
            line_map(item, path + (i,), lines, dupes)
    return lines, dupes


def format_path(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def data_path(data: Any, loc: tuple[str | int, ...], key_error: bool) -> KeyPath:
    """Pydantic's error location reduced to the keys that exist in the YAML data.

    Union tags and validator names in the location are skipped; a missing or unknown
    key (the location's last part) is kept so the message can name it.
    """
    path: list[str | int] = []
    for position, part in enumerate(loc):
        if isinstance(part, int) and isinstance(data, list) and part < len(data):
            path.append(part)
            data = data[part]
        elif isinstance(part, str) and isinstance(data, dict) and part in data:
            path.append(part)
            data = data[part]
        elif isinstance(part, str) and key_error and position == len(loc) - 1:
            path.append(part)
    return tuple(path)


def problem_at(source: str, lines: LineMap, path: KeyPath, message: str) -> Problem:
    probe = path
    while probe not in lines and probe:
        probe = probe[:-1]
    return Problem(source, lines.get(probe, 1), lines.cols.get(probe, 1), f"{format_path(path)}: {message}")


def describe(error: ErrorDetails) -> str:
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if error["type"] == "extra_forbidden":
        return "unknown key (check the spelling; see docs/reference/lab-yaml.md)"
    if error["type"] == "missing":
        return "required key is missing"
    got = error.get("input")
    if error["type"] not in ("union_tag_invalid",) and not isinstance(got, (dict, list)):
        message += f" (got {got!r})"
    return message
