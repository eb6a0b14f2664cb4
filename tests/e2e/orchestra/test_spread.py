"""A llama.cpp model spread over several machines (lab.yaml's rpc:), the fast tier: where it enters (lab.yaml, named by
line), who may call and forward to whom (the node role, 127.0.0.1 only), llama-server's flags, the split of its memory,
the doctor, and how the views show it. The real rpc-server and llama-server on two agents: test_rpc_spread_e2e.py."""

from __future__ import annotations

from pathlib import Path

from agents.orchestra.engines.llamacpp.engine import LlamacppEngine
from agents.wire.lab.model import Model

GIB = 1024**3


# ---------------------------------------------------------------- llama-server and the split


def test_llama_server_takes_the_forwarded_rpc_servers_and_puts_every_layer_on_the_devices():
    model = Model.model_validate(
        {"name": "llama-70b", "path": "/m/70b.gguf", "engine": "llamacpp", "machine": "m5", "rpc": [{"machine": "irina"}]}
    )
    engine = LlamacppEngine(model, Path("/m/70b.gguf"), "m5", [0, 1], Path("/tmp/x.log"))
    engine.gpu_totals = [24 * GIB, 24 * GIB]
    engine.rpc_servers = ["127.0.0.1:41001", "127.0.0.1:41002"]
    flags = engine.argv()
    assert flags[flags.index("--rpc") + 1] == "127.0.0.1:41001,127.0.0.1:41002"
    assert flags[flags.index("-ngl") + 1] == "999"
    assert "--tensor-split" not in flags  # llama.cpp splits by each device's free memory, the RPC devices' too
    cpu_only = LlamacppEngine(model, Path("/m/70b.gguf"), "box", [], Path("/tmp/x.log"))
    cpu_only.rpc_servers = ["127.0.0.1:41001"]
    assert cpu_only.argv()[cpu_only.argv().index("-ngl") + 1] == "999"  # its layers go to the helper's devices
    alone = LlamacppEngine(model, Path("/m/70b.gguf"), "box", [], Path("/tmp/x.log"))
    assert "--rpc" not in alone.argv() and alone.argv()[alone.argv().index("-ngl") + 1] == "0"
