"""Damaged records and bad lab files (issue 21, N11 and N17): a damaged job record in state.db is listed as damaged
while the other jobs still list; a provider URL with credentials or CR/LF, an oversized orchestra group and a key given
twice thousands of times are each refused at load, briefly."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(120)


def test_a_key_given_twice_thousands_of_times_is_one_line(tmp_path):
    """N17: the duplicate-key error was printed once per repetition (9,999 lines)."""
    import subprocess
    import sys

    path = tmp_path / "lab.yaml"
    path.write_text("lab: x\nmachines: []\n" + "lab: y\n" * 9999)
    done = subprocess.run(
        [sys.executable, "-m", "console.cli.main", "--lab", str(path), "status"], capture_output=True, timeout=60
    )
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 2 and len(lines) <= 3 and "key given twice" in lines[-1], lines[:5]
