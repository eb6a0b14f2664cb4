"""Where an engine listens, as one type (agents/wire/engine_address.py): parsed where a tick's endpoint enters, shown
with a warning where any user of the machine can reach it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agents.wire.engine_address import EngineAddress
from agents.wire.sections.models import ModelInfo
from console.cli.models import model_human


def test_an_endpoint_is_a_socket_of_the_agent_or_a_loopback_port_and_nothing_else():
    unix = EngineAddress.parse("unix:/state/models/m.run/engine.sock")
    assert unix.socket == "/state/models/m.run/engine.sock" and unix.origin == "http://localhost" and not unix.on_tcp
    tcp = EngineAddress.parse("http://127.0.0.1:8123/v1")
    assert tcp.port == 8123 and tcp.endpoint == "http://127.0.0.1:8123/v1" and tcp.on_tcp
    for bad in (
        "unix:relative/engine.sock",
        "unix:/state/engine",  # no .sock
        "unix:/" + "x" * 120 + ".sock",  # past sun_path
        "unix:/state/../etc/engine.sock",
        "unix:/state/\x00.sock",
        "http://10.0.0.5:8000/v1",  # not loopback
        "http://127.0.0.1/v1",  # no port
        "http://127.0.0.1:99999/v1",
        "https://127.0.0.1:8000/v1",
        "http://127.0.0.1:8000/admin",
    ):
        with pytest.raises(ValueError):
            EngineAddress.parse(bad)
    with pytest.raises(ValidationError, match="engine endpoint"):  # where a peer's tick enters
        ModelInfo(name="m", machine="box", engine="sim", state="warm", since=0.0, endpoint="http://10.0.0.5:8000/v1")


def test_cetlab_models_warns_of_an_engine_on_127_0_0_1_only():
    info = ModelInfo(name="m", machine="box", engine="sim", state="warm", since=0.0, endpoint="unix:/s/m.run/engine.sock")
    assert "unix:/s/m.run/engine.sock" in model_human(info) and "WARN" not in model_human(info)
    on_port = info.model_copy(update={"endpoint": "http://127.0.0.1:8123/v1"})
    assert "WARN: its engine listens on 127.0.0.1" in model_human(on_port)
