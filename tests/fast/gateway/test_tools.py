"""Tool calling, response_format and logprobs through the gateway with the real openai SDK: passed through to an
engine that takes them (sim-llamacpp, which holds llama-server's answers: tests/e2e/orchestra/test_llamacpp_twin.py), plain and
streamed; refused with OpenAI's 400 naming the param where the body is malformed or the engine cannot take them
(`transformers serve`, a vLLM model without automatic tool choice), before any model is brought up for it."""

from __future__ import annotations

import pytest

from agents.gateway.chat_params import chat_params_problem, engine_refusal
from agents.orchestra.engines import engine_spec
from agents.wire.lab.model import Model
from tests.support.gateway_tools import WEATHER

pytestmark = pytest.mark.timeout(240)


TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


MESSAGES = [{"role": "user", "content": "What is the weather in Lyon?"}]


def test_the_rules_by_engine_spec():
    body = {"messages": MESSAGES, "tools": [WEATHER]}
    llama = Model(name="m", path="m.gguf", engine="llamacpp", machine="hub")
    assert engine_refusal(body, llama, engine_spec("llamacpp")) is None
    assert engine_refusal(body, llama.model_copy(update={"args": ["--no-jinja"]}), engine_spec("llamacpp"))[1] == "tools"
    vllm = Model(name="v", path="v", engine="vllm", machine="hub")
    assert engine_refusal(body, vllm, engine_spec("vllm"))[1] == "tool_choice"
    auto = vllm.model_copy(update={"args": ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]})
    assert engine_refusal(body, auto, engine_spec("vllm")) is None
    assert engine_refusal({**body, "tool_choice": "required"}, vllm, engine_spec("vllm")) is None
    hf = Model(name="h", path="h", engine="transformers", machine="hub")
    assert engine_refusal(body, hf, engine_spec("transformers")) is None  # tools go into its chat template
    assert engine_refusal({**body, "tool_choice": "auto"}, hf, engine_spec("transformers"))[1] == "tool_choice"
    assert chat_params_problem({"tools": [WEATHER, TIME], "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert chat_params_problem({"response_format": {"type": "json_schema"}})[1] == "response_format.json_schema"
    assert chat_params_problem({"logprobs": True, "top_logprobs": 21})[1] == "top_logprobs"
    good = {"tools": [WEATHER], "tool_choice": "auto", "response_format": {"type": "json_object"}, "logprobs": True}
    assert chat_params_problem(good) is None
