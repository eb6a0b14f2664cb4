"""The agent's core methods, as each component's methods.py registers its own."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from agents import __version__
from agents.runtime.rpc import Peer
from agents.shell.doctor_method import register as register_doctor
from agents.shell.labpush import peer_keys_of, register_lab_methods
from agents.telemetry.sim import register_methods as register_sim_methods
from agents.wire.catalogue.agent import (
    HELLO,
    HISTORY,
    METHODS,
    PING,
    SET_INTERVAL,
    STATUS,
    SUBSCRIBE,
    UNSUBSCRIBE,
    HistoryReply,
    Interval,
    MethodInfo,
    MethodList,
    Ping,
    StatusReply,
    Topics,
)
from agents.wire.catalogue.index import CATALOGUE
from agents.wire.catalogue.method import NoParams
from agents.wire.protocol import PROTOCOL_VERSION, ErrorCode, Hello, HistoryParams, IntervalParams, RemoteError, SubscribeParams

if TYPE_CHECKING:
    from agents.shell.agent import Agent

log = logging.getLogger("cetlab.agent")


def register_core(agent: Agent) -> None:
    """The agent's own methods: hello, ping, status, history, the subscriptions, the sampling interval, lab.yaml's
    push, the simulated GPUs' controls, the doctor and the method list (agents/wire/catalogue/agent.py)."""
    rpc = agent.rpc
    register_lab_methods(agent)

    @rpc.implements(HELLO)
    async def hello(peer: Peer, _params: NoParams) -> Hello:
        return Hello(
            protocol=PROTOCOL_VERSION,
            agent_version=__version__,
            machine=agent.machine.name,
            lab=agent.lab.lab,
            role=peer.role,
            capabilities=["telemetry", "history", *(c.name for c in agent.components)],
            simulated=agent.simulated,
            sample_interval_s=agent.interval_s,
            started_at=agent.started_at,
            lab_version=agent.lab_section.version,
            peer_keys=peer_keys_of(agent),
            methods=list(CATALOGUE),  # what this version knows: a newer console says what it lacks
        )

    @rpc.implements(PING)
    async def ping(peer: Peer, _params: NoParams) -> Ping:
        return Ping(t=time.time())

    @rpc.implements(STATUS)
    async def status(peer: Peer, _params: NoParams) -> StatusReply:
        if agent.latest is None:
            raise RemoteError(ErrorCode.UNAVAILABLE, "no sample yet")
        return StatusReply.model_validate(
            {
                "t": agent.latest.t,
                "machine": agent.machine.name,
                "simulated": agent.simulated,
                "gpus": agent.latest.gpus,
                **agent.sections(),
            }
        )

    @rpc.implements(HISTORY)
    async def history(peer: Peer, params: HistoryParams) -> HistoryReply:
        return HistoryReply.model_validate(
            {
                "interval_s": agent.interval_s,
                "simulated": agent.simulated,
                **agent.history.export(params.since, params.max_points),
            }
        )

    @rpc.implements(SUBSCRIBE)
    async def subscribe(peer: Peer, params: SubscribeParams) -> Topics:
        peer.topics.update(params.topics)
        peer.wants_full = True
        return Topics(topics=sorted(peer.topics))

    @rpc.implements(UNSUBSCRIBE)
    async def unsubscribe(peer: Peer, params: SubscribeParams) -> Topics:
        peer.topics.difference_update(params.topics)
        return Topics(topics=sorted(peer.topics))

    @rpc.implements(SET_INTERVAL)
    async def set_interval(peer: Peer, params: IntervalParams) -> Interval:
        agent.interval_s = params.interval_s
        log.info("%s set the sampling interval to %.2f s", peer.who, params.interval_s)
        return Interval(interval_s=agent.interval_s)

    register_sim_methods(rpc, agent.machine.name, agent.gpus, lambda: len(agent.latest.gpus) if agent.latest is not None else 0)

    register_doctor(agent)

    @rpc.implements(METHODS)
    async def methods(peer: Peer, _params: NoParams) -> MethodList:
        return MethodList([MethodInfo(name=s.name, role=s.role, doc=s.doc) for s in agent.rpc.specs.values()])
