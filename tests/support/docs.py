"""What tests/e2e/project/test_docs.py, tests/fast/project/test_docs.py share: ROOT, DOCS."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


DOCS = ROOT / "docs"
