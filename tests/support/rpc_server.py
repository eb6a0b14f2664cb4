"""What tests/e2e/orchestra/test_spread_helper.py, tests/e2e/orchestra/test_spread_llamacpp.py share:
rpc_server_or_skip."""

from __future__ import annotations

import os

import pytest

from agents.orchestra.engines.llamacpp import build as llamacpp_build
from tests.support.llamacpp import llama_server_or_skip


def rpc_server_or_skip() -> None:
    llama_server_or_skip()
    if llamacpp_build.find_rpc_server() is None:
        why = f"no rpc-server beside llama-server in {llamacpp_build.build_dir()}: run `{llamacpp_build.MAKE_HINT}`"
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(why)
        pytest.skip(why)
