"""Layering: the import-linter contracts in pyproject.toml hold, and a real CLI run never loads Textual."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_every_name_is_imported_from_the_module_that_defines_it():
    """No re-export shims: no `__all__`, and no package face that only imports (a name has one module, its own; a
    package whose face is a module of its own, as the engines' registry is, defines what it imports for)."""
    offenders = []
    for package in ("agents", "console", "widgets"):
        for path in sorted((REPO / package).rglob("*.py")):
            text = path.read_text()
            if "__all__" in text:
                offenders.append(f"{path.relative_to(REPO)}: __all__")
            lines = text.splitlines()
            imports = any(line.startswith(("import ", "from ")) and "__future__" not in line for line in lines)
            defines = any(
                line.startswith(("def ", "class ", "async def ")) or re.match(r"^[A-Za-z_]\w*(: [^=]+)? = ", line)
                for line in lines
            )
            if path.name == "__init__.py" and imports and not defines:
                offenders.append(f"{path.relative_to(REPO)}: imports in a package's face")
    assert not offenders, offenders


MAX_MODULE_LINES = 500  # STYLE.md: a module past this is two subjects


def test_no_module_is_over_500_lines():
    long = [
        f"{path.relative_to(REPO)}: {n}"
        for package in ("agents", "console", "widgets")
        for path in sorted((REPO / package).rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, long


def _runtime_imports(package_roots: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the project modules it imports when it runs: at its top and inside its functions alike (a deferred
    import is still a run-time edge), not under `if TYPE_CHECKING:`."""
    import ast

    modules: dict[str, Path] = {}
    for root in package_roots:
        for path in (REPO / root).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        todo: list[ast.AST] = [ast.parse(path.read_text())]
        while todo:
            node = todo.pop()
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                todo += node.orelse
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package
                    for _ in range(node.level - 1):
                        up = up.rpartition(".")[0]
                    base = f"{up}.{base}" if base else up
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                if (found := owner(target)) is not None and found != name:
                    edges[name].add(found)
            todo += ast.iter_child_nodes(node)
    return edges


def test_no_import_cycle_at_run_time():
    """Cycles only through `if TYPE_CHECKING:` (a type named, nothing run); a run-time one is a layer bent back."""
    from graphlib import CycleError, TopologicalSorter

    try:
        TopologicalSorter(_runtime_imports(("agents", "console", "widgets"))).prepare()
    except CycleError as exc:
        raise AssertionError(f"a run-time import cycle: {' -> '.join(exc.args[1])}") from None


MAX_FUNCTION_LINES = 80


def test_no_function_is_over_80_lines_without_its_reason():
    """A function past 80 lines says why in its docstring ("Over 80 lines: ..."), or is split."""
    import ast

    long = []
    for package in ("agents", "console", "widgets"):
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    size = (node.end_lineno or node.lineno) - node.lineno + 1
                    if size > MAX_FUNCTION_LINES and "Over 80 lines: " not in (ast.get_docstring(node) or ""):
                        long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {size} lines")
    assert not long, long
