"""Method registry and request dispatch: role checks, param validation, typed errors."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from agents.runtime.store import DiskFull
from agents.wire.catalogue.index import CATALOGUE
from agents.wire.catalogue.method import Method, NoParams, P, R, params_error
from agents.wire.protocol import ErrorCode, RemoteError, Role, encode

log = logging.getLogger("cetlab.rpc")

Handler = Callable[["Peer", Any], Awaitable[BaseModel]]


class AuditTrail(Protocol):
    """Where operator methods are recorded: before they run (no row, no action), and their outcome after."""

    def begin(self, peer: Peer, method: str, params: Any) -> Any:
        """Record the call; raise if it cannot be recorded (then it does not run). Returns a token for end()."""

    def end(self, token: Any, response: dict[str, Any], duration_s: float) -> None:
        """Record the outcome of a call begun."""

    def refused(self, peer: Peer, method: str) -> None:
        """Count a call refused for the caller's role (kept apart from actions, aggregated)."""


@dataclass(eq=False)
class Peer:
    """One connected console (or CLI) as the agent sees it."""

    role: Role
    who: str  # key comment or fingerprint: who is calling, for logs and the audit trail
    send: Callable[[bytes], None]
    key: str | None = None  # the SSH key's fingerprint (None: the unix socket); two keys may share a comment
    topics: set[str] = field(default_factory=set)
    wants_full: bool = True  # next tick goes out whole (just subscribed)
    closed: bool = False

    def push(self, event: str, data: Any) -> None:
        if self.closed:
            return
        try:
            line = encode({"event": event, "data": data})
        except ValueError:  # a NaN or infinity got through: send it as null rather than stop the stream
            log.error("event %s held a non-finite number; sent as null", event)
            try:
                line = encode({"event": event, "data": _finite(data)})
            except (ValueError, TypeError, RecursionError):
                log.exception("event %s could not be encoded; not sent", event)
                return
        except (TypeError, RecursionError):
            log.exception("event %s could not be encoded; not sent", event)
            return
        self.send(line)


def _finite(value: Any) -> Any:
    """value with every NaN and infinity replaced by None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def parse_request(line: bytes) -> dict[str, Any]:
    """One request line as a JSON object; RemoteError (parse_error, invalid_request) otherwise."""
    try:
        request = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RemoteError(ErrorCode.PARSE_ERROR, f"not a JSON line: {exc}") from None
    except RecursionError:  # json's C decoder gives up past ~1,000 nested levels
        raise RemoteError(ErrorCode.INVALID_REQUEST, "JSON nested too deeply") from None
    if not isinstance(request, dict):
        raise RemoteError(ErrorCode.INVALID_REQUEST, "expected a JSON object with id, method, params")
    return request


def request_id_of(request: dict[str, Any]) -> int | str | None:
    """The request's id when it is a usable one (an integer or a string)."""
    request_id = request.get("id")
    return request_id if isinstance(request_id, (int, str)) and not isinstance(request_id, bool) else None


_params_error = params_error  # the name the tests know


