"""The model pool ("orchestra"): engines, page-cache warming, placement and rotation."""

from agents.orchestra.component import OrchestraComponent

__all__ = ["OrchestraComponent"]
