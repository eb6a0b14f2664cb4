"""Acting on checkpoints: delete, prune, keep, and resume a run from one."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from agents.checkpoints.catalog import RunCatalog
from agents.checkpoints.discovery import Run
from agents.checkpoints.parsing import CHECKPOINT_RE, Checkpoint
from agents.jobs.port import JobsPort
from agents.runtime.core import AgentCore
from agents.runtime.rpc import Peer
from agents.wire.catalogue.checkpoints import Deleted, Pruned, PrunedCheckpoint, Resumed
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.checkpoints import CheckpointInfo

if TYPE_CHECKING:
    from agents.wire.catalogue.checkpoints import DeleteParams, KeepParams, PruneParams, ResumeParams

log = logging.getLogger("cetlab.checkpoints")

RESUME_PARAM = "resume_from_checkpoint"  # the recipe param a resume fills in (cetlab-train's --resume-from-checkpoint)


def _pruned(ckpt: Checkpoint, reason: str) -> PrunedCheckpoint:
    return PrunedCheckpoint(**ckpt.model_dump(), reason=reason)


class CheckpointActions:
    """The operator's actions on checkpoints (the handlers of their methods: ``(peer, params)``), on the catalog."""

    def __init__(self, core: AgentCore, catalog: RunCatalog) -> None:
        self.core = core
        self.catalog = catalog

    def _delete_path(self, run: Run, ckpt: Checkpoint) -> None:
        path = Path(ckpt.path)
        # only a checkpoint-<step> folder right inside a watched run folder is ever removed
        if path.parent.resolve() != run.path or not CHECKPOINT_RE.match(path.name):
            raise RemoteError(ErrorCode.INVALID_PARAMS, f"{path} is not a checkpoint folder of run {run.name}")
        if path.is_symlink():
            path.unlink()
        else:
            shutil.rmtree(path)
        self.catalog.scanner.forget(str(path))

    @staticmethod
    def _refuse_linked(run: Run) -> None:
        """A run reached through a symlink lives outside the watched folders: cetlab deletes nothing there."""
        if run.link is not None:
            raise RemoteError(
                ErrorCode.CONFLICT,
                f"run {run.name} is the symlink {run.link} -> {run.path}, outside the watched folders; "
                "cetlab does not delete through symlinks: delete there by hand",
            )

    def _forget(self, paths: list[str]) -> None:
        with self.core.store.transaction() as db:
            db.executemany("DELETE FROM checkpoint_flags WHERE path=?", [(p,) for p in paths])
        self.catalog.kept -= set(paths)

    async def delete(self, peer: Peer, params: DeleteParams) -> Deleted:
        run = await self.catalog.run(params.run)
        self._refuse_linked(run)
        ckpt = run.by_step(params.step)
        if ckpt.in_use:
            raise RemoteError(ErrorCode.CONFLICT, f"checkpoint {ckpt.step} of {run.name} is in use: {ckpt.in_use}")
        special = [w for w, flag in (("the best", ckpt.is_best), ("the newest", ckpt.newest)) if flag]
        if special and not params.confirm_special:
            raise RemoteError(
                ErrorCode.CONFLICT,
                f"checkpoint {ckpt.step} is {' and '.join(special)} of run {run.name}; "
                "confirm to delete it anyway (confirm_special / --force)",
                {"special": special},
            )
        try:
            await asyncio.to_thread(self._delete_path, run, ckpt)
        except OSError as exc:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"cannot delete {ckpt.path}: {exc.strerror or exc}") from None
        self._forget([ckpt.path])
        self.catalog.event(run, ckpt, "delete", peer.who, {"size_bytes": ckpt.size_bytes, "special": special})
        log.info("%s deleted %s", peer.who, ckpt.path)
        await self.catalog.rescan()
        return Deleted(run=run.name, deleted=[ckpt], freed_bytes=ckpt.size_bytes)

    async def prune(self, peer: Peer, params: PruneParams) -> Pruned:
        run = await self.catalog.run(params.run)
        self._refuse_linked(run)
        complete = [c for c in run.checkpoints if c.complete]
        last = {c.path for c in complete[-params.keep_last :]} if params.keep_last else set()
        kept: list[PrunedCheckpoint] = []
        deleted: list[CheckpointInfo] = []
        skipped: list[PrunedCheckpoint] = []
        for ckpt in run.checkpoints:
            if not ckpt.complete:
                skipped.append(_pruned(ckpt, f"incomplete: {ckpt.problem}; delete it by hand if it is garbage"))
            elif ckpt.is_best or ckpt.path in last or ckpt.kept:
                kept.append(_pruned(ckpt, "best" if ckpt.is_best else "kept" if ckpt.kept else "last"))
            elif ckpt.in_use:
                skipped.append(_pruned(ckpt, ckpt.in_use))
            else:
                try:
                    await asyncio.to_thread(self._delete_path, run, ckpt)
                except OSError as exc:
                    skipped.append(_pruned(ckpt, f"cannot delete: {exc.strerror or exc}"))
                    continue
                deleted.append(ckpt)
        self._forget([c.path for c in deleted])
        freed = sum(c.size_bytes for c in deleted)
        self.catalog.event(
            run,
            None,
            "prune",
            peer.who,
            {"keep_last": params.keep_last, "deleted": [c.step for c in deleted], "freed_bytes": freed},
        )
        log.info("%s pruned run %s: deleted steps %s", peer.who, run.name, [c.step for c in deleted])
        await self.catalog.rescan()
        return Pruned(run=run.name, keep_last=params.keep_last, deleted=deleted, kept=kept, skipped=skipped, freed_bytes=freed)

    async def keep(self, peer: Peer, params: KeepParams) -> CheckpointInfo:
        run = await self.catalog.run(params.run)
        ckpt = run.by_step(params.step)
        with self.core.store.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO checkpoint_flags (path, kept, t) VALUES (?, ?, ?)",
                (ckpt.path, int(params.kept), time.time()),
            )
        (self.catalog.kept.add if params.kept else self.catalog.kept.discard)(ckpt.path)
        self.catalog.event(run, ckpt, "keep" if params.kept else "unkeep", peer.who)
        await self.catalog.rescan()
        return self.catalog.runs[run.name].by_step(ckpt.step)

    async def resume(self, peer: Peer, params: ResumeParams) -> Resumed:
        run, ckpt = await self.catalog.complete(params.run, params.step)
        jobs = self.core.find(JobsPort)
        recipe = next((r for r in self.core.lab.trainers if r.name == run.recipe and r.machine == self.core.machine.name), None)
        if jobs is None or recipe is None:
            raise RemoteError(
                ErrorCode.UNAVAILABLE,
                f"run {run.name} was not started from a recipe of {self.core.machine.name}; "
                f"resume it with its own trainer (--resume-from-checkpoint {ckpt.path})",
            )
        if not any(p.name == RESUME_PARAM for p in recipe.params):
            raise RemoteError(
                ErrorCode.UNAVAILABLE,
                f"recipe {recipe.name} declares no {RESUME_PARAM} param; add "
                f"{{name: {RESUME_PARAM}, type: str}} to its params in lab.yaml (cetlab-train takes --resume-from-checkpoint)",
            )
        previous = jobs.view(run.job).params if run.job else {}
        values = {**{k: v for k, v in previous.items() if k != RESUME_PARAM}, **params.params, RESUME_PARAM: ckpt.path}
        job = await jobs.launch(recipe.name, values)  # a multi-node recipe starts again over the same nodes
        self.catalog.event(run, ckpt, "resume", peer.who, {"job": job.id})
        log.info("%s resumed run %s from step %s as job %s", peer.who, run.name, ckpt.step, job.id)
        return Resumed(**job.model_dump(), resumed_from=ckpt)
