"""One budget per principal: an SSH key (by fingerprint) or a uid on the unix socket holds connections, channels,
forwards, calls per second and unread replies counted together, whichever transport carries them (the caps:
agents/runtime/limits.py)."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal, Protocol

from agents.runtime.limits import (
    KEY_BUDGET_BURST,
    KEY_BUDGET_PER_S,
    MAX_CHANNELS_PER_PRINCIPAL,
    MAX_CONNECTIONS_PER_KEY,
    MAX_UNREAD_BYTES_PER_PRINCIPAL,
    KeyBudget,
    ThrottledLog,
    TokenBucket,
    forward_cap,
)

log = logging.getLogger("cetlab.limits")

Held = Literal["connection", "channel", "forward"]
Refusal = Literal["connection", "channel", "forward", "calls", "unread"]
MAX_IDLE_RECORDS = 256  # principals holding nothing whose budget is refilled: past this many, forgotten


def key_principal(fingerprint: str) -> str:
    return f"key {fingerprint}"


def uid_principal(uid: int) -> str:
    return f"uid {uid}"


class Reader(Protocol):
    """A channel as the unread tally sees it: how far behind its reader is, and how to let it go."""

    def unread_bytes(self) -> int: ...
    def drop(self, why: str) -> None: ...


@dataclass
class _Record:
    bucket: TokenBucket = field(default_factory=lambda: TokenBucket(KEY_BUDGET_PER_S, KEY_BUDGET_BURST))
    held: Counter[Held] = field(default_factory=Counter)
    readers: set[Reader] = field(default_factory=set)

    def idle(self) -> bool:
        return not +self.held and not self.readers and self.bucket.take(0) and self.bucket.tokens >= self.bucket.burst


class Slot:
    """One connection, channel or forward a principal holds; release() gives it back (once, however often called)."""

    def __init__(self, tally: Principals, name: str, kind: Held):
        self._tally, self.name, self.kind = tally, name, kind
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._tally._release(self.name, self.kind)


class Principals:
    """Every principal's holdings on this agent, whatever carries them: one tally for the SSH door, its forwards and
    the unix socket, so that no transport multiplies what a principal may cost."""

    def __init__(
        self,
        connections: int = MAX_CONNECTIONS_PER_KEY,
        channels: int = MAX_CHANNELS_PER_PRINCIPAL,
        forwards: int | None = None,
        unread_bytes: int = MAX_UNREAD_BYTES_PER_PRINCIPAL,
    ):
        self._caps: dict[Held, int | None] = {"connection": connections, "channel": channels, "forward": forwards}
        self.unread_cap = unread_bytes
        self.refused: Counter[Refusal] = Counter()  # what was refused, all principals together (metrics, tests)
        self._records: dict[str, _Record] = {}
        self._log = ThrottledLog(log)

    def _record(self, name: str) -> _Record:
        record = self._records.get(name)
        if record is None:
            if len(self._records) >= MAX_IDLE_RECORDS:
                for idle in [n for n, r in self._records.items() if r.idle()]:
                    del self._records[idle]
            record = self._records[name] = _Record()
        return record

    def holds(self, name: str, kind: Held) -> int:
        record = self._records.get(name)
        return record.held[kind] if record is not None else 0

    def cap(self, kind: Held) -> int:
        """The most of `kind` one principal may hold; forwards: a share of the fd limit the process has now."""
        cap = self._caps[kind]
        return forward_cap() if cap is None else cap

    def full(self, name: str, kind: Held) -> bool:
        return self.holds(name, kind) >= self.cap(kind)

    def take(self, name: str, kind: Held, who: str) -> Slot | None:
        """One more `kind` for principal `name`; None (refused: counted and logged) when it holds its cap."""
        if self.full(name, kind):
            self.refuse(name, kind, who, f"it holds {self.cap(kind)} {kind}s (the cap)")
            return None
        self._record(name).held[kind] += 1
        return Slot(self, name, kind)

    def _release(self, name: str, kind: Held) -> None:
        record = self._records.get(name)
        if record is not None and record.held[kind] > 0:
            record.held[kind] -= 1

    def refuse(self, name: str, kind: Refusal, who: str, why: str) -> None:
        """Count and log (throttled) a refusal of `kind` to principal `name`."""
        self.refused[kind] += 1
        self._log(logging.WARNING, f"{kind}:{name}", "refused a %s of %s (%s): %s", kind, who, name, why)

    def budget(self, name: str, connection: TokenBucket) -> KeyBudget:
        """The connection's budget spent together with its principal's, which all its connections share."""
        return KeyBudget(connection, self._record(name).bucket)

    def watch(self, name: str, reader: Reader) -> None:
        self._record(name).readers.add(reader)

    def unwatch(self, name: str, reader: Reader) -> None:
        record = self._records.get(name)
        if record is not None:
            record.readers.discard(reader)

    def check_unread(self, name: str, who: str) -> None:
        """Past the principal's cap on replies its channels have not taken, its channel furthest behind is dropped:
        many slow readers of one principal cannot hold the agent's memory where one could not."""
        record = self._records.get(name)
        if record is None or not record.readers:
            return
        sizes = {reader: reader.unread_bytes() for reader in record.readers}
        if sum(sizes.values()) <= self.unread_cap:
            return
        furthest = max(sizes, key=lambda reader: sizes[reader])
        why = f"{sum(sizes.values())} bytes of replies not taken by its channels together (cap {self.unread_cap})"
        self.refuse(name, "unread", who, why)
        record.readers.discard(furthest)
        furthest.drop(why)


@dataclass(frozen=True)
class Account:
    """A principal's name with the tally that counts it: what a channel carries of its principal."""

    tally: Principals
    name: str
