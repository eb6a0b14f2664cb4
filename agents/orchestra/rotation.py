"""Rotation: planning which models go out, come in or swap on the same GPUs, and running the plan."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from agents.orchestra.engines import engine_spec
from agents.orchestra.slot import Slot
from agents.protocol import ErrorCode, RemoteError
from agents.states import MODEL_HOLDS_GPU, ModelState

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


class RotationMixin:
    """Part of OrchestraComponent: the rotation plan of lab.yaml and the start-up plan, run on the pool."""

    async def rotate(self) -> dict[str, Any]:
        """Move to the next warm set of the plan: swaps on shared GPUs first, then the rest.

        Only models named in the plan's sets go out: one in no set (a model warmed by hand, a
        served checkpoint) and one an operator warmed stay up, unless `orchestra.rotation_takes_all`.
        """
        plan = self.agent.lab.orchestra
        self.rotation_index = (self.rotation_index + 1) % len(plan.rotation)
        target = set(plan.rotation[self.rotation_index]) | {s.name for s in self.slots.values() if s.pinned}
        if plan.rotation_takes_all:
            held = {s.name for s in self.slots.values() if s.pinned}
        else:
            planned = {name for names in plan.rotation for name in names}
            held = {s.name for s in self.slots.values() if s.pinned or s.operator_warm or s.name not in planned}
        up = [Candidate(s.name, tuple(s.gpus)) for s in self.slots.values() if s.state in MODEL_HOLDS_GPU]
        rest = [Candidate(s.name, tuple(s.gpus if s.state == ModelState.SLEEPING else s.model.gpus), s.state == ModelState.SLEEPING)
                for s in self.slots.values() if s.state not in MODEL_HOLDS_GPU]
        moves = plan_moves(up, target, held, rest)
        started, problems = time.monotonic(), []

        async def run(task_factory: Callable[[], asyncio.Task | None]) -> None:
            try:
                task = task_factory()
                if task is not None:
                    await task
            except RemoteError as exc:
                problems.append(exc.message)

        for out, incoming in moves.swaps:
            await run(lambda: self.swap(self.slots[out], self.slots[incoming], rotation=True))
        for name in moves.out:
            slot = self.slots[name]
            await run(lambda: self._begin([slot], "sleep" if slot.engine and slot.engine.can_sleep else "cold", lambda: self._free(slot)))
        for name in moves.up:
            await run(lambda: self.warm(self.slots[name]))
        failed = [n for n in target if n in self.slots and self.slots[n].state != ModelState.WARM]
        duration_s = time.monotonic() - started
        self.unavailable_s += duration_s
        self.last_rotation = {
            "t": time.time(), "index": self.rotation_index, "duration_s": round(duration_s, 3),
            "swaps": moves.swaps, "out": moves.out, "up": moves.up, "not_warm": failed, "problems": problems,
        }
        self._kv_save(rotation_index=self.rotation_index, unavailable_s=self.unavailable_s, last_rotation=self.last_rotation)
        level = "warning" if failed or problems else "info"
        self._notice(level, f"rotation {self.rotation_index} on {self.agent.machine.name} took {duration_s:.1f} s"
                     + (f"; not warm: {', '.join(failed)}" if failed else ""))
        return self.last_rotation

    def _start_rotation(self) -> asyncio.Task:
        if self._rotation_task is not None and not self._rotation_task.done():
            raise RemoteError(ErrorCode.CONFLICT, "a rotation is running")
        self._rotation_task = asyncio.get_running_loop().create_task(self.rotate(), name="rotation")
        return self._rotation_task

    async def _bring_up_plan(self) -> None:
        """At start: pre-read `cached`, bring up `warm` (or the plan's current set) and pins, then `sleeping`."""
        await self._sampled.wait()
        plan = self.agent.lab.orchestra
        warm = set(plan.rotation[self.rotation_index % len(plan.rotation)] if plan.rotation and self.rotation_index >= 0 else plan.warm)
        warm |= {s.name for s in self.slots.values() if s.pinned}
        mine = lambda names: [self.slots[n] for n in names if n in self.slots]  # noqa: E731
        # an engine with no sleep mode (llama.cpp) cannot be brought up and put to sleep: its files are kept in RAM instead
        sleepless = [s for s in mine(plan.sleeping) if s.name not in warm and not engine_spec(s.model.engine).can_sleep]
        for slot in sleepless:
            log.info("start-up plan: %s: engine %s has no sleep mode; cached instead of sleeping", slot.name, slot.model.engine)
        for slot in mine(plan.cached) + sleepless:
            await self._try(slot, lambda: self.cache(slot))
        await asyncio.gather(*(self._try(s, lambda s=s: self.warm(s)) for s in mine(sorted(warm))))
        sleeping = [s for s in mine(plan.sleeping) if s.name not in warm and s not in sleepless]
        await asyncio.gather(*(self._try(s, lambda s=s: self.warm(s)) for s in sleeping))
        for slot in sleeping:  # an operator who asked for it warm meanwhile wins over the plan
            if slot.state == ModelState.WARM and not slot.operator_warm:
                await self._try(slot, lambda: self.sleep(slot))

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
            self._notice("warning", f"{slot.name}: {exc.message}")
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the plan itself is being stopped
            # the model's own operation was cancelled (its engine died, and it is failed with that error): the plan goes on
            log.warning("start-up plan: %s stopped while coming up (%s)", slot.name, slot.state)
