"""The model pool ("orchestra"): engines, page-cache warming, placement and rotation."""
