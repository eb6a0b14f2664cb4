"""A llama.cpp model spread over several machines (lab.yaml's rpc:), the fast tier: where it enters (lab.yaml, named by
line), who may call and forward to whom (the node role, 127.0.0.1 only), llama-server's flags, the split of its memory,
the doctor, and how the views show it. The real rpc-server and llama-server on two agents: test_rpc_spread_e2e.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from agents.orchestra.engines.llamacpp import build as llamacpp_build
from agents.orchestra.port import ModelsPort
from agents.orchestra.spread import shares
from agents.orchestra.weights.vram import typed_need
from agents.runtime.labfile import calls_peers, needed_peer_keys
from agents.shell.doctor import FAIL, OK, check_rpc_helper
from agents.shell.server import forward_problem, socket_forward_problem
from agents.wire.lab.model import LabError, parse_lab
from agents.wire.lab.spread import helped_models, node_links
from agents.wire.protocol import NODE_METHODS, PeerKeys, Role
from agents.wire.sections.models import ModelInfo
from console.cli.models import model_human, models_human
from widgets.format import machines_text

GIB = 1024**3


LAB = """\
lab: spread
machines:
  - name: m5
    gpus: {sim: [{name: Tesla P40, memory_gib: 24, tdp_w: 250}, {name: Tesla P40, memory_gib: 24, tdp_w: 250}]}
  - name: irina
    gpus: {sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}, {name: Tesla P4, memory_gib: 8, tdp_w: 75}]}
  - name: box
    gpus: none
models:
  - name: llama-70b
    path: /models/llama-70b.gguf
    engine: {engine}
    machine: m5
    gpus: [0, 1]
    vram_gib: 50
    rpc:
      - machine: {helper}
        gpus: {gpus}
"""


def lab_text(engine: str = "llamacpp", helper: str = "irina", gpus: str = "[0, 1]", extra: str = "") -> str:
    return LAB.replace("{engine}", engine).replace("{helper}", helper).replace("{gpus}", gpus) + extra


def problems(text: str) -> list[str]:
    with pytest.raises(LabError) as info:
        parse_lab(text, source="lab.yaml")
    return str(info.value).splitlines()


# ---------------------------------------------------------------- lab.yaml


def test_a_model_spread_over_two_machines_is_read_with_its_helpers():
    lab = parse_lab(lab_text(), source="lab.yaml")
    model = lab.models[0]
    assert [(h.machine, h.gpus) for h in model.rpc] == [("irina", [0, 1])]
    assert helped_models(lab, "irina") == ["llama-70b"] and helped_models(lab, "m5") == []
    assert node_links(lab) == [("m5", "irina")]


@pytest.mark.parametrize(
    ("text", "line", "said"),
    [
        (lab_text(engine="vllm"), 16, "engine vllm cannot (use engine: llamacpp)"),
        (lab_text(helper="nowhere"), 17, "no machine named 'nowhere'"),
        (lab_text(helper="m5"), 17, "m5 runs the model itself"),
        (lab_text(gpus="[0, 2]"), 18, "machine irina has 2 GPUs (0..1), no GPU 2"),
        (lab_text(extra="      - machine: irina\n"), 19, "machine irina is a helper twice"),
    ],
    ids=["engine", "no-machine", "own-machine", "gpu", "twice"],
)
def test_a_wrong_rpc_entry_is_refused_naming_its_line(text, line, said):
    found = problems(text)
    assert any(p.startswith(f"lab.yaml:{line}:") and said in p for p in found), found


def test_an_rpc_key_that_is_not_a_placement_is_refused_with_its_line():
    found = problems(lab_text(gpus="[0]\n        port: 50052"))
    assert any(p.startswith("lab.yaml:19:") and "port" in p for p in found), found


# ---------------------------------------------------------------- who calls whom, with which role


def test_the_models_machine_calls_its_helpers_with_the_node_role_and_nothing_more():
    lab = parse_lab(lab_text(), source="lab.yaml")
    assert calls_peers(lab, "m5") and not calls_peers(lab, "irina") and not calls_peers(lab, "box")
    keys = {"m5": PeerKeys(node="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG5vZGUta2V5LW9mLW01LWZvci10ZXN0cy0xMjM0NTY node")}
    assert needed_peer_keys(lab, "irina", keys) == [(Role.NODE, keys["m5"].node, "node@m5")]
    assert needed_peer_keys(lab, "box", keys) == [] and needed_peer_keys(lab, "m5", keys) == []
    assert {"models.rpc_start", "models.rpc_stop", "models.rpc_status"} <= NODE_METHODS
    assert not Role.NODE.allows(Role.VIEWER, "models.list") and not Role.NODE.allows(Role.OPERATOR, "models.warm")
    assert Role.NODE.allows(Role.OPERATOR, "models.rpc_start")


class _Pool:
    def __init__(self, rpc: frozenset[int], engines: frozenset[int] = frozenset()) -> None:
        self._rpc, self._engines = rpc, engines

    def engine_ports(self) -> frozenset[int]:
        return self._engines

    def engine_sockets(self) -> frozenset[str]:
        return frozenset({"/state/models/x.run/engine.sock"})

    def rpc_ports(self) -> frozenset[int]:
        return self._rpc

    def holding_gpus(self) -> list[ModelInfo]:
        return []


def agent_with(pool: _Pool) -> Any:
    """What the SSH door asks of the agent: its pool's ports."""
    return SimpleNamespace(find=lambda port: pool if port is ModelsPort else None)


