"""Rotation: planning which models go out, come in or swap on the same GPUs, and running the plan."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pydantic import ValidationError

from agents.orchestra.book import PoolBook
from agents.orchestra.engines import engine_spec
from agents.orchestra.lifecycle import Lifecycle
from agents.orchestra.slot import Slot
from agents.runtime.core import AgentCore
from agents.wire.events import NoticeLevel
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.models import RotationRun
from agents.wire.states import MODEL_HOLDS_GPU, ModelState

log = logging.getLogger("cetlab.orchestra")


@dataclass(frozen=True)
class Candidate:
    """A model as the planner sees it: where it runs now, or would run, and whether it sleeps there."""

    name: str
    gpus: tuple[int, ...]
    sleeping: bool = False


@dataclass
class Moves:
    swaps: list[tuple[str, str]] = field(default_factory=list)  # (out, in) sharing GPUs
    out: list[str] = field(default_factory=list)  # put to sleep (or stopped)
    up: list[str] = field(default_factory=list)  # brought up on their own GPUs


def plan_moves(up: list[Candidate], target: set[str], pinned: set[str], rest: list[Candidate]) -> Moves:
    """Moves from the models up now to the target set; pinned models never go out.

    A model coming in takes the GPUs of one going out when it can: a sleeping model only
    on the GPUs it sleeps on, a cold one on any set of the same size. Unpaired models
    go out or come up on their own.
    """
    outs = [c for c in up if c.name not in target and c.name not in pinned]
    up_names = {c.name for c in up}
    ins = [c for c in rest if c.name in target and c.name not in up_names]
    moves = Moves()
    for incoming in ins:
        match = None
        for outgoing in outs:
            if incoming.sleeping:
                if set(incoming.gpus) <= set(outgoing.gpus):
                    match = outgoing
                    break
            elif len(outgoing.gpus) == len(incoming.gpus):
                match = outgoing
                break
        if match is None:
            moves.up.append(incoming.name)
        else:
            outs.remove(match)
            moves.swaps.append((match.name, incoming.name))
    moves.out = [c.name for c in outs]
    return moves


def rotation_run(record: Any) -> RotationRun | None:
    """The last rotation as state.db kept it (None when there was none, or the record does not read)."""
    if record is None:
        return None
    try:
        return RotationRun.model_validate(record)
    except ValidationError:
        log.warning("the last rotation's record in state.db does not read; left out: %r", record)
        return None


class Rotation:
    """The rotation plan of lab.yaml and the start-up plan, run on the pool through its lifecycle."""

    def __init__(self, core: AgentCore, book: PoolBook, lifecycle: Lifecycle) -> None:
        self.core = core
        self.book = book
        self.lifecycle = lifecycle
        self.index = -1  # -1: the start set (orchestra.warm); then positions in orchestra.rotation
        self.next_at: float | None = None
        self.last: RotationRun | None = None  # what the last rotation did (models.rotation's `last`)
        self.task: asyncio.Task[RotationRun] | None = None
        # the start-up plan has brought its models up (or given up on them): a timed rotation waits for it, so that
        # the plan's own warm of a model never races a swap that takes the same GPU
        self.plan_done = False

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    async def rotate(self) -> RotationRun:
        """Move to the next warm set of the plan: swaps on shared GPUs first, then the rest.

        Only models named in the plan's sets go out: one in no set (a model warmed by hand, a
        served checkpoint) and one an operator warmed stay up, unless `orchestra.rotation_takes_all`.
        """
        plan = self.core.lab.orchestra
        self.index = (self.index + 1) % len(plan.rotation)
        target = set(plan.rotation[self.index]) | {s.name for s in self.book.slots.values() if s.pinned}
        if plan.rotation_takes_all:
            held = {s.name for s in self.book.slots.values() if s.pinned}
        else:
            planned = {name for names in plan.rotation for name in names}
            held = {s.name for s in self.book.slots.values() if s.pinned or s.operator_warm or s.name not in planned}
        up = [Candidate(s.name, tuple(s.gpus)) for s in self.book.slots.values() if s.state in MODEL_HOLDS_GPU]
        rest = [
            Candidate(s.name, tuple(s.gpus if s.state == ModelState.SLEEPING else s.model.gpus), s.state == ModelState.SLEEPING)
            for s in self.book.slots.values()
            if s.state not in MODEL_HOLDS_GPU
        ]
        moves = plan_moves(up, target, held, rest)
        started, problems = time.monotonic(), list[str]()

        async def run(task_factory: Callable[[], asyncio.Task[Any] | None]) -> None:
            try:
                task = task_factory()
                if task is not None:
                    await task
            except RemoteError as exc:
                problems.append(exc.message)

        for out, incoming in moves.swaps:
            await run(lambda: self.lifecycle.swap(self.book.slots[out], self.book.slots[incoming], rotation=True))
        for name in moves.out:
            slot = self.book.slots[name]
            await run(
                lambda: self.lifecycle.begin(
                    [slot], "sleep" if slot.engine and slot.engine.can_sleep else "cold", lambda: self.lifecycle.free(slot)
                )
            )
        for name in moves.up:
            await run(lambda: self.lifecycle.warm(self.book.slots[name]))
        failed = [n for n in target if n in self.book.slots and self.book.slots[n].state != ModelState.WARM]
        duration_s = time.monotonic() - started
        self.book.unavailable_s += duration_s
        self.last = last = RotationRun(
            t=time.time(),
            index=self.index,
            duration_s=round(duration_s, 3),
            swaps=moves.swaps,
            out=moves.out,
            up=moves.up,
            not_warm=failed,
            problems=problems,
        )
        self.book.kv_save(
            rotation_index=self.index, unavailable_s=self.book.unavailable_s, last_rotation=last.model_dump(mode="json")
        )
        level: NoticeLevel = "warning" if failed or problems else "info"
        self.book.notice(
            level,
            f"rotation {self.index} on {self.core.machine.name} took {duration_s:.1f} s"
            + (f"; not warm: {', '.join(failed)}" if failed else ""),
        )
        return last

    def start(self) -> asyncio.Task[RotationRun]:
        if self.task is not None and not self.task.done():
            raise RemoteError(ErrorCode.CONFLICT, "a rotation is running")
        self.task = asyncio.get_running_loop().create_task(self.rotate(), name="rotation")
        return self.task

    async def bring_up_plan(self) -> None:
        """At start: pre-read `cached`, bring up `warm` (or the plan's current set) and pins, then `sleeping`."""
        try:
            await self._bring_up_plan()
        finally:
            self.plan_done = True

    async def _bring_up_plan(self) -> None:
        await self.lifecycle.placement.sampled.wait()
        plan = self.core.lab.orchestra
        warm = set(plan.rotation[self.index % len(plan.rotation)] if plan.rotation and self.index >= 0 else plan.warm)
        warm |= {s.name for s in self.book.slots.values() if s.pinned}

        def mine(names: Iterable[str]) -> list[Slot]:
            return [self.book.slots[n] for n in names if n in self.book.slots]

        # an engine with no sleep mode (llama.cpp) cannot be brought up and put to sleep: its files are kept in RAM instead
        sleepless = [s for s in mine(plan.sleeping) if s.name not in warm and not engine_spec(s.model.engine).can_sleep]
        for slot in sleepless:
            log.info("start-up plan: %s: engine %s has no sleep mode; cached instead of sleeping", slot.name, slot.model.engine)
        for slot in mine(plan.cached) + sleepless:
            await self._try(slot, lambda: self.lifecycle.cache(slot))
        await asyncio.gather(*(self._try(s, partial(self.lifecycle.warm, s)) for s in mine(sorted(warm))))
        sleeping = [s for s in mine(plan.sleeping) if s.name not in warm and s not in sleepless]
        await asyncio.gather(*(self._try(s, partial(self.lifecycle.warm, s)) for s in sleeping))
        for slot in sleeping:  # an operator who asked for it warm meanwhile wins over the plan
            if slot.state == ModelState.WARM and not slot.operator_warm:
                await self._try(slot, lambda: self.lifecycle.sleep(slot))

    async def _try(self, slot: Slot, step: Callable[[], Any]) -> None:
        """Run a start-up step; a model that cannot come up is reported, the rest go on."""
        try:
            task = step()
            if asyncio.iscoroutine(task):
                task = await task
            if task is not None:
                await task
        except RemoteError as exc:
            log.warning("start-up plan: %s: %s", slot.name, exc.message)
            self.book.notice("warning", f"{slot.name}: {exc.message}")
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the plan itself is being stopped
            # the model's own operation was cancelled (its engine died, and it is failed with that error): the plan goes on
            log.warning("start-up plan: %s stopped while coming up (%s)", slot.name, slot.state)
