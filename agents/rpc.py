"""Method registry and request dispatch: role checks, param validation, typed errors."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from pydantic import BaseModel, ValidationError

from agents.protocol import ErrorCode, MethodSpec, RemoteError, Role, encode

log = logging.getLogger("cetlab.rpc")

Handler = Callable[["Peer", Any], Awaitable[Any]]
# (peer, method, raw params, response, seconds): called for every call of an operator method, allowed or not
AuditHook = Callable[["Peer", str, Any, dict[str, Any], float], None]


@dataclass(eq=False)
class Peer:
    """One connected console (or CLI) as the agent sees it."""

    role: Role
    who: str  # key comment or fingerprint: who is calling, for logs and the audit trail
    send: Callable[[bytes], None]
    topics: set[str] = field(default_factory=set)
    wants_full: bool = True  # next tick goes out whole (just subscribed)
    closed: bool = False

    def push(self, event: str, data: Any) -> None:
        if not self.closed:
            self.send(encode({"event": event, "data": data}))


def _params_error(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error["loc"]) or "params"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


class Registry:
    def __init__(self) -> None:
        self.specs: dict[str, MethodSpec] = {}
        self._handlers: dict[str, Handler] = {}
        self.audit: AuditHook | None = None

    def method(self, name: str, role: Role = Role.VIEWER, params: type[BaseModel] | None = None, doc: str = ""):
        """Register ``async def handler(peer, params)``; params is a validated model or None."""

        def decorator(func: Handler) -> Handler:
            if name in self.specs:
                raise ValueError(f"method {name} registered twice")
            self.specs[name] = MethodSpec(name=name, role=role, params=params, doc=doc or (func.__doc__ or "").strip())
            self._handlers[name] = func
            return func

        return decorator

    async def dispatch(self, peer: Peer, line: bytes) -> dict[str, Any]:
        """One request line -> one response object. Never raises; operator methods go to the audit hook."""
        started = time.monotonic()
        audited: list[tuple[str, Any]] = []  # (method, params) once known to be an operator method
        response: dict[str, Any] = {"id": None, "error": {"code": "cancelled", "message": "the connection closed first"}}
        try:
            response = await self._dispatch(peer, line, audited)
            return response
        finally:
            if audited and self.audit is not None:
                try:
                    self.audit(peer, *audited[0], response, time.monotonic() - started)
                except Exception:  # the trail failing must not fail the action; the log has it
                    log.exception("audit record failed")

    async def _dispatch(self, peer: Peer, line: bytes, audited: list[tuple[str, Any]]) -> dict[str, Any]:
        request_id: Any = None
        try:
            try:
                request = json.loads(line)
            except (ValueError, UnicodeDecodeError) as exc:
                raise RemoteError(ErrorCode.PARSE_ERROR, f"not a JSON line: {exc}") from None
            if not isinstance(request, dict):
                raise RemoteError(ErrorCode.INVALID_REQUEST, "expected a JSON object with id, method, params")
            request_id = request.get("id")
            if request_id is not None and (isinstance(request_id, bool) or not isinstance(request_id, (int, str))):
                request_id = None
                raise RemoteError(ErrorCode.INVALID_REQUEST, "id must be an integer or a string")
            method = request.get("method")
            if not isinstance(method, str):
                raise RemoteError(ErrorCode.INVALID_REQUEST, "method must be a string")
            spec = self.specs.get(method)
            if spec is None:
                raise RemoteError(ErrorCode.METHOD_NOT_FOUND, f"unknown method {method[:80]!r}")
            if spec.role is Role.OPERATOR:
                audited.append((method, request.get("params")))
            if not peer.role.allows(spec.role, method):
                raise RemoteError(ErrorCode.FORBIDDEN, f"{method} needs the {spec.role} role; this key is a {peer.role}")
            raw = request.get("params")
            if raw is None:
                raw = {}
            if not isinstance(raw, dict):
                raise RemoteError(ErrorCode.INVALID_PARAMS, "params must be an object")
            params = None
            if spec.params is not None:
                try:
                    params = spec.params.model_validate(raw)
                except ValidationError as exc:
                    raise RemoteError(ErrorCode.INVALID_PARAMS, _params_error(exc)) from None
            elif raw:
                raise RemoteError(ErrorCode.INVALID_PARAMS, f"{method} takes no params")
            result = await self._handlers[method](peer, params)
            return {"id": request_id, "result": result}
        except RemoteError as exc:
            return {"id": request_id, "error": exc.to_wire()}
        except Exception:  # a bug: full story in the log, a typed error on the wire
            log.exception("handler failed for request %r", line[:200])
            return {"id": request_id, "error": {"code": ErrorCode.INTERNAL.value, "message": "internal error; see the agent's log"}}
