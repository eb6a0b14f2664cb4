"""OpenAI's API as clients expect it: error types, parameter ranges, and answers and stream chunks rewritten so
that `model` is the name the client asked for, the first chat chunk has a role and usage is always measured."""

from __future__ import annotations

import json
import math
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from agents.gateway.chat_params import engine_error, is_openai_error
from agents.gateway.limits import SseSplitter
from agents.gateway.target import NotServable
from agents.wire.lab.gateway import MAX_GROUP_MEMBERS
from agents.wire.schema import MODEL_NAME_RULE, ModelName, Name

B = TypeVar("B", bound=BaseModel)
MAX_STOPS = 4


def error_type(status: int) -> str:
    """OpenAI's `error.type` for an HTTP status (LiteLLM and the SDKs map exceptions from status and type)."""
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(status: int, message: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    # OpenAI types an account out of credit by its code, not its status (a 429 that waiting does not cure)
    kind = "insufficient_quota" if code == "insufficient_quota" else error_type(status)
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class SamplingParams(BaseModel):
    """The parameters OpenAI bounds, checked before a request leaves the gateway (the rest pass through as sent; the
    lengths and choice counts are agents.gateway.lengths' own)."""

    model_config = ConfigDict(extra="allow", strict=False)

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None


class RoutedBody(BaseModel):
    """What every route that names a model checks where the body enters, before anything keeps or echoes the name."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: ModelName


class OrchestraBody(BaseModel):
    """The orchestra call: each member is a model name like any route's."""

    model_config = ConfigDict(extra="allow", strict=True)

    models: list[ModelName] | None = Field(default=None, min_length=1, max_length=MAX_GROUP_MEMBERS)
    group: Name | None = None


_MODEL_NAME: TypeAdapter[str] = TypeAdapter(ModelName)


def is_model_name(value: object) -> bool:
    """A name of the form ModelName (e.g. a URL's path part), never echoed when it is not."""
    try:
        _MODEL_NAME.validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


def checked_body(model: type[B], body: dict[str, Any]) -> B:
    """The body's named fields as `model` types them, or a 400 naming the first field that is not (its value never
    echoed: markup, control characters, 8 KiB of anything)."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        loc = exc.errors()[0]["loc"]
        param = str(loc[0]) if loc else "body"
        rule = f" ({MODEL_NAME_RULE}; GET /v1/models lists them)" if param in ("model", "models") else ""
        raise NotServable(400, f"{param} is not valid{rule}", f"invalid_{param}", param=param) from None


def parameter_problem(body: dict[str, Any]) -> tuple[str, str] | None:
    """(message, param) for the first parameter OpenAI would refuse with a 400, or None."""
    try:
        params = SamplingParams.model_validate(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        param = ".".join(str(part) for part in error["loc"]) or None
        value = body.get(str(error["loc"][0])) if error["loc"] else None
        return f"{param}: {error['msg']} (got {json.dumps(value)[:60]})", param or ""
    if isinstance(params.stop, list) and len(params.stop) > MAX_STOPS:
        return f"stop: at most {MAX_STOPS} sequences (got {len(params.stop)})", "stop"
    if params.stream_options is not None and not params.stream:
        return "stream_options: only allowed when stream is true", "stream_options"
    return None


def messages_problem(body: dict[str, Any]) -> tuple[str, str, str] | None:
    """(message, param, code) as OpenAI words its 400 for a chat body whose `messages` is missing or not a list of
    objects with a role, or None; refused here, not passed to an engine that may take it apart another way."""
    messages = body.get("messages")
    if messages is None:
        return "Missing required parameter: 'messages'.", "messages", "missing_required_parameter"
    if not isinstance(messages, list):
        return "Invalid type for 'messages': expected an array of objects.", "messages", "invalid_type"
    if not messages:
        return "Invalid 'messages': empty array. Expected an array with minimum length 1.", "messages", "empty_array"
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            return f"Invalid type for '{param}': expected an object.", param, "invalid_type"
        if "role" not in message:
            return f"Missing required parameter: '{param}.role'.", f"{param}.role", "missing_required_parameter"
        if not isinstance(message["role"], str):
            return f"Invalid type for '{param}.role': expected a string.", f"{param}.role", "invalid_type"
    return None


def openai_id(value: object, chat: bool) -> object:
    """An answer's id with OpenAI's prefix for its route (chatcmpl- for chat, cmpl- for completions): llama-server
    says chatcmpl- for both. An id with neither prefix (a provider's own form) stays as it is."""
    if not isinstance(value, str):
        return value
    for prefix in ("chatcmpl-", "cmpl-"):
        if value.startswith(prefix):
            return ("chatcmpl-" if chat else "cmpl-") + value.removeprefix(prefix)
    return value


def client_wants_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def upstream_stream_body(body: dict[str, Any]) -> dict[str, Any]:
    """The stream request as sent upstream: usage always asked for, so spend is measured, never estimated."""
    options = body.get("stream_options")
    return {**body, "stream_options": {**(options if isinstance(options, dict) else {}), "include_usage": True}}


def rewrite_answer(raw: bytes, client_model: str, chat: bool) -> bytes:
    """A JSON answer with `model` set to the client's name for it (never a path or an upstream name) and its id
    prefixed as OpenAI prefixes the route's."""
    try:
        data = json.loads(raw)
    except ValueError:
        return raw
    return rewrite_parsed(raw, data, client_model, chat)


def rewrite_parsed(raw: bytes, data: object, client_model: str, chat: bool) -> bytes:
    """rewrite_answer of an answer already parsed (``data``, left as it is); ``raw`` itself where nothing changes."""
    if not isinstance(data, dict) or "model" not in data:
        return raw
    changed = {"model": client_model, **({"id": openai_id(data["id"], chat)} if "id" in data else {})}
    if all(data[k] == v for k, v in changed.items()):
        return raw
    return json.dumps({**data, **changed}, separators=(",", ":")).encode()


def upstream_error(raw: bytes, status: int, where: str, body: dict[str, Any] | None = None) -> bytes:
    """An upstream's error answer in OpenAI's shape: llama-server's (a numeric code, no param), vLLM's older
    top-level form, a plain-text or HTML page and FastAPI's `detail` all become `{"error": {"message", "type",
    "param", "code"}}`, the param named where it can be (agents.gateway.chat_params); OpenAI's own passes as is."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if is_openai_error(data):
        return raw
    if isinstance(data, dict) and (isinstance(data.get("error"), dict) and "message" in data["error"] or "message" in data):
        message, code, param = engine_error(data, status, body)
    elif isinstance(data, dict) and "detail" in data:
        message, param, code = f"{where}: {json.dumps(data['detail'])[:300]}", None, None
    else:
        message, param, code = f"{where} answered {status}: {raw[:300].decode(errors='replace')}", None, None
    return json.dumps(error_body(status, message, code, param)).encode()


class StreamRewriter:
    """Rewrites an upstream SSE stream event by event: `model` as the client asked, the id's prefix as OpenAI's for
    the route, `delta.role` in each choice's first chat chunk, usage kept for the meter and passed on only to a client
    that asked for it.

    Most events of a one-choice stream need at most a name or a prefix changed: those are read and rewritten as bytes
    (`_as_bytes`), never decoded; an event whose bytes leave any doubt (usage, a second id or model key, whitespace
    between key and value, several lines, any choice but one) is parsed and rewritten whole (`_parsed`)."""

    def __init__(self, client_model: str, wants_usage: bool, chat: bool, upstream_model: str | None = None, choices: int = 1):
        self.client_model, self.wants_usage, self.chat = client_model, wants_usage, chat
        self.usage: dict[str, Any] | None = None
        self.token_events = 0  # deltas still generating: one token each, for when no usage comes
        self._events = SseSplitter()  # split as the bytes come (never the whole tail again), each event capped
        self._roled: set[int] = set()
        self._one_choice = choices == 1  # with several, each choice's first chunk is found by parsing
        self._model_field = b'"model":' + json.dumps(client_model).encode()
        upstream = b'"model":' + json.dumps(upstream_model).encode() if upstream_model is not None else None
        self._upstream_field = upstream if upstream != self._model_field else None
        self._id_field, self._wrong_id_field = (
            (b'"id":"chatcmpl-', b'"id":"cmpl-') if chat else (b'"id":"cmpl-', b'"id":"chatcmpl-')
        )

    def feed(self, chunk: bytes) -> bytes:
        """The complete events of what has arrived so far, rewritten; a partial event waits for its end.
        Raises UpstreamTooLarge when one event grows past the gateway's cap."""
        events = self._events.feed(chunk.replace(b"\r\n", b"\n") if b"\r" in chunk else chunk)
        if len(events) == 1:  # the common case: one event per chunk, no list to build
            out = self._event(events[0])
            return b"" if out is None else out + b"\n\n"
        return b"".join(out + b"\n\n" for out in map(self._event, events) if out is not None)

    def flush(self) -> bytes:
        tail = self._events.rest()
        out = self._event(tail) if tail.strip() else None
        return out + b"\n\n" if out else b""

    def _event(self, event: bytes) -> bytes | None:
        quick = self._as_bytes(event)
        return quick if quick is not None else self._parsed(event)

    def _as_bytes(self, event: bytes) -> bytes | None:
        """The event rewritten without decoding it, or None where only parsing it tells what to do.

        Inside a JSON string every quote is escaped, so `"model"` with its quotes unescaped is a key (or a
        key's tail: counted, so a second one sends the event to the parser); one choice per event is one
        `"finish_reason"` key, null while the choice is still generating."""
        if not self._one_choice or (self.chat and 0 not in self._roled):
            return None
        if not (event.startswith(b"data: {") and event.endswith(b"}")) or b"\n" in event or b'"usage"' in event:
            return None
        if event.count(b'"finish_reason"') != 1:
            return None
        if b'"finish_reason":null' in event:
            generating = True
        elif b'"finish_reason":"' in event:
            generating = False
        else:
            return None
        if event.count(b'"model"') != 1 or event.count(b'"id"') != 1:
            return None
        if self._model_field not in event:
            if self._upstream_field is None or self._upstream_field not in event:
                return None
            event = event.replace(self._upstream_field, self._model_field)
        if self._id_field not in event:
            if self._wrong_id_field not in event:
                return None
            event = event.replace(self._wrong_id_field, self._id_field)
        if generating:
            self.token_events += 1
        return event

    def _parsed(self, event: bytes) -> bytes | None:
        if not event.startswith(b"data:"):
            return event
        payload = event[5:].strip()
        if payload == b"[DONE]":
            return event
        try:
            data = json.loads(payload)
        except ValueError:
            return event
        if not isinstance(data, dict):
            return event
        usage = data.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        listed = data.get("choices")
        choices: list[Any] = listed if isinstance(listed, list) else []
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if choice.get("finish_reason") is None:
                self.token_events += 1
            index = choice.get("index", 0)
            if self.chat and index not in self._roled:
                self._roled.add(index)
                delta = choice.get("delta")
                if isinstance(delta, dict) and "role" not in delta:
                    choice["delta"] = {"role": "assistant", **delta}
        if not self.wants_usage and "usage" in data:
            if not choices and usage is not None:
                return None  # the usage chunk the gateway asked for, not the client
            del data["usage"]
        if "model" in data:
            data["model"] = self.client_model
        if "id" in data:
            data["id"] = openai_id(data["id"], self.chat)
        return b"data: " + json.dumps(data, separators=(",", ":")).encode()


MAX_WAIT_HEADER = "x-cetlab-max-wait-s"  # how long a client will wait for a model to come up


def error_response(
    status: int,
    message: str,
    code: str | None,
    retry_after_s: int | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An OpenAI-style error body, typed as OpenAI types it (401 authentication_error, ...)."""
    headers = {**(headers or {}), **({"Retry-After": str(retry_after_s)} if retry_after_s else {})}
    return web.json_response(error_body(status, message, code, param), status=status, headers=headers or None)


def max_wait(request: web.Request) -> float | None:
    """The seconds the client gives a model to come up (its x-cetlab-max-wait-s header), or None."""
    raw = request.headers.get(MAX_WAIT_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise NotServable(400, f"{MAX_WAIT_HEADER} must be a number of seconds >= 0, got {raw[:40]!r}", "invalid_header")
    return value
