"""A saving far below -100% is said as times the cloud's price."""

from __future__ import annotations


def test_a_saving_far_below_minus_100_percent_is_said_as_times_the_cloud():
    """A tiny cloud equivalent against idle power gave "-1276%"."""
    from widgets.format import fmt_saving

    assert [fmt_saving(p) for p in (70.0, -40.0, -1276.0, None)] == ["70%", "-40%", "14x cloud", "-"]
