"""The real llama-server for tests and benches: the cached pinned build, a tiny GGUF model and a GGUF LoRA adapter.

In CI (CI=true) a missing llama-server fails the test: `make test` builds it first. Elsewhere it is a skip
that names the command.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agents.orchestra.engines.llamacpp import build as llamacpp_build
from agents.orchestra.engines.llamacpp.chat_templates import QWEN25
from agents.orchestra.engines.llamacpp.tiny_gguf import write_tiny_gguf, write_tiny_lora_gguf


def llama_server_or_skip() -> Path:
    binary = llamacpp_build.find_llama_server()
    vocab = llamacpp_build.vocab_file()
    if binary is not None and vocab is not None:
        return binary
    why = f"no llama-server build with its vocab file in {llamacpp_build.build_dir()}: run `{llamacpp_build.MAKE_HINT}`"
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(why + " (CI must build it; `make test` does)")
    pytest.skip(why)


def tiny_models(folder: Path) -> dict[str, Path]:
    """Two tiny random Llamas (different seeds), a LoRA adapter for them, and (``tools``) one with Qwen 2.5's chat
    template, whose tool section llama-server's --jinja path reads, in ``folder`` (made once)."""
    vocab = llamacpp_build.vocab_file()
    assert vocab is not None
    out = {"a": folder / "tiny-a.gguf", "b": folder / "tiny-b.gguf", "lora": folder / "tiny-lora.gguf"}
    out["tools"] = folder / "tiny-tools.gguf"
    if not out["tools"].exists():
        write_tiny_gguf(out["tools"], vocab, seed=0, name="tiny-tools", chat_template=QWEN25)
    if not out["a"].exists():
        write_tiny_gguf(out["a"], vocab, seed=0)
    if not out["b"].exists():
        write_tiny_gguf(out["b"], vocab, seed=1)
    if not out["lora"].exists():
        write_tiny_lora_gguf(out["lora"])
    return out