def test_only_a_node_key_reaches_an_rpc_server_and_only_on_127_0_0_1():
    agent = agent_with(_Pool(rpc=frozenset({50052}), engines=frozenset({8080})))
    assert forward_problem(agent, Role.NODE, "127.0.0.1", 50052) is None
    assert "no rpc-server runs on port 8080" in str(forward_problem(agent, Role.NODE, "127.0.0.1", 8080))
    assert "127.0.0.1 only" in str(forward_problem(agent, Role.NODE, "10.0.0.5", 50052))
    assert "127.0.0.1 only" in str(forward_problem(agent, Role.NODE, "localhost", 50052))
    for role in (Role.OPERATOR, Role.VIEWER, None):  # a person's key never reaches rpc-server (it has no auth)
        assert forward_problem(agent, role, "127.0.0.1", 50052) == "only the gateway's key may open forwards"
    assert "no engine runs on port 50052" in str(forward_problem(agent, Role.GATEWAY, "127.0.0.1", 50052))
    assert socket_forward_problem(agent, Role.NODE, "/state/models/x.run/engine.sock") is not None


def test_placement_splits_the_models_memory_over_every_machines_gpus_by_their_size():
    # m5's two P40s and irina's two P4s: a 56 GiB model is 21 GiB on each P40 and 7 GiB on each P4 (64 GiB together)
    split = shares(56 * GIB, [24 * GIB, 24 * GIB, 8 * GIB, 8 * GIB])
    assert split == [21 * GIB, 21 * GIB, 7 * GIB, 7 * GIB] and sum(split) == 56 * GIB
    assert shares(8 * GIB, [None, 8 * GIB]) == [4 * GIB, 4 * GIB]  # a size not known: an equal split
    assert shares(8 * GIB, []) == []


# ---------------------------------------------------------------- doctor


def test_the_doctor_fails_a_helper_without_rpc_server_and_gives_the_build_command(monkeypatch, tmp_path):
    lab = parse_lab(lab_text(), source="lab.yaml")
    monkeypatch.setenv(llamacpp_build.RPC_BINARY_ENV, str(tmp_path / "absent" / "rpc-server"))
    [check] = check_rpc_helper(lab, "irina")
    assert check.level == FAIL and "llama-70b" in check.message and check.fix is not None
    assert "agents.orchestra.engines.llamacpp.build" in check.fix
    assert check_rpc_helper(lab, "m5") == [] and check_rpc_helper(lab, "box") == []
    binary = tmp_path / "rpc-server"
    binary.write_bytes(b"\x7fELF")
    monkeypatch.setenv(llamacpp_build.RPC_BINARY_ENV, str(binary))
    [check] = check_rpc_helper(lab, "irina")
    assert check.level == OK and str(binary) in check.message


