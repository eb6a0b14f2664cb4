"""Placement: whether a model's VRAM estimate fits the GPUs it would run on, from the last sample and what moved since."""

from __future__ import annotations

import asyncio

from agents.orchestra.slot import Slot, gib_text
from agents.runtime.core import AgentCore
from agents.wire.protocol import ErrorCode, RemoteError, Telemetry
from agents.wire.states import MODEL_ENGINE_UP, ModelState

HeldAtSample = tuple[
    tuple[int, ...], dict[int, int], bool
]  # a model's GPUs, bytes per GPU, and whether NVML could not see it yet


class Placement:
    """Free VRAM per GPU and the fit check before a model comes up, from the last sample and what our models did since."""

    def __init__(self, core: AgentCore, slots: dict[str, Slot]) -> None:
        self.core = core
        self.slots = slots
        self.held_at_sample: dict[str, HeldAtSample] = {}
        self.sampled = asyncio.Event()  # placement needs one GPU sample first

    def observe(self, telemetry: Telemetry) -> None:
        """What our models held when this sample was taken: placement adds what changed since."""
        nvml = not telemetry.simulated
        for s in self.slots.values():  # a loading model is still growing: it keeps its estimate until it is up
            measurable = nvml and s.engine is not None and s.state in MODEL_ENGINE_UP and s.state != ModelState.LOADING
            s.measured = s.engine.vram_by_gpu(telemetry.gpus) if measurable and s.engine is not None else None
        self.held_at_sample = {
            s.name: (tuple(s.gpus), {i: s.held_bytes(i) for i in s.gpus}, nvml and s.state == ModelState.LOADING)
            for s in self.slots.values()
        }
        self.sampled.set()

    def free_bytes(self, index: int, after: dict[str, int], starting: str | None = None) -> int:
        """Free memory of one GPU: the last sample, corrected by what our models changed since
        and by what the models in ``after`` will hold per GPU once the operation has moved them. ``starting``: a model
        marked loading whose engine has not started yet (nothing of it is in any sample): left out."""
        telemetry = self.core.latest
        gpu = next((g for g in telemetry.gpus if g.index == index), None) if telemetry else None
        if gpu is None or gpu.failed or gpu.mem_total_bytes is None or gpu.mem_used_bytes is None:
            why = gpu.failed if gpu is not None and gpu.failed else "not reported"
            raise RemoteError(
                ErrorCode.UNAVAILABLE, f"GPU {index} of {self.core.machine.name} is {why}: cannot place a model there"
            )
        free = gpu.mem_total_bytes - gpu.mem_used_bytes
        for slot in self.slots.values():
            if slot.name == starting:
                continue
            gpus, held, invisible = self.held_at_sample.get(slot.name, ((), {}, False))
            if index in gpus and not invisible:
                free += held.get(index, 0)
            if index in slot.gpus:
                free -= after.get(slot.name, slot.held_bytes(index))
        return free

    def check_fit(self, slot: Slot, gpus: list[int], after: dict[str, int] | None = None) -> None:
        """Refuse (CONFLICT, saying how much is missing) when the model's VRAM estimate does not fit."""
        if not gpus or not slot.need.bytes or slot.model.rpc:
            return  # unknown (files missing or unreadable): the start says why; a spread model's share per GPU is known once its helpers say theirs: its bring-up checks it
        after = {**(after or {}), slot.name: 0}
        need = slot.need.per_gpu(len(gpus))
        for index in gpus:
            free = self.free_bytes(index, after)
            if free < need:
                holders = [s.name for s in self.slots.values() if index in s.gpus and s.held_bytes() and s.name not in after]
                hint = (
                    f"; GPU {index} holds {', '.join(holders)}: `cetlab swap {holders[0]} {slot.name}` or `cetlab sleep {holders[0]}`"
                    if holders
                    else ""
                )
                if slot.need.source != "lab.yaml":
                    hint += f" (its need is {slot.need.source}: vram_gib in lab.yaml overrides it)"
                raise RemoteError(
                    ErrorCode.CONFLICT,
                    f"{slot.name} needs {gib_text(need)} on GPU {index} of {self.core.machine.name}, {gib_text(max(0, free))} free: "
                    f"{gib_text(need - max(0, free))} missing{hint}",
                    {"gpu": index, "need_bytes": need, "free_bytes": free, "missing_bytes": need - free},
                )
