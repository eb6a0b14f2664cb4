"""A rotation's overhead in words, one answer for the CLI (`cetlab rotate`, `cetlab models`) and the Orchestra view."""

from __future__ import annotations

from agents.wire.sections.models import Rotation
from widgets.format import NA, fmt_duration


def overhead_words(rotation: Rotation) -> str:
    """The rotation's overhead as the CLI and the console say it: its share against the target, or, before one rotation
    period has passed, the seconds without its models so far (a share of a short window would alarm for nothing)."""
    if rotation.overhead_pct is None:
        return f"overhead {NA}"
    if not rotation.overhead_judged:
        return (
            f"{rotation.unavailable_s or 0:.1f} s without models in {fmt_duration(rotation.wall_s)}"
            f" (overhead judged after one {fmt_duration(rotation.every_s)} period; target < {rotation.target_pct or 0:g}%)"
        )
    window = f" of {fmt_duration(rotation.wall_s)}" if rotation.wall_s is not None else ""
    return f"overhead {rotation.overhead_pct:.3f}%{window} (target < {rotation.target_pct or 0:g}%)"
