"""The method catalogue: every RPC method with its params model, its result model, its role and its doc: method."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, RootModel, ValidationError

from agents.wire.protocol import (
    ErrorCode,
    RemoteError,
    Role,
)
from agents.wire.schema import NAME_RULES

P = TypeVar("P", bound=BaseModel)


R = TypeVar("R", bound=BaseModel)


if TYPE_CHECKING:  # a reply that is a list or null: its class says `root: ...`, which the checker reads against Any
    Root = RootModel[Any]
else:  # not RootModel[...] at run time: that builds a schema at import (the CLI starts cold)
    Root = RootModel


class Params(BaseModel):
    """A method's params: unknown keys are refused; the schema is built on first use (the CLI starts cold)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)


class NoParams(Params):
    """A method that takes no params (an empty object, or none)."""


@dataclass(frozen=True)
class Method(Generic[P, R]):
    """One RPC method: its name, what it takes, what it answers, who may call it."""

    name: str
    params: type[P]
    result: type[R]
    role: Role = Role.VIEWER
    doc: str = ""


OP = Role.OPERATOR


class ReplyInvalid(RemoteError):
    """A reply that does not match its method's result model: which method, which field, what was wrong."""

    def __init__(self, method: str, field: str, problem: str, machine: str | None = None) -> None:
        said = f"{machine} answered {method} with a reply" if machine else f"{method} answered a reply"
        super().__init__(
            ErrorCode.INVALID_REPLY,
            f"{said} that does not fit at {field}: {problem}",
            {"method": method, "field": field, **({"machine": machine} if machine else {})},
        )
        self.method = method
        self.field = field
        self.machine = machine


_PLAIN = re.compile(r"^[A-Za-z0-9._\[\]-]{1,64}$")


def _said(part: int | str) -> str:
    """A place in params as words: a dict's key is the caller's, so one that is no plain name is quoted and cut."""
    text = str(part)
    return text if _PLAIN.match(text) else repr(text)[:40]


def params_error(exc: ValidationError) -> str:
    """Params that do not validate, in words: each field and what is wrong with it (a name's rule, not its pattern)."""
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(_said(p) for p in error["loc"]) or "params"
        rule = NAME_RULES.get((error.get("ctx") or {}).get("pattern", "")) if error["type"] == "string_pattern_mismatch" else None
        if rule is not None:  # the rule, not the regular expression; the name cut (10 kB of anything is not echoed whole)
            parts.append(f"{where}: {repr(error['input'])[:80]} is not {rule if rule.startswith('a') else 'a name: ' + rule}")
        else:
            parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(the reply)"


def validate_reply(method: Method[Any, R], raw: Any, machine: str | None = None) -> R:
    """The reply typed by the method's result model; ReplyInvalid (naming the machine that sent it, when given, the
    method and the field) otherwise."""
    try:
        return method.result.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        got = repr(first["input"])[:80] if first["type"] != "missing" else "nothing"
        raise ReplyInvalid(method.name, _where(first["loc"]), f"{first['msg']}, got {got}{more}", machine) from None


class Caller(Protocol):
    """What sends a request to one machine and waits for its raw reply (FleetClient, PeerClient)."""

    async def call(
        self, machine: str, method: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any: ...


def wire_params(params: BaseModel | None) -> dict[str, Any] | None:
    """Params as they travel: only what the caller set (an older agent refuses a field it does not know)."""
    if params is None:
        return None
    return params.model_dump(mode="json", by_alias=True, exclude_unset=True) or None


async def request(caller: Caller, machine: str, method: Method[P, R], params: P | None = None, timeout: float | None = None) -> R:
    """Call ``method`` on ``machine`` and return its typed reply.

    Raises RemoteError (the agent's own, or timeout / disconnected), or ReplyInvalid when the reply does not
    validate against ``method.result``.
    """
    raw = await caller.call(machine, method.name, wire_params(params), timeout)
    return validate_reply(method, raw, machine)


async def request_all(
    caller: Caller, machines: Iterable[str], method: Method[P, R], params: P | None = None, timeout: float | None = None
) -> dict[str, R | RemoteError]:
    """``request`` on several machines at once: each machine's typed reply, or the RemoteError it gave (offline,
    refused, a reply that did not validate). Any other exception is a bug and is raised."""
    names = list(machines)
    replies = await asyncio.gather(*(request(caller, name, method, params, timeout) for name in names), return_exceptions=True)
    out: dict[str, R | RemoteError] = {}
    for name, reply in zip(names, replies):
        if isinstance(reply, BaseException) and not isinstance(reply, RemoteError):
            raise reply
        out[name] = reply
    return out