# ---------------------------------------------------------------- one model on several machines, as the views say it


def test_the_views_show_one_model_on_several_machines():
    info = ModelInfo.model_validate(
        {"name": "llama-70b", "machine": "m5", "engine": "llamacpp", "state": "warm", "since": 0, "helpers": ["irina"]}
    )
    assert info.machines == ["m5", "irina"] and machines_text(info.machine, info.machines) == "m5+irina"
    assert "m5+irina" in models_human([info], {}, {}) and model_human(info).startswith("llama-70b on m5+irina ")
    alone = ModelInfo.model_validate({"name": "tiny", "machine": "box", "engine": "llamacpp", "state": "cold", "since": 0})
    assert machines_text(alone.machine, alone.machines) == "box"


# ---------------------------------------------------------------- bring-up: every machine's share checked, helpers first


class _Peers:
    """The model agent's links to its helpers, as Spread uses them: forwards made, forwards dropped."""

    def __init__(self) -> None:
        self.forwards: list[tuple[str, int]] = []
        self.dropped: list[tuple[str, int]] = []

    async def tcp_forward(self, machine: str, port: int) -> int:
        self.forwards.append((machine, port))
        return 40000 + len(self.forwards)

    def drop_tcp_forward(self, machine: str, port: int) -> None:
        self.dropped.append((machine, port))


def spread_for(free_by_gpu: dict[int, int], answers: dict[str, Any]) -> tuple[Any, list[tuple[str, str, Any]]]:
    from agents.orchestra.spread import Spread
    from agents.wire.catalogue.spread import RpcServerStatus
    from agents.wire.protocol import RemoteError

    lab = parse_lab(lab_text(), source="lab.yaml")
    gpus = [SimpleNamespace(index=i, mem_total_bytes=24 * GIB) for i in (0, 1)]
    core = SimpleNamespace(lab=lab, machine=lab.machine("m5"), latest=SimpleNamespace(gpus=gpus))
    placement = SimpleNamespace(free_bytes=lambda index, after, starting=None: free_by_gpu[index])
    spread = Spread(core, placement, lambda slot, reason: None)
    spread.peers = _Peers()
    calls: list[tuple[str, str, Any]] = []

    async def answer(machine: str, method: Any, params: Any, timeout: float = 10.0, link_wait_s: float = 5.0) -> Any:
        calls.append((machine, method.name, params))
        reply = answers[method.name]
        if isinstance(reply, RemoteError):
            raise reply
        return RpcServerStatus.model_validate(reply)

    spread._request = answer
    answers.setdefault("models.rpc_stop", {"model": "llama-70b", "machine": "irina", "state": "stopped"})
    return spread, calls


P4S = [{"index": 0, "total_bytes": 8 * GIB, "free_bytes": 8 * GIB}, {"index": 1, "total_bytes": 8 * GIB, "free_bytes": 8 * GIB}]


async def test_bring_up_starts_the_helpers_with_their_share_and_forwards_to_them():
    status = {"model": "llama-70b", "machine": "irina", "state": "stopped", "gpus": P4S}
    running = {**status, "state": "running", "port": 50052}
    spread, calls = spread_for({0: 24 * GIB, 1: 24 * GIB}, {"models.rpc_status": status, "models.rpc_start": running})
    lab = parse_lab(lab_text(), source="lab.yaml")
    slot = SimpleNamespace(name="llama-70b", model=lab.models[0], gpus=[0, 1], need=typed_need(lab.models[0]))
    endpoints = await spread.bring_up(slot)
    assert endpoints == ["127.0.0.1:40001"] and spread.peers.forwards == [("irina", 50052)]
    assert [c[1] for c in calls] == ["models.rpc_status", "models.rpc_start"]
    # 50 GiB over two 24 GiB P40s and two 8 GiB P4s: 6.25 GiB on each P4
    assert calls[1][2].need_bytes == int(50 * GIB * 8 / 64)
    await spread.take_down(slot)
    assert spread.peers.dropped == [("irina", 50052)] and calls[-1][1] == "models.rpc_stop"


