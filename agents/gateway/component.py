"""The gateway as an agent component: starts the HTTP side on `gateway.machine`, keys RPC, section, budgets."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from agents.gateway.keys import KeyStore
from agents.gateway.metering import Meter
from agents.gateway.replicas import replica_figures
from agents.gateway.router import Router
from agents.gateway.target import Target
from agents.orchestra.port import ModelsPort
from agents.runtime.hooks import Hooks
from agents.runtime.peer_links import PeerLinkState
from agents.runtime.peers import PeerClient
from agents.runtime.reach import Reach
from agents.runtime.stopping import DRAIN_S, STOP_DEADLINE_S
from agents.wire.catalogue.gateway import (
    GATEWAY_KEYS_ADD,
    GATEWAY_KEYS_LIST,
    GATEWAY_KEYS_REVOKE,
    GATEWAY_STATUS,
    GatewayStatus,
    KeyAddParams,
    KeyIssued,
    KeyList,
    KeyNameParams,
    KeyRevoked,
)
from agents.wire.catalogue.method import NoParams
from agents.wire.lab.gateway import find_provider_model
from agents.wire.protocol import Telemetry
from agents.wire.sections.costs import ProviderSpend
from agents.wire.sections.gateway import GatewayModelFigures, GatewaySection, KeyUse

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from agents.gateway.server import GatewayHttp
    from agents.orchestra.spec import EngineSpec
    from agents.runtime.core import AgentCore
    from agents.runtime.rpc import Peer
    from agents.wire.lab.gateway import Gateway, GatewayPolicies
    from agents.wire.lab.model import Lab

log = logging.getLogger("cetlab.gateway")

LOOP_S = 1.0  # flush the request log (spend for the section, whose budget_pct the alerts rules read), idle TTLs


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


class GatewayComponent(Hooks):
    """Serves the lab gateway when lab.yaml's gateway.machine is this agent's machine; else does nothing."""

    name = "gateway"
    stop_grace_s = DRAIN_S + STOP_DEADLINE_S  # the requests in flight drain, then the sessions and links close

    def __init__(self, core: AgentCore) -> None:
        self.core = core
        config = core.lab.gateway
        self.enabled = config is not None and config.machine == core.machine.name  # else it does nothing at all
        self.error: str | None = None
        self._task: asyncio.Task[None] | None = None
        self.http: GatewayHttp | None = None
        self.peers: PeerClient | None = None  # the other machines' agents (none in a one-machine lab)
        self.reach: Reach | None = None
        if self.enabled:
            self._register()

    @property
    def lab(self) -> Lab:
        return self.core.lab

    @property
    def config(self) -> Gateway:
        """lab.yaml's `gateway:` (an enabled gateway has one)."""
        if self.lab.gateway is None:
            raise RuntimeError("lab.yaml has no gateway")
        return self.lab.gateway

    @property
    def policies(self) -> GatewayPolicies:
        return self.config.policies

    def engine_spec(self, engine: str) -> EngineSpec | None:
        """What an engine of lab.yaml can do, as this agent's model pool says (None: it runs none, so nothing is known)."""
        models = self.core.find(ModelsPort)
        return models.engine_spec(engine) if models is not None else None

    async def start(self) -> None:
        core = self.core
        config = core.lab.gateway
        if not self.enabled or config is None:
            return
        self.meter = Meter(core.store, core.lab.costs.timezone)
        self.keys = KeyStore(
            core.store,
            self.meter.today,
            self.meter.month,
            zone=self.meter.zone,
            configured=dict(self.config.keys),
            currency=self.lab.costs.currency,
        )
        self.keys.seed_usage(self.meter.key_tokens_today)
        self.keys.seed_money(self.meter.key_cost)
        self.created = int(time.time())  # `created` of every model the gateway lists
        # every other machine (a checkpoint may be served on one lab.yaml gives no model); its own is asked in-process
        others = [m.name for m in core.lab.machines if m.name != core.machine.name]
        if others:
            self.peers = PeerClient(core.lab, core.state_dir, machines=others)
            await self.peers.start()
        self.reach = Reach(core, self.peers)
        self.router = Router(core.lab, core.machine.name, self.reach, self.meter, self.engine_spec)
        from agents.gateway.server import GatewayHttp  # aiohttp (~10 MB) only in the one agent that serves the gateway

        self.http = GatewayHttp(self)
        try:
            await self.http.start(config.host, config.port)
            log.info("gateway on http://%s:%d/v1", config.host, self.http.port)
        except OSError as exc:  # the agent keeps serving; the section says why the gateway does not
            self.error = f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}"
            log.error("gateway: %s", self.error)
        self._task = asyncio.create_task(self._loop(), name="gateway")

    async def stop(self) -> None:
        if not self.enabled:
            return
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.http is not None:
            await self.http.stop()
        if self.peers is not None:
            await self.peers.stop()
        self.meter.flush()

    async def reconfigure(self, old: Lab, new: Lab) -> None:
        """A pushed lab.yaml, live: models, aliases, providers and policies (rate limits, sizes, timeouts) route and
        apply from the next request on; machines added, removed or moved get new peer links. Where it listens is kept
        until the next start."""
        if not self.enabled or new.gateway is None or self.http is None:
            return
        self.router.reconfigure(new)
        self.http.holds.policies = new.gateway.policies
        own = self.core.machine.name
        before = {(m.name, m.host, m.port) for m in old.machines if m.name != own}
        after = {(m.name, m.host, m.port) for m in new.machines if m.name != own}
        if before != after and self.reach is not None:  # machines added, removed or moved: new links (tunnels reopen)
            others = [m.name for m in new.machines if m.name != own]
            replaced, self.peers = self.peers, PeerClient(new, self.core.state_dir, machines=others) if others else None
            if self.peers is not None:
                await self.peers.start()
            self.reach.peers = self.peers
            if replaced is not None:
                await replaced.stop()

    def retry_peers(self) -> None:
        """Peer trust was just written (a push): the links that were untrusted or refused try again now."""
        if self.peers is not None:
            self.peers.core.retry_now()

    def on_telemetry(self, telemetry: Telemetry) -> None:
        pass

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(LOOP_S)
            try:
                self.meter.flush()
                await self.router.put_idle_to_sleep()
            except Exception:
                log.exception("gateway loop")

    # -- money

    def price(self, target: Target, prompt_tokens: int, completion_tokens: int) -> tuple[float | None, float | None]:
        """(what the lab pays at the gateway, what its providers would have charged)."""
        if target.provider_model is not None:
            pm = target.provider_model
            cost = (prompt_tokens * pm.prompt_per_million + completion_tokens * pm.completion_per_million) / 1e6
            return round(cost, 8), round(cost, 8)
        # local: the energy is in the costs ledger; the cloud price says what the providers would have charged
        policy = self.config.models.get(target.model)
        model = self.router.local.get(target.model)
        if model is None:  # a served checkpoint or adapter: no cloud price stands for it
            return 0.0, None
        found = None
        for name in (policy.fallback if policy else None, model.cloud_equivalent):
            found = find_provider_model(self.lab.providers, name) if name else None
            if found:
                break
        if found:
            pm = found[1]
            cloud = (prompt_tokens * pm.prompt_per_million + completion_tokens * pm.completion_per_million) / 1e6
        elif model.cloud_equivalent in self.lab.cloud_prices.tokens_per_million:
            cloud = (prompt_tokens + completion_tokens) * self.lab.cloud_prices.tokens_per_million[model.cloud_equivalent] / 1e6
        else:
            cloud = None
        return 0.0, None if cloud is None else round(cloud, 8)

    # -- what it shows

    def catalogue(self) -> list[dict[str, Any]]:
        """/v1/models: every lab and cloud model with its state and tier."""
        out: list[dict[str, Any]] = []
        for name, model in self.router.local.items():
            info = self.router.model_info(name)
            policy = self.config.models.get(name)
            replicas = replica_figures(self.router, model)
            out.append(
                {
                    "id": name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "cetlab",
                    "tier": "local",
                    "serves": model.serves,  # chat, embedding or rerank: the routes it answers
                    "machine": model.machine,
                    "state": info.state if info else "unknown",
                    "simulated": (spec := self.engine_spec(model.engine)) is not None and spec.simulated,
                    "aliases": policy.aliases if policy else [],
                    "fallback": policy.fallback if policy else None,
                    **({"replicas": [r.model_dump(mode="json") for r in replicas]} if replicas else {}),
                }
            )
            serving = [r.machine for r in replicas if r.state == "warm" and not r.draining]
            if serving:  # one placement serves: the model does, where those placements are (not its first entry's machine)
                out[-1]["state"], out[-1]["machine"] = "warm", ",".join(serving)
        for name, (engine_model, _upstream) in sorted(self.router.served().items()):
            info = self.router.model_info(engine_model.name, engine_model.machine)
            out.append(
                {
                    "id": name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "cetlab",
                    "tier": "local",
                    "machine": engine_model.machine,
                    "state": info.state if info else "unknown",
                    "simulated": bool(info and info.simulated),
                    "served_by": engine_model.name if engine_model.name != name else None,
                    "aliases": [],
                    "fallback": None,
                }
            )
        for provider in self.lab.providers:
            for pm in provider.models:
                out.append(
                    {
                        "id": pm.name,
                        "object": "model",
                        "created": self.created,
                        "owned_by": provider.name,
                        "tier": "provider",
                        "provider": provider.name,
                        "state": "over-budget" if self.router.over_budget(provider) else "available",
                        "simulated": provider.simulated,
                        "prompt_per_million": pm.prompt_per_million,
                        "completion_per_million": pm.completion_per_million,
                    }
                )
        return out

    def provider_spend(self) -> list[ProviderSpend]:
        """Each provider's spend today and this month against its monthly budget (the costs component shows it too)."""
        if not self.enabled:
            return []
        providers = []
        for p in self.lab.providers:
            month = self.meter.spend_month.get(p.name, 0.0)
            pct = 100.0 * month / p.monthly_budget if p.monthly_budget else None
            providers.append(
                ProviderSpend(
                    name=p.name,
                    simulated=p.simulated,
                    spend_today=round(self.meter.spend_day.get(p.name, 0.0), 8),
                    spend_month=round(month, 8),
                    monthly_budget=p.monthly_budget,
                    budget_pct=_finite(pct),
                    key_set=not p.api_key_env or p.simulated or bool(os.environ.get(p.api_key_env)),
                )
            )
        return providers

    def spend_by_day(self, since_day: str) -> dict[str, dict[str, float]]:
        """Provider -> day -> spend from since_day on (empty where this agent serves no gateway)."""
        return self.meter.spend_by_day(since_day) if self.enabled else {}

    def peer_links(self) -> list[PeerLinkState]:
        """PeerLinksPort: the gateway's links to the machines whose models it routes to (role gateway there)."""
        return self.peers.link_states("gateway", "gateway") if self.peers is not None else []

    def section(self) -> GatewaySection | None:
        if not self.enabled:
            return None
        figures = self.meter.model_figures()
        models = []
        for entry in self.catalogue():
            name = entry["id"]
            models.append(
                GatewayModelFigures(
                    name=name,
                    tier=entry["tier"],
                    where=entry.get("machine") or entry.get("provider"),
                    state=entry["state"],
                    simulated=entry["simulated"],
                    replicas=replica_figures(self.router, local) if (local := self.router.local.get(name)) else [],
                    **figures.get(name, {}),
                )
            )
        providers = self.provider_spend()
        keys = [
            KeyUse(
                name=k.name,
                revoked=k.revoked_at is not None,
                rpm=k.rpm,
                tokens_per_day=k.tokens_per_day,
                requests=k.requests,
                requests_last_minute=k.requests_last_minute,
                tokens_today=k.tokens_today,
                last_used=k.last_used,
                models=k.models,
                expires=k.expires,
                expired=k.expired,
                budget=k.budget,
                budget_amount=self.keys.budget_amount(k.name),
                spent=k.spent,
            )
            for k in self.keys.listing()
        ]
        port = self.http.port if self.http else None
        return GatewaySection(
            url=f"http://{self.config.host}:{port}/v1" if port else None,
            machine=self.core.machine.name,
            error=self.error,
            currency=self.lab.costs.currency,
            peers=self.reach.links() if self.reach is not None else {},
            models=models,
            providers=providers,
            keys=keys,
        )

    def metric_families(self) -> Iterator[Metric]:
        """Prometheus series of the gateway (the agent's collector yields them)."""
        current = self.section()
        if current is None:
            return
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily  # only with --metrics-port: not at start

        section = current.to_wire()
        labels = ["model", "tier"]
        gauges = {
            key: GaugeMetricFamily(f"cetlab_gateway_{key}", doc, labels=labels)
            for key, doc in (
                ("rps", "Requests per second over the last minute."),
                ("in_flight", "Requests being answered."),
                ("queued", "Requests waiting for the model to come up."),
                ("p50_latency_s", "Median latency (s), last minute."),
                ("p95_latency_s", "95th percentile latency (s), last minute."),
                ("p50_ttft_s", "Median time to first token (s)."),
                ("p95_ttft_s", "95th percentile time to first token (s)."),
            )
        }
        counters = {
            key: CounterMetricFamily(f"cetlab_gateway_{key}", doc, labels=labels)
            for key, doc in (
                ("requests", "Requests since the agent started."),
                ("wakes", "Bring-ups the gateway caused."),
                ("errors", "Requests answered with an error."),
            )
        }
        for m in section["models"]:
            families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {**gauges, **counters}
            for key, family in families.items():
                if m.get(key) is not None:
                    family.add_metric([m["name"], m["tier"]], m[key])
        spend = GaugeMetricFamily(
            "cetlab_gateway_provider_spend", "Provider spend by period.", labels=["provider", "period", "currency"]
        )
        budget = GaugeMetricFamily("cetlab_gateway_provider_budget", "Provider monthly budget.", labels=["provider", "currency"])
        for p in section["providers"]:
            spend.add_metric([p["name"], "today", section["currency"]], p["spend_today"])
            spend.add_metric([p["name"], "month", section["currency"]], p["spend_month"])
            if p["monthly_budget"] is not None:
                budget.add_metric([p["name"], section["currency"]], p["monthly_budget"])
        key_requests = CounterMetricFamily(
            "cetlab_gateway_key_requests", "Requests per gateway key since the agent started.", labels=["key"]
        )
        for k in section["keys"]:
            key_requests.add_metric([k["name"]], k["requests"])
        yield from gauges.values()
        yield from counters.values()
        yield from (spend, budget, key_requests)

    # -- RPC

    def _register(self) -> None:
        rpc = self.core.rpc

        @rpc.implements(GATEWAY_STATUS)
        async def gateway_status(peer: Peer, _params: NoParams) -> GatewayStatus:
            return GatewayStatus(self.section())

        @rpc.implements(GATEWAY_KEYS_ADD)
        async def keys_add(peer: Peer, params: KeyAddParams) -> KeyIssued:
            token = self.keys.add(params)
            log.info("%s issued gateway key %s", peer.who, params.name)
            section = self.section()
            return KeyIssued(
                name=params.name,
                key=token,
                rpm=params.rpm,
                tokens_per_day=params.tokens_per_day,
                models=params.models,
                expires=None if params.expires is None else params.expires.isoformat(),
                budget=self.keys.budget_text(params.budget),
                url=section.url if section is not None else None,
            )

        @rpc.implements(GATEWAY_KEYS_LIST)
        async def keys_list(peer: Peer, _params: NoParams) -> KeyList:
            return KeyList(keys=self.keys.listing())

        @rpc.implements(GATEWAY_KEYS_REVOKE)
        async def keys_revoke(peer: Peer, params: KeyNameParams) -> KeyRevoked:
            self.keys.revoke(params.name)
            log.info("%s revoked gateway key %s", peer.who, params.name)
            return KeyRevoked(name=params.name, revoked=True)
