"""The method catalogue: every RPC method with its params model, its result model, its role and its doc: a model spread
over several machines (llama.cpp's rpc-server on a helper machine, asked for by the model's machine with the node role)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from agents.wire.catalogue.method import OP, Method, Params
from agents.wire.schema import ModelName
from agents.wire.sections.base import Section

RPC_ERROR_CHARS = 4000
RPC_LINE_CHARS = 400
RPC_LAST_LINES = 20
MAX_HELPER_GPUS = 64
RpcState = Literal["stopped", "starting", "running", "exited", "failed"]


class RpcParams(Params):
    model: ModelName  # a model whose rpc: names this machine as a helper (this agent's own lab.yaml says so)


class RpcStartParams(RpcParams):
    # what the model's machine asks each of this machine's GPUs to hold of the model (its share, by memory); 0: unchecked
    need_bytes: int = Field(default=0, ge=0, le=1 << 50)


class RpcGpu(Section):
    index: int
    total_bytes: int | None = None
    free_bytes: int | None = None  # the last sample's, less what this agent's models hold since


class RpcServerStatus(Section):
    """A helper machine's rpc-server for one model: where it listens (127.0.0.1 only), and how it is."""

    model: str
    machine: str
    state: RpcState
    port: int | None = None  # on the helper's 127.0.0.1, reached through the caller's SSH link
    pid: int | None = None
    exit_code: int | None = None
    error: str | None = Field(default=None, max_length=RPC_ERROR_CHARS)
    gpus: list[RpcGpu] = Field(default_factory=list, max_length=MAX_HELPER_GPUS)
    cpu: bool = False  # no GPU lent (a CPU-only machine, or simulated GPUs): rpc-server runs its CPU backend
    last_lines: list[Annotated[str, Field(max_length=RPC_LINE_CHARS)]] = Field(default_factory=list, max_length=RPC_LAST_LINES)


MODELS_RPC_START = Method(
    "models.rpc_start",
    RpcStartParams,
    RpcServerStatus,
    OP,
    "Start this machine's rpc-server for a model that lab.yaml spreads over it (127.0.0.1 only); answers once it listens.",
)
MODELS_RPC_STOP = Method("models.rpc_stop", RpcParams, RpcServerStatus, OP, "Stop this machine's rpc-server for a model.")
MODELS_RPC_STATUS = Method(
    "models.rpc_status", RpcParams, RpcServerStatus, OP, "This machine's rpc-server for a model, and the GPUs it lends."
)
