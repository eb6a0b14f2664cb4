"""What others read of the gateway (the costs component reports API spend): spend per provider, against its budget."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agents.wire.sections.costs import ProviderSpend


@runtime_checkable
class GatewayPort(Protocol):
    def provider_spend(self) -> list[ProviderSpend]:
        """Each cloud provider's spend this month against its budget; empty where this agent serves no gateway."""
        ...

    def spend_by_day(self, since_day: str) -> dict[str, dict[str, float]]:
        """Provider -> day (YYYY-MM-DD, the lab's day) -> money spent, from since_day on."""
        ...
