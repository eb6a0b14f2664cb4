"""A run's loss (and eval-loss) curve with a marker per checkpoint: best, kept, incomplete and the selected one stand out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from textual_plotext import PlotextPlot

from agents.wire.sections.checkpoints import CheckpointInfo
from widgets.wire import visible

MOST_TICKS = 6
Point = tuple[int, float | None]  # (step, loss) of a curve


def step_ticks(first: int, last: int, most: int = MOST_TICKS) -> list[int]:
    """Whole steps to label an x axis from `first` to `last`: at most `most`, 1, 2 or 5 times a power of ten apart."""
    span = max(0, last - first)
    if span == 0:
        return [first]
    raw = span / most
    magnitude = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude * most >= span)
    start = math.ceil(first / step) * step
    return list(range(int(start), int(last) + 1, int(step)))


def marker_y(ckpt: CheckpointInfo, loss: Sequence[Point]) -> float | None:
    """Where a checkpoint sits on the curve: its own loss, else the curve's last value at or before its step."""
    if ckpt.loss is not None:
        return ckpt.loss
    before = [value for step, value in loss if step <= ckpt.step]
    return before[-1] if before else (loss[0][1] if loss else None)


def marker_groups(
    checkpoints: list[CheckpointInfo], loss: Sequence[Point], selected: int | None
) -> list[tuple[str, str, str, list[int], list[float]]]:
    """(label, marker, colour, steps, ys) per kind of checkpoint, in drawing order (the selected one last, on top)."""
    kinds = {
        "saved": ("saved", "dot", "cyan"),
        "kept": ("kept", "hd", "magenta"),
        "incomplete": ("incomplete", "x", "red"),
        "best": ("best", "hd", "green"),
        "selected": ("selected", "sd", "yellow"),
    }
    points: dict[str, tuple[list[int], list[float]]] = {k: ([], []) for k in kinds}
    for ckpt in checkpoints:
        y = marker_y(ckpt, loss)
        if y is None:
            continue
        kind = (
            "selected"
            if ckpt.step == selected
            else "incomplete"
            if not ckpt.complete
            else "best"
            if ckpt.is_best
            else "kept"
            if ckpt.kept
            else "saved"
        )
        points[kind][0].append(ckpt.step)
        points[kind][1].append(y)
    return [(*kinds[k], *points[k]) for k in kinds if points[k][0]]


class CheckpointTimeline(PlotextPlot):
    """Plain data in (curves as [[step, value]], checkpoints as the agent lists them); redraws only on change."""

    DEFAULT_CSS = """
    CheckpointTimeline { height: 1fr; min-height: 10; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._shown: Any = None
        self.shown_curve: Sequence[Point] = ()  # the loss points drawn now

    def show(
        self,
        title: str,
        loss: Sequence[Point],
        eval_loss: Sequence[Point],
        checkpoints: list[CheckpointInfo],
        selected: int | None,
    ) -> None:
        data = (title, loss, eval_loss, [(c.step, c.loss, c.is_best, c.kept, c.complete) for c in checkpoints], selected)
        if data == self._shown:
            return
        self._shown = data
        self.shown_curve = loss
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(visible(title))  # the run's name is the agent's: plotext's output is read back as ANSI
        plt.xlabel("step")
        if loss:
            plt.plot([p[0] for p in loss], [p[1] for p in loss], label="loss", color="blue", marker="braille")
        if eval_loss:
            plt.plot([p[0] for p in eval_loss], [p[1] for p in eval_loss], label="eval loss", color="orange", marker="braille")
        for label, marker, colour, steps, ys in marker_groups(checkpoints, loss, selected):
            plt.scatter(steps, ys, label=label, marker=marker, color=colour)
        steps = [p[0] for p in (*loss, *eval_loss)] + [c.step for c in checkpoints]
        if steps:  # plotext would pick fractional ticks (2.5) for a short run: steps are whole
            ticks: list[float] = list(
                step_ticks(int(min(steps)), int(max(steps)))
            )  # plotext's type: whole numbers are drawn whole
            plt.xticks(ticks)
        self.refresh()
