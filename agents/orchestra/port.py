"""What others ask of the model pool. The SSH server asks which local ports are engines (gateway forwards go only there).

The orchestra's owner extends this Protocol with what the jobs, the checkpoints and the gateway call."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class ModelsPort(Protocol):
    def engine_ports(self) -> frozenset[int]:
        """The 127.0.0.1 ports the engines of this machine listen on."""
        ...
