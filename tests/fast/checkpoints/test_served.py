"""One served-checkpoint answer: the :checkpoints view and `cetlab checkpoints` flag a checkpoint served for the same states,
those in which an engine holds it or a serve is bringing it up (agents/wire/served.py)."""

from __future__ import annotations

import pytest

from agents.wire.sections.checkpoints import CheckpointInfo
from agents.wire.sections.models import Serving
from agents.wire.served import SERVED_STATES, is_served
from agents.wire.states import ModelState
from console.cli.checkpoints import marks
from console.tui.screens.checkpoints import flags_text

# Every state a serving record can hold: the serving model's, and the serve's own (agents/checkpoints/).
SERVE_STEPS = ("merging", "converting", "unloaded")


ALL_STATES = (*(s.value for s in ModelState), *SERVE_STEPS)


SERVED = {"merging", "converting", "loading", "warming", "warm", "sleeping"}  # an engine holds it, or is on its way to


MODES = ("adapter", "merged", "full", "gguf-adapter")


def checkpoint(serving: Serving | None) -> CheckpointInfo:
    return CheckpointInfo(run="exp", step=200, path="/runs/exp/checkpoint-200", serving=serving)


def test_the_rule_every_state_has_an_answer():
    assert SERVED_STATES == SERVED
    assert not is_served(None)
    assert {s for s in ALL_STATES if is_served(Serving(model="m", mode="merged", state=s))} == SERVED


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("state", ALL_STATES)
def test_the_console_and_the_cli_agree_on_whether_a_checkpoint_is_served(state: str, mode: str):
    serving = Serving(model="exp-step200", mode=mode, state=state, error="boom" if state == "failed" else None)
    ckpt = checkpoint(serving)
    console_says = "served:" in flags_text(ckpt).plain
    cli_says = "served:" in marks(ckpt)
    assert console_says == cli_says == (state in SERVED), (state, flags_text(ckpt).plain, marks(ckpt))


def test_a_failed_serve_is_not_served_but_both_say_it_failed():
    ckpt = checkpoint(Serving(model="exp-step200", mode="merged", state="failed", error="merge ran out of memory"))
    assert "serve-failed:exp-step200" in flags_text(ckpt).plain
    assert "serve-failed:exp-step200" in marks(ckpt)


def test_no_serving_record_no_flag():
    assert "serve" not in flags_text(checkpoint(None)).plain
    assert "serve" not in marks(checkpoint(None))
