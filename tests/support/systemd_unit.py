"""What tests/e2e/shell/test_systemd_unit.py, tests/fast/shell/test_systemd_unit.py share: unit_lines."""

from __future__ import annotations


def unit_lines(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found
