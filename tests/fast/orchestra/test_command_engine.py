"""engine: command end to end: a real OpenAI-compatible server (the project's simulated vLLM, started from its command
line) warmed through its agent, asked through the gateway over the tunnel, metered from its answer, then colded."""

from __future__ import annotations

import pytest

from agents.orchestra.engines import ENGINES, engine_spec
from agents.wire.lab.model import LabError, parse_lab
from tests.support.command_engine import SERVER, command_lab

pytestmark = pytest.mark.timeout(240)


def test_command_engine_keys_are_checked_where_lab_yaml_is_read():
    assert parse_lab(command_lab()).models[0].command == SERVER
    for bad, words in [
        ({"command": [*SERVER, "--host", "0.0.0.0"]}, "'0.0.0.0': engines listen on 127.0.0.1 only"),
        ({"command": ["server", "--bind=[::]:{port}", "127.0.0.1"]}, "'--bind=[::]:{port}'"),
        ({"command": ["server", "--port", "{port}"]}, "its command must bind 127.0.0.1"),
        ({"command": ["server", "--host", "127.0.0.1"]}, "needs {socket}"),
        ({"command": ["server", "--uds", "{socket}"], "port": 8000}, "it takes no port:"),
        ({"command": []}, "engine: command needs command"),
        ({"engine": "sim", "command": SERVER}, "command and stop_command are for engine: command"),
        ({"stop_command": ["stopper", "0.0.0.0:{port}"]}, "'0.0.0.0:{port}'"),
    ]:
        with pytest.raises(LabError, match=words.replace("[", r"\[").replace("(", r"\(")) as caught:
            parse_lab(command_lab(**bad))
        assert str(caught.value).startswith("lab.yaml:"), caught.value  # file and line first
    assert parse_lab(command_lab(command=["server", "--listen", "127.0.0.1:8000"], port=8000)).models[0].port == 8000


def test_an_unknown_engine_is_refused_by_the_registry_with_its_line():
    text = command_lab(engine="ollama", command=[])
    parse_lab(text)  # the console runs no engine: a well-formed name passes there
    with pytest.raises(LabError) as caught:
        parse_lab(text, engines=ENGINES)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "engine: ollama" in row)
    assert str(caught.value) == f"lab.yaml:{line}: models[0].engine: no engine named 'ollama' (engines: {', '.join(ENGINES)})"


def test_the_command_spec_says_what_it_cannot_do():
    spec = engine_spec("command")
    assert not spec.can_sleep and spec.adapters == "none" and not spec.has_metrics and spec.gpu_stack is None
