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
