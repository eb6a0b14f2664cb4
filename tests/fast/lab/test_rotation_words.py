"""The rotation's text: its problems, what is not warm, the machines' own models, a first rotation's overhead."""

from __future__ import annotations

import pytest

from agents.wire.sections.models import Rotation
from console.cli.models import rotation_human

pytestmark = pytest.mark.timeout(180)


def test_rotation_text_names_problems_and_what_is_not_warm():
    rotation = {
        "plan": [["x", "y"], ["z"]],
        "index": 0,
        "running": False,
        "next_at": 1000.0 + 90,
        "pinned": ["p"],
        "overhead_pct": 0.0123,
        "target_pct": 1.0,
        "last": {
            "t": 1000.0 - 3600,
            "index": 0,
            "duration_s": 2.5,
            "swaps": [["z", "x"]],
            "out": [],
            "up": ["y"],
            "not_warm": ["y"],
            "problems": ["y needs 4.5 GiB on GPU 1 of m5"],
        },
    }
    text = rotation_human({"m5": Rotation.model_validate(rotation)}, now=1000.0)
    assert text.splitlines() == [
        "m5: rotated to set 1 of 2 (x, y) in 2.5 s, 1h00m ago",
        "  swapped z out for x",
        "  brought up: y",
        "  NOT WARM: y",
        "  problem: y needs 4.5 GiB on GPU 1 of m5",
        "  pinned (never rotated out): p",
        "  next in 1m30s, overhead 0.012% (target < 1%)",
    ]


def test_a_rotation_line_names_the_machines_own_models_of_the_set():
    """`cetlab rotate` said "workstation: rotated to set 2 of 2 (qwen2.5-coder-7b, mistral-7b-awq)" though none of them is there."""
    last = {"t": 900.0, "index": 1, "duration_s": 0.1, "swaps": [], "out": [], "up": [], "not_warm": [], "problems": []}
    rotation = {
        "plan": [["a"], ["qwen", "mistral", "phi"]],
        "index": 1,
        "running": False,
        "next_at": 2000.0,
        "pinned": [],
        "overhead_pct": 0.0,
        "target_pct": 1.0,
        "last": last,
    }
    typed = Rotation.model_validate(rotation)
    text = rotation_human(
        {"workstation": typed, "irina": typed}, now=1000.0, models_on={"workstation": {"tiny"}, "irina": {"mistral", "phi"}}
    )
    assert "workstation: rotated to set 2 of 2 (it has none of workstation's models) in 0.1 s" in text, text
    assert "irina: rotated to set 2 of 2 (mistral, phi) in 0.1 s" in text, text


def test_the_overhead_of_a_first_rotation_is_seconds_until_a_period_has_passed():
    from agents.wire.sections.models import Rotation
    from console.cli.models import rotation_schedule
    from console.tui.screens.models import rotation_text

    early = Rotation(plan=[["a"], ["b"]], every_s=600, unavailable_s=21.0, wall_s=300, overhead_pct=7.0, target_pct=1.0)
    said = rotation_schedule(early, 0.0)
    assert said.endswith("21.0 s without models in 5m00s (overhead judged after one 10m00s period; target < 1%)"), said
    assert "21.0 s without models in 5m00s" in rotation_text({"m5": early}, 0.0)  # the console gives the same answer
    later = early.model_copy(update={"wall_s": 3600, "overhead_pct": 0.583})
    assert rotation_schedule(later, 0.0).endswith("overhead 0.583% of 1h00m (target < 1%)")
