"""Chat's structured-output parameters (tools, tool_choice, response_format, logprobs) as OpenAI types them, checked
where the body enters; what the engine behind a model cannot take, refused with the param named before it is sent;
and an engine's own error body put into OpenAI's shape, in this one place.

An engine that is given what it cannot do either fails in its own words (llama-server: a 500 "Failed to parse
tools", `transformers serve`: a FastAPI 422) or, worse, ignores it: a client asking for JSON gets prose. The gateway
refuses both with OpenAI's 400, `param` named, as OpenAI answers a parameter it does not take.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents.wire.lab.model import Model

if TYPE_CHECKING:
    from agents.orchestra.spec import EngineSpec

MAX_TOP_LOGPROBS = 20  # OpenAI's bound (vLLM and llama-server take more: a client written for OpenAI never asks it)


class _Function(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _Tool(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["function"]
    function: _Function


class _Named(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str


class _ToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["function"]
    function: _Named


class _JsonSchema(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class _ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: _JsonSchema | None = None


class ChatParams(BaseModel):
    """The fields this module bounds; the rest of the body is another check's (agents.gateway.openai_api)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    tools: list[_Tool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | _ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: _ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)


def chat_params_problem(body: dict[str, Any]) -> tuple[str, str] | None:
    """(message, param) for the first structured-output parameter OpenAI would refuse with a 400, or None."""
    try:
        params = ChatParams.model_validate(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        param = _param(error["loc"])
        return f"Invalid '{param}': {error['msg']}.", param
    if params.tool_choice is not None and params.tool_choice != "none" and not params.tools:
        if params.tool_choice != "auto":
            return "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.", "tool_choice"
    if params.tools:
        names = [tool.function.name for tool in params.tools]
        if isinstance(params.tool_choice, _ToolChoice) and params.tool_choice.function.name not in names:
            return f"Invalid 'tool_choice': no function named {params.tool_choice.function.name!r} in 'tools'.", "tool_choice"
    fmt = params.response_format
    if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is None:
        return "Missing required parameter: 'response_format.json_schema'.", "response_format.json_schema"
    if params.top_logprobs is not None and not params.logprobs:
        return "Invalid 'top_logprobs': only allowed when 'logprobs' is true.", "top_logprobs"
    return None


def _param(loc: tuple[int | str, ...]) -> str:
    """OpenAI's way of naming a place in the body (tools[0].function.name); pydantic's union branch tags left out."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier() and not part.startswith("_"):
            name = part.removesuffix("_")  # schema_: the field pydantic could not call schema
            out += f".{name}" if out else name
    return out or "body"


def engine_refusal(body: dict[str, Any], model: Model | None, spec: EngineSpec | None) -> tuple[str, str] | None:
    """(message, param) when the engine serving ``model`` (its spec says what it takes) cannot take a parameter of
    this chat body, or None."""
    if model is None or spec is None:
        return None
    for name in spec.refuses_params:
        if body.get(name) not in (None, False):
            return f"{name} is not supported by {spec.title}, which serves {model.name}.", name
    if body.get("tools") and spec.tools_off_flag is not None and spec.tools_off_flag in model.args:
        return f"{model.name} ({spec.title}) runs with {spec.tools_off_flag}: it takes no tools.", "tools"
    auto = spec.auto_tools_flag
    if body.get("tools") and body.get("tool_choice") in (None, "auto") and auto is not None and auto not in model.args:
        return (
            f"{model.name} ({spec.title}) is served without automatic tool choice: add `{auto} --tool-call-parser NAME`"
            " to its args in lab.yaml, or ask tool_choice 'required' or a named function.",
            "tool_choice",
        )
    return None


# what llama-server's own messages are about, for the param OpenAI would name (it names none)
_MESSAGE_PARAMS = (
    ("tool_choice", "tool_choice"),
    ("tools", "tools"),
    ("response_format", "response_format"),
    ("json_schema", "response_format"),
    ("top_logprobs", "top_logprobs"),
    ("logprobs", "logprobs"),
    ("grammar", "grammar"),
)
# the body's fields that turn into a sampler's grammar: a sampler that fails to start failed on one of these
_GRAMMAR_PARAMS = ("response_format", "tools", "grammar", "json_schema")


def engine_error(data: dict[str, Any], status: int, body: dict[str, Any] | None) -> tuple[str, str | None, str | None]:
    """(message, param, code) of an engine's error body in OpenAI's terms: llama-server's numeric `code` (its HTTP
    status again) is no OpenAI code, and it names no `param`: the param is read off its message or, for a sampler
    that could not start, the grammar-making field the request carried."""
    error = data["error"] if isinstance(data.get("error"), dict) else data
    message = str(error.get("message"))
    code = error.get("code")
    param = error.get("param") if isinstance(error.get("param"), str) else None
    if param is None and (status < 500 or "Failed to parse" in message):
        if "samplers" in message and body is not None:
            param = next((name for name in _GRAMMAR_PARAMS if body.get(name) is not None), None)
        if param is None:
            lower = message.lower()
            param = next((p for word, p in _MESSAGE_PARAMS if word in lower), None)
    return message, None if code is None or isinstance(code, int) else str(code), param


def is_openai_error(data: object) -> bool:
    """Already in OpenAI's shape: an `error` object whose code is a string or null and that has a `param` key."""
    if not isinstance(data, dict) or not isinstance(data.get("error"), dict):
        return False
    error = data["error"]
    return "message" in error and "param" in error and not isinstance(error.get("code"), int)
