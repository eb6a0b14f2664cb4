"""What tests/e2e/runtime/test_key_budgets.py, tests/e2e/shell/test_security.py share: add_key."""

from __future__ import annotations

from agents.runtime.keys import AUTHORIZED_KEYS_NAME, ensure_key


def add_key(demo, role: str, tmp_path, comment: str):
    path = tmp_path / comment
    key = ensure_key(path, comment=comment)
    with (demo.dir / "agents" / "box" / AUTHORIZED_KEYS_NAME).open("a") as f:  # re-read live by the agent
        f.write(f"{role} {key.export_public_key().decode().strip()}\n")
    return path
