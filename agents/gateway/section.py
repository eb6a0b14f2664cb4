"""The gateway's section of the tick, kept with every other section in agents/sections.py (names kept here for the gateway)."""

from agents.sections import GatewayModelFigures, GatewaySection, KeyUse, ProviderSpend

__all__ = ["GatewayModelFigures", "GatewaySection", "KeyUse", "ProviderSpend"]
