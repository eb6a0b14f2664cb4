"""The gateway's model routes, each described once: its path, the engine path it reaches, the kind of model that
answers it, its body's checks and prompt bound, and, for an API answered by way of chat, its mapping. Every route is
served by the one handler (GatewayHttp.answer) through the one exchange (agents/gateway/exchange.py) that the orchestra
call's members take too: the key's models, the route's checks, what the model serves and its engine takes, the hold
before going upstream, the key's concurrency, routing and waking, the retry, metering; a new route is a new entry here
and cannot skip any of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from agents.gateway.anthropic_api import MessagesMapping
from agents.gateway.chat_params import chat_params_problem
from agents.gateway.lengths import TEMPLATE_TOKENS, prompt_bound
from agents.gateway.mapped import Mapping
from agents.gateway.openai_api import checked_body, messages_problem, parameter_problem
from agents.gateway.responses_api import ResponsesMapping
from agents.gateway.target import NotServable

Serves = Literal["chat", "embedding", "rerank"]  # as lab.yaml's model.serves says
MAX_INPUTS = 2048  # OpenAI's bound on the inputs of one embeddings request
MAX_DOCUMENTS = 1000  # Cohere's bound on the documents of one rerank request

Text = Annotated[StrictStr, Field(min_length=1)]
Tokens = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]


class EmbeddingsBody(BaseModel):
    """OpenAI's embeddings body: `input` in its four forms, at most MAX_INPUTS of them (engines' own extensions pass)."""

    model_config = ConfigDict(extra="allow", strict=True)

    input: (
        Text
        | Annotated[list[Text], Field(min_length=1, max_length=MAX_INPUTS)]
        | Tokens
        | Annotated[list[Tokens], Field(min_length=1, max_length=MAX_INPUTS)]
    )
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, Field(ge=1)] | None = None


class Document(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    text: StrictStr


class RerankBody(BaseModel):
    """Jina's and Cohere's rerank body (llama-server and vLLM read it): a query, its documents, the best top_n."""

    model_config = ConfigDict(extra="allow", strict=True)

    query: Text
    documents: Annotated[list[StrictStr | Document], Field(min_length=1, max_length=MAX_DOCUMENTS)]
    top_n: Annotated[int, Field(ge=1)] | None = None
    return_documents: bool | None = None


def _check_chat(body: dict[str, Any]) -> None:
    _check_generation(body)
    problem = messages_problem(body)
    if problem is not None:
        raise NotServable(400, problem[0], problem[2], param=problem[1])
    structured = chat_params_problem(body)  # tools, tool_choice, response_format, logprobs as OpenAI types them
    if structured is not None:
        raise NotServable(400, structured[0], "invalid_parameter", param=structured[1])


def _check_generation(body: dict[str, Any]) -> None:
    problem = parameter_problem(body)
    if problem is not None:
        raise NotServable(400, problem[0], "invalid_parameter", param=problem[1])


def _check_embeddings(body: dict[str, Any]) -> None:
    checked_body(EmbeddingsBody, body)
    _no_stream(body)


def _check_rerank(body: dict[str, Any]) -> None:
    checked_body(RerankBody, body)
    _no_stream(body)


def _no_stream(body: dict[str, Any]) -> None:
    if body.get("stream"):
        raise NotServable(400, "stream: this route answers in one piece", "invalid_parameter", param="stream")


def _texts_bytes(value: object) -> int:
    """A bound of the tokens of embeddings' input: a text's bytes, a token list's length (plus a marker each)."""
    items = value if isinstance(value, list) and value and not isinstance(value[0], int) else [value]
    total = 0
    for item in items:
        total += TEMPLATE_TOKENS + (len(item) if isinstance(item, list) else len(str(item).encode("utf-8", "surrogatepass")))
    return total


def _rerank_bound(body: dict[str, Any]) -> int:
    """A cross-encoder reads the query again with every document."""
    query = len(str(body.get("query", "")).encode("utf-8", "surrogatepass"))
    documents = body.get("documents") if isinstance(body.get("documents"), list) else []
    assert isinstance(documents, list)
    texts = [d.get("text", "") if isinstance(d, dict) else d for d in documents]
    return sum(TEMPLATE_TOKENS + query + len(str(t).encode("utf-8", "surrogatepass")) for t in texts) or 1


@dataclass(frozen=True)
class Route:
    """One route of the gateway."""

    path: str
    upstream: str  # the engine's path under its /v1
    serves: Serves  # the kind of model that answers it
    check: Callable[[dict[str, Any]], None]  # the (chat) body's checks: NotServable naming the param
    prompt: Callable[[dict[str, Any]], int]  # an upper bound of the prompt's tokens, for the hold
    generates: bool = True  # its lengths (max_tokens, n) are held; a pooling route holds its prompt only
    mapping: Mapping | None = None  # answered by way of chat: the client's body mapped, chat's answer mapped back
    dialect: Literal["openai", "anthropic"] = "openai"  # the shape of its errors

    @property
    def chat(self) -> bool:
        return self.upstream == "/chat/completions"


ROUTES = (
    Route("/v1/chat/completions", "/chat/completions", "chat", _check_chat, prompt_bound),
    Route("/v1/completions", "/completions", "chat", _check_generation, prompt_bound),
    Route("/v1/embeddings", "/embeddings", "embedding", _check_embeddings, lambda b: _texts_bytes(b.get("input")), False),
    Route("/v1/rerank", "/rerank", "rerank", _check_rerank, _rerank_bound, False),
    Route("/v1/responses", "/chat/completions", "chat", _check_chat, prompt_bound, mapping=ResponsesMapping()),
    Route("/v1/messages", "/chat/completions", "chat", _check_chat, prompt_bound, mapping=MessagesMapping(), dialect="anthropic"),
)
ANTHROPIC_PATHS = frozenset(r.path for r in ROUTES if r.dialect == "anthropic")
