"""Every machine's typed answer to one method, for the CLI and the screens; and a typed reply back as the JSON the agent sent."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

from agents.catalogue import Method, validate_reply, wire_params
from agents.protocol import RemoteError

P = TypeVar("P", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)


class AllCaller(Protocol):
    """What asks every machine at once (FleetClient): per machine, its raw result or the exception it raised."""

    async def call_all(self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> dict[str, Any]: ...


@dataclass
class Answers(Generic[R]):
    """What every machine answered: a typed reply, or why there is none (offline, refused, a reply that does not validate)."""

    replies: dict[str, R] = field(default_factory=dict)
    errors: dict[str, Exception] = field(default_factory=dict)

    def messages(self) -> dict[str, str]:
        """Machine -> the one line saying why it gave no reply."""
        return {name: exc.message if isinstance(exc, RemoteError) else str(exc) for name, exc in self.errors.items()}


async def request_all(client: AllCaller, method: Method[P, R], params: P | None = None, timeout: float | None = None) -> Answers[R]:
    """Call ``method`` on every machine at once; each answer validated against the method's result model."""
    results = await client.call_all(method.name, wire_params(params), timeout)
    answers: Answers[R] = Answers()
    for name, result in results.items():
        if isinstance(result, Exception):
            answers.errors[name] = result
            continue
        try:
            answers.replies[name] = validate_reply(method, result)
        except RemoteError as exc:  # ReplyInvalid: this machine's reply is unusable, the others' are not
            answers.errors[name] = exc
    return answers


def sent(reply: BaseModel) -> Any:
    """A typed reply as the JSON the agent sent (what `--json` prints): the fields it set, none filled in by default."""
    return reply.model_dump(mode="json", exclude_unset=True, by_alias=True)
