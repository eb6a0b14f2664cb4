"""Which replica of a model answers a request: the least busy of those serving, a conversation kept where its prefix is.

A model with `replicas:` in lab.yaml runs on several machines (agents/wire/lab/replicas.py). Each request goes to a
placement that serves now (warm, not draining, no operation in flight), the one with the fewest of this gateway's
requests outstanding; a conversation (its messages up to the first user message) goes back to the placement that answered it last, whose
engine holds its prefix in cache, while that is at most AFFINITY_SLACK requests busier than the least busy. With
none serving, the one quickest to bring up is woken or loaded; a draining or failed placement gets nothing new.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import TYPE_CHECKING, Any

from agents.gateway.target import expected_bring_up_s
from agents.runtime.reach import Unreachable
from agents.wire.lab.replicas import placements
from agents.wire.sections.gateway import ReplicaFigures
from agents.wire.states import ModelState

if TYPE_CHECKING:
    from agents.gateway.router import Router
    from agents.wire.lab.model import Model
    from agents.wire.sections.models import ModelInfo

AFFINITY_SLACK = 2  # a conversation stays on its replica while that has at most this many more requests than the least busy
AFFINITY_KEEP = 4096  # conversations remembered per gateway (the oldest forgotten first)
PREFIX_CHARS = 4096  # a completion prompt is known by its beginning


def conversation_key(body: dict[str, Any]) -> str | None:
    """A short digest of what a conversation's requests share at their start; None when there is nothing to keep."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        # what every turn of it starts with: the messages up to its first user message (a system prompt, then that)
        first_user = next((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), 0)
        prefix: Any = messages[: first_user + 1]
    elif isinstance(body.get("prompt"), str) and body["prompt"]:
        prefix = body["prompt"][:PREFIX_CHARS]
    else:
        return None
    try:
        text = json.dumps(prefix, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return None
    return hashlib.blake2b(text.encode(errors="replace"), digest_size=12).hexdigest()


def serving(info: ModelInfo | None) -> bool:
    """Whether this placement takes a new request now."""
    return (
        info is not None
        and info.state is ModelState.WARM
        and bool(info.endpoint)
        and not info.draining
        and info.op in (None, "cache")  # a sleep, cold or swap on its way takes it out; reading its files does not
    )


def _wakeable(info: ModelInfo | None) -> bool:
    """At rest or coming up, with nothing else in flight on it: the gateway may bring it up (or wait for it)."""
    if info is None or info.draining:
        return False
    if info.state in (ModelState.SLEEPING, ModelState.COLD, ModelState.CACHED):
        return info.op is None
    return info.state in (ModelState.LOADING, ModelState.WARMING) and info.op in ("warm", "wake")


async def choose(router: Router, model: Model, conversation: str | None, avoid: frozenset[str]) -> Model:
    """The placement of ``model`` a request goes to (its entry as placed there); machines in ``avoid`` only when no
    other serves or can be brought up. With none serving or wakeable, the first placement (whose state then says why)."""
    name = model.name
    live: list[tuple[Model, ModelInfo | None]] = []
    for placed in placements(model):
        try:
            await router.peers.reachable(placed.machine)
        except Unreachable:
            continue
        live.append((placed, router.model_info(name, placed.machine)))
    for others_only in (True, False):
        allowed = [(p, info) for p, info in live if not (others_only and p.machine in avoid)]
        ready = [p for p, info in allowed if serving(info)]
        if ready:
            return _least_busy(router, name, ready, conversation)
        waking = [(expected_bring_up_s(info), i, p) for i, (p, info) in enumerate(allowed) if _wakeable(info)]
        if waking:
            return _remember(router, name, min(waking, key=lambda w: (w[0], w[1]))[2], conversation)
    failed = [p for p, info in live if info is not None and info.state is ModelState.FAILED]
    return failed[0] if failed else (live[0][0] if live else model)


def _least_busy(router: Router, name: str, ready: list[Model], conversation: str | None) -> Model:
    busy = {p.machine: router.outstanding.get((name, p.machine), 0) for p in ready}
    least = min(busy.values())
    if conversation is not None:
        held = router.affinity.get((name, conversation))
        if held is not None and held in busy and busy[held] <= least + AFFINITY_SLACK:
            router.affinity.move_to_end((name, conversation))
            return _remember(router, name, next(p for p in ready if p.machine == held), conversation)
    # the least busy; between equals, the one chosen longest ago (requests spread while they are few)
    chosen = min(ready, key=lambda p: (busy[p.machine], router.picked.get((name, p.machine), 0.0)))
    return _remember(router, name, chosen, conversation)


def _remember(router: Router, name: str, chosen: Model, conversation: str | None) -> Model:
    router.picked[(name, chosen.machine)] = time.monotonic()
    if conversation is not None:
        router.affinity[(name, conversation)] = chosen.machine
        router.affinity.move_to_end((name, conversation))
        while len(router.affinity) > AFFINITY_KEEP:
            router.affinity.popitem(last=False)
    return chosen


def replica_figures(router: Router, model: Model) -> list[ReplicaFigures]:
    """Each placement of a model with replicas as the gateway sees it (none for a model of one placement)."""
    if not model.replicas:
        return []
    found = []
    for placed in placements(model):
        info = router.model_info(model.name, placed.machine)
        found.append(
            ReplicaFigures(
                machine=placed.machine,
                gpus=placed.gpus,
                state=str(info.state) if info is not None else "unknown",
                draining=info is not None and info.draining,
                outstanding=router.outstanding.get((model.name, placed.machine), 0),
            )
        )
    return found