async def test_bring_up_refuses_a_share_this_machines_gpu_cannot_hold_before_any_helper_starts():
    from agents.orchestra.slot import EngineFailed

    status = {"model": "llama-70b", "machine": "irina", "state": "stopped", "gpus": P4S}
    spread, calls = spread_for({0: 24 * GIB, 1: 10 * GIB}, {"models.rpc_status": status})
    lab = parse_lab(lab_text(), source="lab.yaml")
    slot = SimpleNamespace(name="llama-70b", model=lab.models[0], gpus=[0, 1], need=typed_need(lab.models[0]))
    with pytest.raises(EngineFailed) as refused:
        await spread.bring_up(slot)
    assert "needs 18.8 GiB on GPU 1 of m5 (its share over 4 GPUs), 10.0 GiB free" in str(refused.value)
    assert [c[1] for c in calls] == ["models.rpc_status"]  # nothing started


async def test_a_helper_that_refuses_its_share_is_named_and_the_others_are_stopped():
    from agents.orchestra.slot import EngineFailed
    from agents.wire.protocol import ErrorCode, RemoteError

    status = {"model": "llama-70b", "machine": "irina", "state": "stopped", "gpus": P4S}
    full = RemoteError(ErrorCode.CONFLICT, "llama-70b needs 6.2 GiB on GPU 0 of irina, 2.0 GiB free: 4.2 GiB missing")
    spread, calls = spread_for({0: 24 * GIB, 1: 24 * GIB}, {"models.rpc_status": status, "models.rpc_start": full})
    lab = parse_lab(lab_text(), source="lab.yaml")
    slot = SimpleNamespace(name="llama-70b", model=lab.models[0], gpus=[0, 1], need=typed_need(lab.models[0]))
    with pytest.raises(EngineFailed) as refused:
        await spread.bring_up(slot)
    assert str(refused.value).startswith("rpc helper irina could not start: llama-70b needs 6.2 GiB on GPU 0 of irina")
    assert calls[-1][1] == "models.rpc_stop" and spread.peers.forwards == []


def test_a_spread_model_with_replicas_is_refused_with_its_line(tmp_path):
    from agents.wire.lab.model import LabError, load_lab

    text = """lab: t
machines:
  - {name: a, gpus: {sim: [{name: "Tesla P4", memory_gib: 8, tdp_w: 75}]}}
  - {name: b, gpus: {sim: [{name: "Tesla P4", memory_gib: 8, tdp_w: 75}]}}
  - {name: c, gpus: {sim: [{name: "Tesla P4", memory_gib: 8, tdp_w: 75}]}}
models:
  - name: big
    path: big.gguf
    engine: llamacpp
    machine: a
    gpus: [0]
    rpc: [{machine: b, gpus: [0]}]
    replicas: [{machine: c, gpus: [0]}]
"""
    lab_file = tmp_path / "lab.yaml"
    lab_file.write_text(text)
    with pytest.raises(LabError) as info:
        load_lab(lab_file)
    assert "no replicas" in str(info.value) and "lab.yaml:" in str(info.value)


def test_a_pushed_spread_model_says_its_node_link_waits_for_the_next_start():
    from agents.wire.lab.push import lab_changes

    base = """lab: t
machines:
  - {name: a, gpus: {sim: [{name: "Tesla P4", memory_gib: 8, tdp_w: 75}]}}
  - {name: b, gpus: {sim: [{name: "Tesla P4", memory_gib: 8, tdp_w: 75}]}}
models:
  - {name: big, path: big.gguf, engine: llamacpp, machine: a, gpus: [0]}
"""
    spread = base.replace("gpus: [0]}", "gpus: [0], rpc: [{machine: b, gpus: [0]}]}")
    changes = lab_changes(parse_lab(base), parse_lab(spread), "a")
    assert "a node link to b" in changes.restart and "models: ~big" in changes.live
    assert lab_changes(parse_lab(spread), parse_lab(spread), "a").restart == []
    assert "a node link to b" not in lab_changes(parse_lab(base), parse_lab(spread), "b").restart
