"""Delivery: one task per route sends its queue in order, with timeouts, backoff and a rate limit, off the tick."""

from __future__ import annotations

import asyncio
import collections
import importlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.notify.formats import HttpRequest, alertmanager_request, webhook_request
from agents.notify.outbox import Outbox, Pending
from agents.notify.secrets import SecretError, endpoint, redact
from agents.runtime.children import minimal_env, run_helper
from agents.runtime.store import DiskFull
from agents.runtime.waits import wait_event
from agents.wire.lab.notify import AlertmanagerRoute, CommandRoute, HttpRoute, Notify, WebhookRoute
from agents.wire.sections.notify import Delivery, Notification

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger("cetlab.notify")

ANSWER_CHARS = 200  # of an endpoint's answer kept and shown
PERMANENT_HTTP = range(400, 500)  # the endpoint refused this notification itself: retrying would not help ...
RETRIED_HTTP = {408, 425, 429}  # ... except these

_aiohttp: Any = None


async def load_aiohttp() -> Any:
    """aiohttp, imported the first time a route sends over HTTP (in a thread: the import must not stall a tick).

    Agents without HTTP routes (and without the gateway) never load it: they stay lighter."""
    global _aiohttp
    if _aiohttp is None:
        _aiohttp = await asyncio.to_thread(importlib.import_module, "aiohttp")
    return _aiohttp


