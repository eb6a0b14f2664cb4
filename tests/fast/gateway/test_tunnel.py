"""Engines never on the network: the gateway reaches another machine's engine over its agent's SSH connection."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from pathlib import Path

import asyncssh
import pytest
import yaml

from agents.runtime.demo import ANY_GATEWAY_PORT_ENV
from agents.wire.lab.model import LabError, parse_lab
from tests.support.gateway_tunnel import LAB

pytestmark = pytest.mark.timeout(240)


def test_lab_yaml_cannot_put_an_engine_on_the_network():
    data = {**LAB, "models": [{**LAB["models"][0], "engine": "vllm", "args": ["--host=0.0.0.0"]}]}
    # argparse (vLLM, transformers serve, the sim engines) takes an unambiguous prefix of --host as --host
    for args in (["--host", "0.0.0.0"], ["--max-model-len", "8192", "--host=0.0.0.0"], ["--hos", "0.0.0.0"], ["--ho=0.0.0.0"]):
        data["models"][0]["args"] = args
        with pytest.raises(LabError, match="127.0.0.1 only"):
            parse_lab(yaml.safe_dump(data))
    from agents.wire.lab.loopback import binds_elsewhere

    assert not any(binds_elsewhere(arg) for arg in ("--hf-overrides", "{}", "--h", "--", "--hosts"))
    assert all(binds_elsewhere(arg) for arg in ("--port=8000", "--uds", "--ud=/tmp/x.sock", "--host"))  # the agent's to say


def test_the_demo_keeps_lab_yamls_gateway_port_when_it_is_free(tmp_path, monkeypatch):
    import socket

    from agents.shell.demo import gateway as gateway_demo

    monkeypatch.delenv(ANY_GATEWAY_PORT_ENV, raising=False)
    ports = iter(range(20000, 20100))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    data = {"gateway": {"machine": "hub", "port": free}, "providers": []}
    gateway_demo.prepare(tmp_path, data, "", lambda n: [next(ports) for _ in range(n)])
    assert data["gateway"]["port"] == free
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free))
        taken.listen()
        data = {"gateway": {"machine": "hub", "port": free}, "providers": []}
        gateway_demo.prepare(tmp_path, data, "", lambda n: [next(ports) for _ in range(n)])
        assert data["gateway"]["port"] != free  # taken: another one, the demo still starts


@pytest.mark.parametrize("kind", ["sim", "vllm", "sim-llamacpp", "transformers"])
def test_every_engine_is_started_on_its_socket(tmp_path, kind):
    """Whatever lab.yaml's args say (--host, --port, --uds are refused at load), the engine listens on a unix socket in
    its run folder; `transformers serve`, which has no socket option, on 127.0.0.1."""
    from agents.orchestra.engines import ENGINES
    from agents.wire.lab.model import Model

    path = tmp_path / ("m.gguf" if "llamacpp" in kind else "m")
    model = Model(name="m", path=str(path), engine=kind, machine="hub", gpus=[0], args=["--max-model-len", "512"])
    engine = ENGINES[kind](model, path, "hub", [0], tmp_path / "m.log")
    argv = engine.argv()
    flags = {arg: argv[i + 1] for i, arg in enumerate(argv) if arg in ("--host", "--port", "--uds")}
    if kind == "transformers":
        assert flags == {"--host": "127.0.0.1", "--port": str(engine.address.port)} and engine.tcp_warning(model)
        return
    assert engine.address.socket is not None and engine.tcp_warning(model) is None
    assert flags == ({"--host": engine.address.socket} if "llamacpp" in kind else {"--uds": engine.address.socket}), argv
    assert engine.address.socket == str(tmp_path / "m.run" / "engine.sock") or len(str(tmp_path)) > 80
    pinned = Model(name="m", path=str(path), engine=kind, machine="hub", gpus=[0], port=8123)
    engine = ENGINES[kind](pinned, path, "hub", [0], tmp_path / "m.log")  # lab.yaml's port: there, with a warning
    assert engine.address.port == 8123 and "8123" in (engine.tcp_warning(pinned) or "")


def test_a_too_long_state_dir_puts_the_socket_in_a_private_folder(tmp_path):
    from agents.orchestra.engines import ENGINES
    from agents.wire.lab.model import Model

    deep = tmp_path / ("d" * 120)
    model = Model(name="m", path=str(tmp_path), engine="sim", machine="hub", gpus=[0])
    socket = ENGINES["sim"](model, tmp_path, "hub", [0], deep / "m.log").address.socket
    assert socket is not None and len(socket.encode()) <= 107
    folder = os.stat(os.path.dirname(socket))
    assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == os.geteuid()
    again = ENGINES["sim"](model, tmp_path, "hub", [0], deep / "m.log").address.socket
    assert again == socket  # a restarted agent finds it again


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_socket_folder_of_another_user_is_refused_and_a_loose_one_of_ours_is_closed(tmp_path, monkeypatch):
    import tempfile

    from agents.orchestra.engines import ENGINES
    from agents.wire.lab.model import Model
    from agents.wire.protocol import ErrorCode, RemoteError

    short = Path(tempfile.mkdtemp(prefix="ct", dir="/tmp"))  # a socket path holds 107 bytes: pytest's tmp_path is deep
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(short))
    folder = short / f"cetlab-engines-{os.geteuid()}"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    model = Model(name="m", path=str(tmp_path), engine="sim", machine="hub", gpus=[0])
    deep = tmp_path / ("d" * 120) / "m.log"
    assert ENGINES["sim"](model, tmp_path, "hub", [0], deep).address.socket is not None
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # ours, but open to others: closed before use
    os.chown(folder, pwd.getpwnam("nobody").pw_uid, -1)  # another user's (made before the agent's first start)
    with pytest.raises(RemoteError) as refused:
        ENGINES["sim"](model, tmp_path, "hub", [0], deep)
    assert refused.value.code == ErrorCode.UNAVAILABLE and "not a folder of this user" in refused.value.message
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path / ("t" * 60)))  # both too deep: refused, said why
    with pytest.raises(RemoteError, match="too deep for a socket path"):
        ENGINES["sim"](model, tmp_path, "hub", [0], deep)
    shutil.rmtree(short)


def test_a_refused_forward_is_logged_on_one_line_whatever_host_it_names(caplog):
    """The forward's host is the client's (any key, a viewer's too): a newline in it forged a log line of its own."""
    from types import SimpleNamespace

    from agents.shell.server import _Server
    from agents.wire.protocol import Role

    caller = SimpleNamespace(agent=None, role=Role.VIEWER, who="intruder")
    with caplog.at_level("WARNING", logger="cetlab.server"), pytest.raises(asyncssh.ChannelOpenError):
        _Server.connection_requested(caller, "127.0.0.1\n2026-11-24 08:00:00 CRITICAL cetlab: forged", 8400, "x", 0)
    with caplog.at_level("WARNING", logger="cetlab.server"), pytest.raises(asyncssh.ChannelOpenError):
        _Server.unix_connection_requested(caller, "/x.sock\n2026-11-24 08:00:00 CRITICAL cetlab: forged")
    assert caplog.records and all("\n" not in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
