"""The typed sections of a tick: one model per section, produced by the agent's components, parsed by consoles: costs."""

from __future__ import annotations

from pydantic import Field

from agents.wire.protocol import Finite, FiniteFloat
from agents.wire.sections.base import Section


class ProviderSpend(Section):
    """A provider's spend against its monthly budget (alerts fire at 80% and 100%)."""

    name: str
    simulated: bool = False
    spend_today: FiniteFloat = 0.0
    spend_month: FiniteFloat = 0.0
    monthly_budget: Finite = None
    budget_pct: Finite = None
    key_set: bool = True  # its api_key_env is set in the agent's environment (or none is needed)


class CostsSummary(Section):
    """The header's money figures of one machine, every tick."""

    currency: str
    power_w: Finite = None
    now_per_hour: Finite = None
    today: Finite = None
    month: Finite = None
    cloud_equivalent_month: Finite = None
    missing: list[str] = Field(default_factory=list)  # prices lab.yaml lacks
    simulated: bool = False
    api: list[ProviderSpend] = Field(default_factory=list)  # the gateway's machine: API spend per provider, against its budget
