"""The command engine: any OpenAI-compatible server, from the command line lab.yaml gives it (engine: command).

lab.yaml names the server's argv (`command:`) with placeholders the agent fills in at each start: {socket} (a unix
socket path in the agent's private folder: no other user of the machine reaches the server), or {port} (the port it
picked, or the model's `port:`, on 127.0.0.1, which any local user reaches: the doctor warns), {model} (the model's
path, resolved against the lab file), {gpus} (its GPUs, "0,1"; empty without) and {name} (its served name). The agent polls `health_path` until it answers 200, sends the
warm-up completion, and on a cold runs `stop_command` (same placeholders) when there is one, then stops the process
group as it stops any engine. Nothing about the server is known beyond that: no sleep mode (a cold stops it; its
weights stay in the page cache), no adapters, no /metrics figures (the gateway meters tokens from its /v1 answers),
and no GPU stack to check.

The command must listen on {socket} or bind 127.0.0.1, and may name no wildcard address (agents.wire.lab.loopback
checks it when lab.yaml is read); the gateway reaches it through the agent's tunnel as it reaches every engine.
"""

from __future__ import annotations

import asyncio
import logging
import shutil

from agents.orchestra.engine import STOP_GRACE_S, Engine, EngineDown, EngineRequestFailed
from agents.orchestra.spec import EngineSpec
from agents.runtime.waits import within
from agents.wire.lab.model import Model
from agents.wire.protocol import ErrorCode, RemoteError

log = logging.getLogger("cetlab.orchestra")

COMMAND_SPEC = EngineSpec(
    serves=("chat", "embedding", "rerank"),  # any OpenAI-compatible server: its command line says what it serves
    name="command",
    title="a server's command line",
    free_mode="stop",
    adapters="none",
    multi_gpu="command",
    model_formats=("hf", "gguf"),  # the server reads what it reads: the agent only hands it the path
    gpu_stack=None,
)


class CommandEngine(Engine):
    spec = COMMAND_SPEC

    def fill(self, argv: list[str]) -> list[str]:
        """The argv with its placeholders filled in; other braces are left as the operator wrote them."""
        values = {
            "{socket}": self.address.socket or "",
            "{port}": str(self.address.port or ""),
            "{model}": str(self.path),
            "{gpus}": ",".join(str(g) for g in self.gpus),
            "{name}": self.served_name,
        }
        filled = []
        for arg in argv:
            for key, value in values.items():
                arg = arg.replace(key, value)
            filled.append(arg)
        return filled

    @classmethod
    def on_socket(cls, model: Model) -> bool:
        return any("{socket}" in arg for arg in model.command)  # else it binds 127.0.0.1:{port}: the doctor warns

    def check(self) -> None:
        program = self.model.command[0]
        if shutil.which(program) is None:
            raise RemoteError(
                ErrorCode.UNAVAILABLE,
                f"model {self.model.name}: {program!r} is not a command on {self.machine} (engine: command)",
            )

    def argv(self) -> list[str]:
        return self.fill([*self.model.command, *self.model.args])

    async def health(self) -> bool:
        try:
            await self.http("GET", self.model.health_path, timeout_s=2.0)
            return True
        except (EngineDown, EngineRequestFailed):
            return False

    async def sleep(self, level: int) -> None:
        raise EngineRequestFailed("engine: command has no sleep mode; the pool stops it (cold) instead")

    async def wake(self) -> None:
        raise EngineRequestFailed("engine: command has no wake; the pool starts it again")

    async def stop(self) -> None:
        """The stop command first, where lab.yaml gives one, then the process group as for any engine."""
        proc = self.proc
        if self.model.stop_command and proc is not None and proc.returncode is None:
            self.stopping = True
            try:
                stopper = await asyncio.create_subprocess_exec(
                    *self.fill(self.model.stop_command),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                await within(stopper.wait(), STOP_GRACE_S)
                await within(proc.wait(), STOP_GRACE_S)
            except (OSError, TimeoutError) as exc:
                log.warning("model %s: its stop command did not stop it (%s); stopping its processes", self.model.name, exc)
        await super().stop()