class Registry:
    """The methods this agent serves: each one an entry of the catalogue, with its handler."""

    def __init__(self, check_results: bool = True) -> None:
        self.specs: dict[str, Method[Any, Any]] = {}
        self._handlers: dict[str, Handler] = {}
        self.audit: AuditTrail | None = None
        # each handler's result is validated against the catalogue's result model before it goes out
        self.check_results = check_results

    def implements(
        self, method: Method[P, R]
    ) -> Callable[[Callable[[Peer, P], Awaitable[R]]], Callable[[Peer, P], Awaitable[R]]]:
        """Register ``async def handler(peer, params: P) -> R`` as the catalogue's ``method`` (a ``Method[P, R]``).

        The name, params model, role and doc are the entry's; the handler gets its params validated (a ``NoParams``
        for a method that takes none) and answers the result model, which goes out as its JSON (here, in one place).
        Typed so that a handler whose params or result differ from the entry's fails the type check; an entry that is
        not the catalogue's own (a copy, a made-up one) is a bug: ValueError at start.
        """
        if CATALOGUE.get(method.name) is not method:
            raise ValueError(
                f"method {method.name!r} is not in the catalogue (agents/wire/catalogue/) as this entry: add its entry there first"
            )

        def decorator(func: Callable[[Peer, P], Awaitable[R]]) -> Callable[[Peer, P], Awaitable[R]]:
            if method.name in self.specs:
                raise ValueError(f"method {method.name} registered twice")
            self.specs[method.name] = method
            self._handlers[method.name] = func
            return func

        return decorator

    async def dispatch(self, peer: Peer, line: bytes | dict[str, Any]) -> dict[str, Any]:
        """One request (a line, or a line already parsed) -> one response object. Never raises."""
        try:
            request = parse_request(line) if isinstance(line, bytes) else line
        except RemoteError as exc:
            return {"id": None, "error": exc.to_wire()}
        request_id = request_id_of(request)
        try:
            return {"id": request_id, "result": await self._dispatch(peer, request)}
        except RemoteError as exc:
            return {"id": request_id, "error": exc.to_wire()}
        except DiskFull as exc:  # not a bug: the machine's disk is full, and the operator must hear exactly that
            return {"id": request_id, "error": {"code": ErrorCode.UNAVAILABLE.value, "message": str(exc)}}
        except Exception:  # a bug: full story in the log, a typed error on the wire
            log.exception("handler failed for request %.200r", request)
            return {
                "id": request_id,
                "error": {"code": ErrorCode.INTERNAL.value, "message": "internal error; see the agent's log"},
            }

    async def _dispatch(self, peer: Peer, request: dict[str, Any]) -> Any:
        request_id = request.get("id")
        if request_id is not None and request_id_of(request) is None:
            raise RemoteError(ErrorCode.INVALID_REQUEST, "id must be an integer or a string")
        method = request.get("method")
        if not isinstance(method, str):
            raise RemoteError(ErrorCode.INVALID_REQUEST, "method must be a string")
        spec = self.specs.get(method)
        if spec is None:
            raise RemoteError(ErrorCode.METHOD_NOT_FOUND, f"unknown method {method[:80]!r}")
        if not peer.role.allows(spec.role, method):
            if self.audit is not None:
                try:
                    self.audit.refused(peer, method)
                except Exception:  # counting refusals must never cost more than refusing
                    log.exception("audit of a refused call failed")
            raise RemoteError(ErrorCode.FORBIDDEN, f"{method} needs the {spec.role} role; this key is a {peer.role}")
        if spec.role is not Role.OPERATOR or self.audit is None:
            return await self._run(method, spec, request.get("params"), peer)
        started = time.monotonic()
        try:
            token = self.audit.begin(peer, method, request.get("params"))
        except Exception as exc:  # no row, no action: an operator action never goes unrecorded
            log.error("refused %s from %s: the audit trail cannot be written: %s", method, peer.who, exc)
            raise RemoteError(
                ErrorCode.UNAVAILABLE,
                f"{method} refused: the audit trail cannot be written ({exc}); free disk space on this machine and retry",
            ) from None
        response: dict[str, Any] = {"error": {"code": "cancelled", "message": "the connection closed first"}}
        try:
            result = await self._run(method, spec, request.get("params"), peer)
            response = {"result": result}
            return result
        except RemoteError as exc:
            response = {"error": exc.to_wire()}
            raise
        except DiskFull as exc:
            response = {"error": {"code": ErrorCode.UNAVAILABLE.value, "message": str(exc)}}
            raise
        except Exception:
            response = {"error": {"code": ErrorCode.INTERNAL.value, "message": "internal error"}}
            raise
        finally:
            try:
                self.audit.end(token, response, time.monotonic() - started)
            except Exception:  # the action happened and its row exists; only the outcome is missing
                log.exception("audit outcome of %s could not be written", method)

    async def _run(self, method: str, spec: Method[Any, Any], raw: Any, peer: Peer) -> Any:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise RemoteError(ErrorCode.INVALID_PARAMS, "params must be an object")
        if spec.params is NoParams and raw:
            raise RemoteError(ErrorCode.INVALID_PARAMS, f"{method} takes no params")
        try:
            params = spec.params.model_validate(raw)
        except ValidationError as exc:
            raise RemoteError(ErrorCode.INVALID_PARAMS, _params_error(exc)) from None
        result = await self._handlers[method](peer, params)
        if not isinstance(result, spec.result):  # the type check sees to it; a handler typed Any could still slip
            log.error("%s answered a %s, not its %s (not sent)", method, type(result).__name__, spec.result.__name__)
            raise RemoteError(ErrorCode.INTERNAL, f"{method}'s result is not a {spec.result.__name__}; see the agent's log")
        wire = result.model_dump(mode="json", by_alias=True)
        if self.check_results:  # a model built unchecked (model_construct) or changed after it was built
            check_result(spec, wire)
        return wire


def check_result(spec: Method[Any, Any], result: Any) -> None:
    """Nothing unvalidated reaches the wire: a result that does not match its model is a bug, answered as `internal`."""
    try:
        spec.result.model_validate(result)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in error["loc"]) or "(the result)"
        log.error(
            "%s answered a result that does not match %s at %s: %s (not sent)",
            spec.name,
            spec.result.__name__,
            where,
            error["msg"],
        )
        raise RemoteError(
            ErrorCode.INTERNAL, f"{spec.name}'s result failed its own check at {where}; see the agent's log"
        ) from None
