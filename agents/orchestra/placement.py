"""Placement: whether a model's VRAM estimate fits the GPUs it would run on, from the last sample and what moved since."""

from __future__ import annotations

from agents.orchestra.engine import GIB
from agents.orchestra.slot import Slot, gib_text
from agents.protocol import ErrorCode, RemoteError


class PlacementMixin:
    """Part of OrchestraComponent: free VRAM per GPU and the fit check before a model comes up."""

    def _free_bytes(self, index: int, after: dict[str, int]) -> int:
        """Free memory of one GPU: the last sample, corrected by what our models changed since
        and by what the models in ``after`` will hold per GPU once the operation has moved them."""
        telemetry = self.agent.latest
        gpu = next((g for g in telemetry.gpus if g.index == index), None) if telemetry else None
        if gpu is None or gpu.failed or gpu.mem_total_bytes is None or gpu.mem_used_bytes is None:
            why = gpu.failed if gpu is not None and gpu.failed else "not reported"
            raise RemoteError(ErrorCode.UNAVAILABLE, f"GPU {index} of {self.agent.machine.name} is {why}: cannot place a model there")
        free = gpu.mem_total_bytes - gpu.mem_used_bytes
        for slot in self.slots.values():
            gpus, held, invisible = self._held_at_sample.get(slot.name, ((), {}, False))
            if index in gpus and not invisible:
                free += held.get(index, 0)
            if index in slot.gpus:
                free -= after.get(slot.name, slot.held_bytes(index))
        return free

    def _check_fit(self, slot: Slot, gpus: list[int], after: dict[str, int] | None = None) -> None:
        """Refuse (CONFLICT, saying how much is missing) when the model's VRAM estimate does not fit."""
        if not gpus or not slot.model.vram_gib:
            return
        after = {**(after or {}), slot.name: 0}
        need = int(slot.model.vram_gib * GIB / len(gpus))
        for index in gpus:
            free = self._free_bytes(index, after)
            if free < need:
                holders = [s.name for s in self.slots.values() if index in s.gpus and s.held_bytes() and s.name not in after]
                hint = (f"; GPU {index} holds {', '.join(holders)}: `cetlab swap {holders[0]} {slot.name}` or `cetlab sleep {holders[0]}`"
                        if holders else "")
                raise RemoteError(
                    ErrorCode.CONFLICT,
                    f"{slot.name} needs {gib_text(need)} on GPU {index} of {self.agent.machine.name}, {gib_text(max(0, free))} free: "
                    f"{gib_text(need - max(0, free))} missing{hint}",
                    {"gpu": index, "need_bytes": need, "free_bytes": free, "missing_bytes": need - free},
                )
