"""What others read of the costs component (the Prometheus exposition): the ledger's totals."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pydantic import BaseModel


class LedgerTotal(BaseModel):
    """Energy and tokens served by one owner over the whole ledger."""

    kind: str  # host | job | model | other
    owner: str
    energy_j: float
    tokens: float = 0.0  # prompt and generated, of model rows


@runtime_checkable
class CostsPort(Protocol):
    def ledger_totals(self) -> list[LedgerTotal]: ...
