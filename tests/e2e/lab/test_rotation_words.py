"""`cetlab rotate` against a running lab says what moved, in lines, and durations in hours."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.cli_labs import (
    cli,
)

pytestmark = pytest.mark.timeout(180)


# ---------------------------------------------------------------------------- 9, 18: rotation in words


def test_rotate_says_what_moved_in_lines_and_durations_in_hours(box_lab):
    done = cli(box_lab.lab_path, "rotate")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "{" not in out and "'swaps'" not in out  # no raw Python dicts
    assert re.search(r"^box: rotated to set 1 of 2 \(b\) in \d+\.\d s", out, re.M), out
    assert "brought up: b" in out or "swapped a out for b" in out or "freed: a" in out, out
    # 4 h, not "in 14399 s"; a first rotation minutes after the start is seconds, not an alarming share of those minutes
    assert re.search(
        r"next in 3h5\dm, \d+\.\d s without models in \S+ \(overhead judged after one 4h00m period; target < 1%\)", out
    ), out
    as_json = cli(box_lab.lab_path, "--json", "rotate", "--no-wait")
    assert json.loads(as_json.stdout)["box"]["plan"] == [["b"], ["a"]]  # --json stays JSON
    models = cli(box_lab.lab_path, "models")
    assert re.search(r"box: rotation step \d of 2, next in [34]h\d\dm", models.stdout), models.stdout
    assert not re.search(r"in \d+ s", models.stdout)
