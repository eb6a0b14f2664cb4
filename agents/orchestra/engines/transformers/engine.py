"""The transformers engine: `transformers serve` for small models (CPU or one GPU); no sleep mode."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import sys
from pathlib import Path

from agents.orchestra.engine import Engine, InstallCheck
from agents.orchestra.spec import EngineSpec
from agents.runtime.torch_probe import TorchReader, python_of
from agents.wire.lab.model import Model
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.gpu_support import Stack, StackKind

# `transformers serve MODEL` takes the model as a positional argument from 5.5 and serves /v1/completions
# (the warm-up request) from 5.6; older versions exit 2 or fail the warm-up (pyproject pins the same).
SERVE_MIN_VERSION = (5, 6)


def transformers_cli() -> str | None:
    beside = Path(sys.executable).with_name("transformers")  # the venv the agent runs in first
    return str(beside) if beside.exists() else shutil.which("transformers")


def transformers_python() -> str:
    """The Python of `transformers serve` (the `transformers` beside the agent's Python first): its torch runs the model."""
    beside = Path(sys.executable).with_name("transformers")
    return python_of(beside) or sys.executable if beside.exists() else sys.executable


class TransformersEngine(Engine):
    # no sleep mode, no runtime adapters (a checkpoint is merged), one device; its GPU floor is the torch build's
    spec = EngineSpec(
        name="transformers",
        title="transformers serve",
        model_formats=("hf",),
        gpu_stack=StackKind.TORCH,
        # its UNUSED_CHAT_COMPLETION_FIELDS ("Receiving these raises an error"): tools it takes, into the template
        refuses_params=("response_format", "tool_choice", "logprobs", "top_logprobs", "parallel_tool_calls"),
    )

    @classmethod
    def stack(cls, reader: TorchReader) -> Stack:
        return reader.stack(transformers_python())

    @classmethod
    def install_check(cls, needed: bool) -> InstallCheck | None:
        """`transformers serve` as the engine drives it: a positional model (5.5) and /v1/completions (5.6)."""
        if not needed:
            return None
        wanted = ".".join(map(str, SERVE_MIN_VERSION))
        try:
            version = importlib.metadata.version("transformers")
        except importlib.metadata.PackageNotFoundError:
            return InstallCheck(
                "transformers",
                False,
                f"models use engine: transformers, which is not installed (pip install 'transformers[serving]>={wanted}')",
            )
        found = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
        if found < SERVE_MIN_VERSION:
            return InstallCheck(
                "transformers",
                False,
                f"{version}: `transformers serve` needs {wanted} or newer (a positional model, /v1/completions); "
                f"pip install -U 'transformers[serving]>={wanted}'",
            )
        return InstallCheck("transformers", True, f"{version} (`transformers serve` works from {wanted})")

    def check(self) -> None:
        if transformers_cli() is None:
            raise RemoteError(
                ErrorCode.UNAVAILABLE, f"transformers is not installed on {self.machine} (pip install 'transformers[serving]')"
            )

    @classmethod
    def on_socket(cls, model: Model) -> bool:
        return False  # `transformers serve` takes --host and --port only (no unix socket, no API key): on 127.0.0.1

    @property
    def served_name(self) -> str:
        return str(self.path)  # transformers serve names a forced model by its path

    def argv(self) -> list[str]:
        device = ["--device", "cpu"] if not self.gpus else []
        return [
            transformers_cli() or "transformers",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.address.port),
            *device,
            *self.model.args,
            str(self.path),
        ]
