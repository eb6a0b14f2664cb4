"""The base of every section model, the secondary states (Literals) and the faults section."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agents.wire.protocol import Finite, FiniteFloat, GpuBackend

# A recipe's launch parameter (lab.yaml trainers[].params: int, float, str, bool, choice)
ParamValue = bool | int | Finite | str


# The secondary states: each the exact values its producer writes (tests/fast/wire/test_typed_state.py checks them against it)
ProgressState = Literal[
    "starting", "running", "saving", "finished", "failed"
]  # a trainer's progress file (agents/train/progress.py)


Precision = Literal["bf16", "fp16", "fp32"]  # what a run trains in (agents/train/precision.py)


StopRequest = Literal["stop", "kill"]  # stop: SIGTERM, then SIGKILL after the grace; kill: SIGKILL now


ModelOp = Literal["warm", "wake", "sleep", "swap", "cache", "cold"]  # the operation in flight on a model


ModelPhase = Literal["starting", "loading", "warm-up", "waking", "going to sleep", "stopping", "caching", "making the tiny model"]


CheckpointKind = Literal["adapter", "full", "unknown"]


SaveTimeSource = Literal["trainer", "file_times"]  # the trainer's progress reports, or the checkpoint's file times


AlertLevel = Literal["info", "warning", "critical"]


GatewayTier = Literal["local", "provider"]  # served in the lab, or a cloud provider's API


class Section(BaseModel):
    """A section model: extra keys are ignored on parsing, so an older console reads a newer agent."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class GpuStatus(Section):
    backend: GpuBackend
    status: str | None = None  # why there are no GPU figures, e.g. "NVML library not found"
    simulated: bool = False


ServingMode = Literal[
    "adapter", "merged", "full", "gguf-adapter"
]  # into a warm model; merged into its base; as it is; converted for llama.cpp


ServingStep = Literal["merging", "converting", "unloaded"]  # before its model exists; its adapter gone with a restarted engine


class SectionFault(Section):
    """A section whose component raised in this tick: consoles show it failed, with the error, until it recovers.

    The section's last value stays on the consoles, marked stale by this; the fault clears on the first tick
    in which the component updates and reports again without raising."""

    section: str  # the section's name, as in SECTION_MODELS (the component's name)
    # update: on_telemetry; read: on_tick; section: making its section; refused: a client refused it as sent (never on the wire)
    phase: Literal["update", "read", "section", "refused"]
    error: str  # "<exception type>: <message>", one line
    since: FiniteFloat  # agent's wall time of the first failing tick in a row


class FaultsSection(Section):
    failed: list[SectionFault] = Field(default_factory=list)  # one per failing section, by name

    def of(self, section: str) -> SectionFault | None:
        return next((f for f in self.failed if f.section == section), None)
