"""The model pool ("orchestra"): engines, page-cache warming, placement and rotation."""

from agents.orchestra.pool import OrchestraComponent

__all__ = ["OrchestraComponent"]