class RouteSender:
    """One route: its queue sent in order by one task; a slow or dead endpoint delays only this route."""

    def __init__(
        self,
        route: HttpRoute | CommandRoute,
        settings: Notify,
        outbox: Outbox,
        base: Path | None,
        firing: Callable[[AlertmanagerRoute], list[Notification]],
    ):
        self.route = route
        self.settings = settings
        self.outbox = outbox
        self.base = base  # the lab file's folder: url_file, token_file and cwd are relative to it
        self.firing = firing  # the alerts firing now that this route takes (Alertmanager resends them)
        self.wake = asyncio.Event()
        self.sent_at: collections.deque[float] = collections.deque()
        self.rate_limited = False
        self.next_try_at: float | None = None
        self.problem: str | None = None
        self.last_resend = 0.0
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"notify:{self.route.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._session is not None:
            await self._session.close()

    # -- the loop

    async def _run(self) -> None:
        while True:
            try:
                wait = await self._step()
            except asyncio.CancelledError:
                raise
            except DiskFull:
                wait = self.settings.retry_max  # the answer could not be recorded: try again once there is room
            except Exception:
                log.exception("route %s: sending failed", self.route.name)
                wait = self.settings.retry_max
            if wait > 0:
                self.wake.clear()
                await wait_event(self.wake, wait)  # not wait_for: a stop() right after a wake-up must end this loop

    def _resend_wait(self) -> float:
        if not isinstance(self.route, AlertmanagerRoute):
            return self.settings.retry_max * 4
        return max(0.05, self.last_resend + self.route.resend_every - time.time())

    async def _step(self) -> float:
        """Send what is due; return how long to wait before looking again (woken early when something is queued)."""
        now = time.time()
        pending = self.outbox.next(self.route.name, now)
        if pending is None:
            self.next_try_at = None
            if isinstance(self.route, AlertmanagerRoute) and now - self.last_resend >= self.route.resend_every:
                await self._resend(self.route)
            return self._resend_wait()
        if now - pending.created_at > self.settings.give_up_after:
            log.error(
                "route %s: %s not accepted within %.0f s: dropped", self.route.name, pending.key, self.settings.give_up_after
            )
            self.outbox.dropped(
                pending.n, self.route.name, Delivery(at=now, ok=False, answer=f"given up after {pending.attempts} attempts")
            )
            return 0
        if pending.next_at > now:
            self.next_try_at = pending.next_at
            return min(pending.next_at - now, self._resend_wait())
        limit = self.route.rate_limit
        while self.sent_at and self.sent_at[0] <= now - limit.per:
            self.sent_at.popleft()
        if len(self.sent_at) >= limit.count:
            self.rate_limited = True
            return self.sent_at[0] + limit.per - now
        self.rate_limited = False
        self.sent_at.append(now)
        answer, permanent = await self.send(pending.notification)
        self._record(pending, answer, permanent)
        return 0

    def _record(self, pending: Pending, answer: Delivery, permanent: bool) -> None:
        name = self.route.name
        if answer.ok:
            self.next_try_at = None
            self.outbox.delivered(pending.n, name, answer)
            log.info("route %s: delivered %s (%s)", name, pending.key, answer.answer)
        elif permanent:
            self.outbox.dropped(pending.n, name, answer)
            log.error("route %s: %s refused by the endpoint, not retried: %s", name, pending.key, answer.answer)
        else:
            delay = min(self.settings.retry_max, self.settings.retry_first * 2 ** min(pending.attempts, 30))
            self.next_try_at = answer.at + delay
            self.outbox.failed(pending.n, name, answer, self.next_try_at)
            log.warning(
                "route %s: delivering %s failed (attempt %d, next in %.0f s): %s",
                name,
                pending.key,
                pending.attempts + 1,
                delay,
                answer.answer,
            )

    async def _resend(self, route: AlertmanagerRoute) -> None:
        """Alertmanager forgets an alert not posted again for a while: post every firing one again."""
        self.last_resend = time.time()
        firing = self.firing(route)
        if not firing:
            return
        answer, _ = await self._post_alertmanager(firing)
        if not answer.ok:
            self.outbox.record(route.name, answer)
            log.warning("route %s: resending %d firing alerts failed: %s", route.name, len(firing), answer.answer)

    # -- one send

    async def send(self, notification: Notification) -> tuple[Delivery, bool]:
        """Deliver one notification now. Returns (the answer, whether a failure is permanent); never raises."""
        route = self.route
        try:
            if isinstance(route, CommandRoute):
                return await self._run_command(route, notification)
            if isinstance(route, AlertmanagerRoute):
                if notification.status == "firing":
                    self.last_resend = time.time()  # the resend of the others can wait a full period
                return await self._post_alertmanager([notification])
            assert isinstance(route, WebhookRoute)
            return await self._post(route, webhook_request(notification, route))
        except SecretError as exc:
            self.problem = str(exc)
            return Delivery(at=time.time(), ok=False, answer=str(exc)), False

    async def _post_alertmanager(self, notifications: list[Notification]) -> tuple[Delivery, bool]:
        assert isinstance(self.route, AlertmanagerRoute)
        return await self._post(self.route, alertmanager_request(notifications, self.route, time.time()))

    async def _post(self, route: HttpRoute, request: HttpRequest) -> tuple[Delivery, bool]:
        target = endpoint(route, self.base)
        self.problem = None
        aiohttp = await load_aiohttp()
        if self._session is None:
            self._session = aiohttp.ClientSession()
        headers = dict(request.headers)
        if target.token:
            headers["Authorization"] = f"Bearer {target.token}"
        url = target.url.rstrip("/") + request.path if request.path else target.url
        started = time.time()
        try:
            async with self._session.post(
                url,
                data=request.body,
                headers=headers,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=route.timeout_s),
            ) as response:
                body = (await response.content.read(ANSWER_CHARS * 4)).decode("utf-8", "replace")
                status = response.status
        except TimeoutError:
            return Delivery(at=time.time(), ok=False, answer=f"no answer within {route.timeout_s:g} s"), False
        except aiohttp.ClientError as exc:
            reason = str(exc) or type(exc).__name__
            return Delivery(
                at=time.time(), ok=False, answer=redact(f"{type(exc).__name__}: {reason}", target.secrets)[:ANSWER_CHARS]
            ), False
        summary = " ".join(body.split())[:ANSWER_CHARS]
        answer = redact(f"HTTP {status}" + (f": {summary}" if summary else ""), target.secrets)
        ok = 200 <= status < 300
        log.debug("route %s: HTTP %d in %.2f s", route.name, status, time.time() - started)
        return Delivery(at=time.time(), ok=ok, answer=answer), (
            not ok and status in PERMANENT_HTTP and status not in RETRIED_HTTP
        )

    async def _run_command(self, route: CommandRoute, notification: Notification) -> tuple[Delivery, bool]:
        cwd = route.cwd or (str(self.base) if self.base else None)
        if cwd is not None and self.base is not None and not Path(cwd).is_absolute():
            cwd = str(self.base / cwd)
        payload = json.dumps({"version": 1, **notification.model_dump(mode="json")}).encode() + b"\n"
        try:
            # the route's command gets the agent's PATH, HOME and locale only: never the provider keys or route tokens
            # the agent holds; its output is read in bounded pieces (its last line is the answer)
            done = await run_helper(route.argv, timeout_s=route.timeout_s, env=minimal_env(), stdin_data=payload, cwd=cwd)
        except OSError as exc:
            return Delivery(at=time.time(), ok=False, answer=f"cannot run {route.argv[0]}: {exc.strerror or exc}"), False
        if done.timed_out:
            return Delivery(
                at=time.time(), ok=False, answer=f"{route.argv[0]} did not finish within {route.timeout_s:g} s: killed"
            ), False
        last = " ".join(done.output.decode("utf-8", "replace").strip().splitlines()[-1:])[:ANSWER_CHARS]
        ok = done.returncode == 0
        return Delivery(at=time.time(), ok=ok, answer=f"exit code {done.returncode}" + (f": {last}" if last else "")), False
