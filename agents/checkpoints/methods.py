"""The checkpoints.* methods and their params."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agents.runtime.rpc import Peer
from agents.wire.catalogue.checkpoints import (
    DeleteParams,
    KeepParams,
    PruneParams,
    ResumeParams,
    RunParams,
    ServeParams,
)
from agents.wire.protocol import Role

if TYPE_CHECKING:
    from agents.checkpoints.component import CheckpointsComponent


def register(component: CheckpointsComponent) -> None:
    """The checkpoints.* methods; the actions are the component's methods with the handler signature (peer, params)."""
    rpc = component.core.rpc
    actions, serving = component.actions, component.serving

    @rpc.method("checkpoints.runs", doc="Every run with checkpoints on this machine: counts, best, disk, save-time share.")
    async def runs(peer: Peer, _params) -> list:
        await component.rescan()
        return [run.to_wire() for run in component.section()]

    @rpc.method("checkpoints.list", params=RunParams, doc="One run's checkpoints (oldest first) and its loss curves.")
    async def list_(peer: Peer, params: RunParams) -> dict:
        run = await component.run(params.run)
        return {
            **run.summary(component.core.machine.name).to_wire(),
            "checkpoints": [c.to_json() for c in run.checkpoints],
            "curves": run.curves(),
        }

    rpc.method(
        "checkpoints.resume",
        role=Role.OPERATOR,
        params=ResumeParams,
        doc="A new job of the run's recipe, resuming from this checkpoint.",
    )(actions.resume)
    rpc.method(
        "checkpoints.serve",
        role=Role.OPERATOR,
        params=ServeParams,
        doc="Serve a checkpoint: adapter into a warm model, or as a new model.",
    )(serving.serve)
    rpc.method(
        "checkpoints.delete",
        role=Role.OPERATOR,
        params=DeleteParams,
        doc="Delete one checkpoint (the best or newest only with confirm_special).",
    )(actions.delete)
    rpc.method(
        "checkpoints.keep",
        role=Role.OPERATOR,
        params=KeepParams,
        doc="Mark a checkpoint kept (prune never deletes it), or un-keep it.",
    )(actions.keep)
    rpc.method(
        "checkpoints.prune",
        role=Role.OPERATOR,
        params=PruneParams,
        doc="Delete all but the best, the last N and the kept checkpoints.",
    )(actions.prune)
