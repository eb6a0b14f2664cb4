"""Typed replies for the CLI and the screens: several machines' answers split into replies and errors, and a reply back as the
JSON the agent sent."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from agents.wire.protocol import ErrorCode, RemoteError

R = TypeVar("R", bound=BaseModel)


@dataclass
class Answers(Generic[R]):
    """What several machines answered (agents.wire.catalogue.method.request_all): typed replies, and why the others gave none (offline,
    refused, a reply that did not validate)."""

    replies: dict[str, R] = field(default_factory=dict)
    errors: dict[str, RemoteError] = field(default_factory=dict)

    @classmethod
    def of(cls, results: Mapping[str, R | RemoteError]) -> Answers[R]:
        answers: Answers[R] = cls()
        for name, result in results.items():
            if isinstance(result, RemoteError):
                answers.errors[name] = result
            else:
                answers.replies[name] = result
        return answers

    def messages(self) -> dict[str, str]:
        """Machine -> the one line saying why it gave no reply."""
        return {name: exc.message for name, exc in self.errors.items()}


def why_not(exc: RemoteError) -> str:
    """How a machine that gave no reply is labelled: "bad reply" when it answered but the reply does not fit its model
    (it is online), OFFLINE otherwise."""
    return "bad reply" if exc.code == ErrorCode.INVALID_REPLY else "OFFLINE"


def not_reached(errors: Mapping[str, RemoteError]) -> list[str]:
    """One line per machine that gave no reply: `m5: OFFLINE ...` or `m5: bad reply m5 answered ... that does not fit ...`."""
    return [f"{name}: {why_not(exc)} {exc.message}" for name, exc in errors.items()]


def sent(reply: BaseModel) -> Any:
    """A typed reply as the JSON the agent sent (what `--json` prints): the fields it set, none filled in by default."""
    return reply.model_dump(mode="json", exclude_unset=True, by_alias=True)
