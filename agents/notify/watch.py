"""machine_offline: one agent (lab.yaml `notify.watch_offline`) watches that the others' agents accept connections.

A machine cannot say it is gone, and the console that sees it go may be closed; so the watcher
opens a TCP connection to each other machine's agent port (its sshd's for `via: sshd`) every
WATCH_EVERY_S, and a machine unreachable for `alerts.offline_for_s` is an outage: one firing
notification, and a resolved one when it answers again. Open outages are kept in state.db, so a
watcher restarted during one neither loses nor repeats it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from agents.runtime.store import Store
from agents.runtime.waits import within
from agents.wire.lab.machines import Machine
from agents.wire.lab.model import Lab

log = logging.getLogger("cetlab.notify")

WATCH_EVERY_S = 5.0
CONNECT_TIMEOUT_S = 3.0

SCHEMA = ["CREATE TABLE notify_offline (machine TEXT PRIMARY KEY, since REAL NOT NULL, fired INTEGER NOT NULL DEFAULT 0)"]


@dataclass(frozen=True)
class Outage:
    machine: str
    since: float  # when it was first seen unreachable
    error: str


def address(machine: Machine) -> tuple[str, int]:
    return (machine.host, machine.ssh_port or 22) if machine.via == "sshd" else (machine.host, machine.port)


async def reachable(machine: Machine) -> str | None:
    """None if the machine's agent (or sshd) accepts a TCP connection now, else why not."""
    host, port = address(machine)
    try:
        _, writer = await within(asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
    except TimeoutError:
        return f"no answer from {host}:{port} within {CONNECT_TIMEOUT_S:g} s"
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"
    writer.close()
    return None


class OfflineWatch:
    """The watcher's loop: `fired(outage)` once an outage lasts `offline_for_s`, `resolved(outage, at)` when it ends."""

    def __init__(
        self, lab: Lab, me: str, store: Store, fired: Callable[[Outage], None], resolved: Callable[[Outage, float], None]
    ):
        self.machines = [m for m in lab.machines if m.name != me]
        self.offline_for_s = lab.alerts.offline_for_s
        self.store = store
        self.fired, self.resolved = fired, resolved
        store.migrate("notify_offline", SCHEMA)
        self.open = {r["machine"]: (r["since"], bool(r["fired"])) for r in store.query("SELECT * FROM notify_offline")}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="notify:watch-offline")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    async def _run(self) -> None:
        while True:
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("watching the other machines failed")
            await asyncio.sleep(WATCH_EVERY_S)

    async def check(self) -> None:
        errors = await asyncio.gather(*(reachable(m) for m in self.machines))
        now = time.time()
        for machine, error in zip(self.machines, errors):
            name = machine.name
            if error is None:
                if name in self.open:
                    since, fired = self.open.pop(name)
                    with self.store.transaction() as db:
                        db.execute("DELETE FROM notify_offline WHERE machine=?", (name,))
                    if fired:
                        self.resolved(Outage(name, since, ""), now)
                continue
            if name not in self.open:
                self.open[name] = (now, False)
                with self.store.transaction() as db:
                    db.execute("INSERT OR REPLACE INTO notify_offline VALUES (?, ?, 0)", (name, now))
            since, fired = self.open[name]
            if not fired and now - since >= self.offline_for_s:
                self.open[name] = (since, True)
                with self.store.transaction() as db:
                    db.execute("UPDATE notify_offline SET fired=1 WHERE machine=?", (name,))
                log.warning("machine %s offline since %.0f s: %s", name, now - since, error)
                self.fired(Outage(name, since, error))
