"""The checkpoints.* methods and their params."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agents.runtime.rpc import Peer
from agents.wire.catalogue.checkpoints import (
    CHECKPOINTS_DELETE,
    CHECKPOINTS_KEEP,
    CHECKPOINTS_LIST,
    CHECKPOINTS_PRUNE,
    CHECKPOINTS_RESUME,
    CHECKPOINTS_RUNS,
    CHECKPOINTS_SERVE,
    Curves,
    RunCheckpoints,
    RunParams,
    RunSummaryList,
)
from agents.wire.catalogue.method import NoParams

if TYPE_CHECKING:
    from agents.checkpoints.component import CheckpointsComponent


def register(component: CheckpointsComponent) -> None:
    """The checkpoints.* methods; the actions are the component's methods with the handler signature (peer, params)."""
    rpc = component.core.rpc
    actions, serving = component.actions, component.serving

    @rpc.implements(CHECKPOINTS_RUNS)
    async def runs(peer: Peer, _params: NoParams) -> RunSummaryList:
        await component.rescan()
        return RunSummaryList(component.section())

    @rpc.implements(CHECKPOINTS_LIST)
    async def list_(peer: Peer, params: RunParams) -> RunCheckpoints:
        run = await component.run(params.run)
        return RunCheckpoints(
            **run.summary(component.core.machine.name).model_dump(),
            checkpoints=list(run.checkpoints),
            curves=Curves.model_validate(run.curves()),
        )

    rpc.implements(CHECKPOINTS_RESUME)(actions.resume)
    rpc.implements(CHECKPOINTS_SERVE)(serving.serve)
    rpc.implements(CHECKPOINTS_DELETE)(actions.delete)
    rpc.implements(CHECKPOINTS_KEEP)(actions.keep)
    rpc.implements(CHECKPOINTS_PRUNE)(actions.prune)
