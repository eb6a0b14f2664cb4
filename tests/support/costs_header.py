"""What tests/e2e/costs/test_ledger.py, tests/fast/costs/test_ledger.py share: header."""

from __future__ import annotations

# ---------------------------------------------------------------------------- real agents over SSH
# ---------------------------------------------------------------------------- the console


def header(app) -> str:
    return str(app.screen.query_one("LabHeader").text)
