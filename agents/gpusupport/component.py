"""The agent's GPU support check: the `gpu_support` section (every GPU x every stack) and the refusals before a launch.

Real GPUs (NVML) are judged against the stacks installed here, read in subprocesses (in threads, with a timeout) and cached;
the event loop never waits on one: a stack not read yet is unknown, never refused. Simulated machines are judged
against the stacks their lab.yaml entry declares (`gpus.stacks`, else a lab installed as docs/engines.md ("Older GPUs") says),
labelled SIM: their trainers really run on the CPU, so the check plays what the real lab would do, nothing more.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TYPE_CHECKING, Any

from agents.gpusupport.matrix import judge, matrix
from agents.gpusupport.stacks import real_stacks, sim_stacks
from agents.orchestra.port import ModelsPort
from agents.runtime.hooks import Hooks
from agents.runtime.torch_probe import TorchReader, python_of
from agents.wire.catalogue.agent import GPUS_SUPPORT
from agents.wire.catalogue.method import NoParams
from agents.wire.lab.machines import SimGpus
from agents.wire.lab.model import Model
from agents.wire.protocol import ErrorCode, GpuSample, RemoteError
from agents.wire.sections.gpu_support import GpuSupportSection, Stack, StackKind, Verdict

if TYPE_CHECKING:
    from agents.runtime.core import AgentCore
    from agents.runtime.rpc import Peer

log = logging.getLogger("cetlab.gpusupport")


class GpuSupportComponent(Hooks):
    name = "gpu_support"

    def __init__(self, core: AgentCore, reader: TorchReader | None = None) -> None:
        self.core = core
        self.reader = reader or TorchReader()
        self.peek = self.reader.peeking()  # what the event loop reads: never a subprocess waited on
        self._stacks: dict[StackKind, Stack] | None = None  # None until read (real machines read them in a thread at start)
        self._task: asyncio.Task[None] | None = None
        self._cached: tuple[Any, GpuSupportSection] | None = None
        gpus = core.machine.gpus
        if isinstance(gpus, SimGpus):
            self._stacks = sim_stacks(gpus.stacks)

        @core.rpc.implements(GPUS_SUPPORT)
        async def support(peer: Peer, _params: NoParams) -> GpuSupportSection:
            if self._stacks is None and self._task is not None:
                await asyncio.shield(self._task)
            return self.section()

    async def start(self) -> None:
        if self._stacks is None:  # a real machine: its stacks are read in a thread (subprocesses), cached
            self._task = asyncio.get_running_loop().create_task(self._read(), name="gpu-support-read")

    async def _read(self) -> None:
        try:
            models = self.core.find(ModelsPort)
            engine_stacks = models.engine_stacks if models is not None else lambda reader: []
            pythons = self._trainer_pythons()
            first = pythons[0] if pythons else None
            self._stacks = await asyncio.to_thread(lambda: real_stacks(self.reader, engine_stacks(self.reader), first))
            self._cached = None
            for python in pythons[1:]:  # read now, so a launch's check finds them read
                await asyncio.to_thread(self.reader.probe, python)
        except Exception:
            log.exception("reading this machine's stacks failed; no GPU support check")

    def _trainer_pythons(self) -> list[str]:
        """The Pythons this machine's recipes run, in lab.yaml's order (the first is the section's trainer torch)."""
        machine = self.core.machine.name
        found = [python_of(t.command[0]) for t in self.core.lab.trainers if t.machine == machine]
        return list(dict.fromkeys(p for p in found if p is not None))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    # -- the section

    def _gpus(self) -> list[GpuSample]:
        latest = self.core.latest
        return list(latest.gpus) if latest is not None else []

    def section(self) -> GpuSupportSection:
        gpus = self._gpus()
        stacks = list((self._stacks or {}).values())
        key = (tuple((g.index, g.name, g.compute_capability, g.simulated, g.failed) for g in gpus), id(self._stacks))
        if self._cached is None or self._cached[0] != key:
            self._cached = (
                key,
                GpuSupportSection(
                    stacks=stacks, verdicts=matrix(self.core.machine.name, gpus, stacks), simulated=self.core.machine.simulated
                ),
            )
        return self._cached[1]

    # -- refusals before a launch

    def _sim_stack(self, kind: StackKind) -> Stack | None:
        """A simulated machine's declared stack of that kind (its engines' SIM stack is the engine's own)."""
        if not isinstance(self.core.machine.gpus, SimGpus):
            return None
        return (self._stacks or sim_stacks(self.core.machine.gpus.stacks)).get(kind)

    def _refuse(self, gpus: list[int], stack: Stack, for_model: bool, what: str) -> None:
        by_index = {g.index: g for g in self._gpus()}
        for index in gpus:
            gpu = by_index.get(index)
            if gpu is None or gpu.failed is not None:
                continue
            verdict = judge(self.core.machine.name, index, gpu.name, gpu.compute_capability, stack, gpu.simulated, for_model)
            if verdict.runs is False:
                raise RemoteError(ErrorCode.UNAVAILABLE, f"{what} refused: {verdict.message}", {"gpu_support": verdict.to_wire()})

    def check_job(self, recipe: str, gpus: list[int], program: str) -> None:  # GpuSupportPort
        """Refuse a trainer whose Python's torch has no kernels for one of its GPUs (a program that is not Python: not checked)."""
        if not gpus:
            return
        simulated = isinstance(self.core.machine.gpus, SimGpus)
        python = None if simulated else python_of(program)
        if python is None and not simulated:
            return
        stack = self._sim_stack(StackKind.TORCH) if simulated else self.peek.stack(python or sys.executable)
        if stack is not None:
            self._refuse(gpus, stack, False, f"recipe {recipe}")

    def check_model(self, model: Model, gpus: list[int]) -> None:  # GpuSupportPort
        """Refuse a model whose engine's build cannot run on one of its GPUs (the model pool's engine reads its build)."""
        models = self.core.find(ModelsPort)
        if not gpus or models is None:
            return
        kind = models.engine_stack_kind(model.engine)
        if kind is None:
            return  # an engine whose stack is not known (engine: command): not checked
        if kind != StackKind.SIM and isinstance(self.core.machine.gpus, SimGpus):
            stack = self._sim_stack(kind)  # a simulated machine plays the stack its lab.yaml entry declares
        else:
            stack = models.engine_stack(model.engine, self.peek)
        if stack is not None:
            self._refuse(gpus, stack, True, f"model {model.name} (engine {model.engine})")

    def verdicts(self, index: int) -> list[Verdict]:
        return self.section().for_gpu(index)
