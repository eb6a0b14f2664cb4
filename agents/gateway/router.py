"""Routing: a model name to a warm endpoint on some machine or to a provider; wake on request, fallback tiers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from agents.gateway.metering import Meter
from agents.gateway.replicas import choose
from agents.gateway.target import NotServable, Target, expected_bring_up_s, placement_key, unreachable, why_failed
from agents.runtime.reach import Reach, Unreachable
from agents.runtime.view import MachineView
from agents.wire.catalogue.method import request
from agents.wire.catalogue.models import MODELS_COLD, MODELS_LIST, MODELS_SLEEP, MODELS_SWAP, MODELS_WARM, ModelParams, SwapParams
from agents.wire.engine_address import EngineAddress
from agents.wire.lab.gateway import Provider, ProviderModel, find_provider_model
from agents.wire.lab.model import Lab, Model
from agents.wire.lab.replicas import models_on, placement_on, placements
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.models import ModelInfo
from agents.wire.states import ModelState
from agents.wire.words import plural

if TYPE_CHECKING:
    from agents.orchestra.spec import EngineSpec

log = logging.getLogger("cetlab.gateway")
T = TypeVar("T")

WAKE_POLL_S = 0.01  # while a model wakes (about a second): ask its agent this often, so the answer is not a tick late
LOAD_POLL_S = 0.25  # while a model loads (tens of seconds)
# while requests wait at an engine, its agent is asked whether it went to sleep after 20 ms, then at doubling
# intervals up to a second (a request that just joined starts the 20 ms again, at most once a second)
WATCH_FIRST_S, WATCH_MAX_S = 0.02, 1.0
ASLEEP = frozenset({ModelState.SLEEPING, ModelState.COLD, ModelState.CACHED})  # what the gateway wakes or loads


SWAPPABLE = frozenset({ModelState.WARM, ModelState.SLEEPING})  # an engine that is up and settled: its GPUs can be taken


class Router:
    """Knows every local model's state (the peers' ticks) and brings models up behind a bounded queue."""

    def __init__(self, lab: Lab, machine: str, peers: Reach, meter: Meter, engine_spec: Callable[[str], EngineSpec | None]):
        self.machine, self.peers, self.meter = machine, peers, meter  # peers: every machine, its own in-process
        self.engine_spec = engine_spec  # what an engine can do: the model pool's port answers it (None: not known)
        self.reconfigure(lab)
        self._bring_ups: dict[str, asyncio.Task[ModelInfo]] = {}
        self.last_request: dict[str, float] = {}  # model -> monotonic time of the last gateway request
        self.brought_up: set[str] = set()  # models the gateway woke or loaded: its idle TTL takes them down again
        self.runtime: dict[str, Model] = {}  # checkpoints served as models at run time, as the gateway last saw them
        self._watchers: dict[str, asyncio.Task[None]] = {}  # model -> the task that wakes it while requests wait at its engine
        self._watching: dict[str, int] = {}  # model -> requests waiting at its engine
        self._watch_interval: dict[str, float] = {}  # model -> the watcher's next wait
        self._poked: dict[str, float] = {}  # model -> when a joining request last reset that wait
        self.outstanding: dict[tuple[str, str], int] = {}  # (model, machine) -> gateway requests at that replica now
        self.picked: dict[tuple[str, str], float] = {}  # (model, machine) -> when it was last chosen (ties: the other)
        self.affinity: OrderedDict[tuple[str, str], str] = OrderedDict()  # (model, conversation) -> replica's machine

    def reconfigure(self, lab: Lab) -> None:
        """The lab it routes for (at start, and live after a push): its models, aliases, providers and policies."""
        if lab.gateway is None:
            raise ValueError(f"lab {lab.lab} has no gateway: section")
        self.lab, self.gateway, self.policies = lab, lab.gateway, lab.gateway.policies
        self.local = {m.name: m for m in lab.models}
        self.aliases = {alias: name for name, p in self.gateway.models.items() for alias in p.aliases}

    # -- what the lab looks like

    def _view(self, machine: str) -> MachineView | None:
        return self.peers.view(machine)

    def model_info(self, name: str, machine: str | None = None) -> ModelInfo | None:
        """The model as its agent last said (a tick, or a fresh listing); None while its machine's models are unknown.
        ``machine``: which placement (default: the model's own machine)."""
        model = self.local.get(name) or self.runtime[name]
        view = self._view(machine or model.machine)
        return view.model(name) if view is not None else None

    def canonical(self, name: str) -> str:
        return self.aliases.get(name, name)

    def serves(self, name: str) -> str | None:
        """What a lab model's engine answers (lab.yaml's model.serves; a served checkpoint or adapter: its engine's);
        None for a provider's model (its own API says) or an unknown name."""
        name = self.canonical(name)
        model = self.local.get(name)
        if model is None:
            served = self.served().get(name)
            model = served[0] if served is not None else None
        return getattr(model, "serves", "chat") if model is not None else None

    def served(self) -> dict[str, tuple[Model, str]]:
        """What the agents serve beyond lab.yaml: checkpoints served as models and LoRA adapters loaded into warm
        engines (`<run>-step<N>`), by name: (the model whose engine answers, the name to ask that engine for)."""
        found: dict[str, tuple[Model, str]] = {}
        for machine, view in self.peers.all_views():
            for info in view.model_list:
                name = info.name
                model = self.local.get(name)
                if model is not None and model.machine != machine:  # a replica's engine: adapters loaded there
                    model = placement_on(model, machine) or model
                if model is None:
                    model = self.runtime.get(name)
                    if model is None or model.machine != machine:
                        # built unvalidated: the agent that serves it validated it, and its engine may be one lab.yaml
                        # of this agent's version does not spell
                        model = self.runtime[name] = Model.model_construct(
                            name=name, path="", engine=info.engine, machine=machine, gpus=list(info.gpus)
                        )
                    found[name] = (model, info.served_name or name)
                for adapter in info.adapters:
                    if adapter not in self.local:
                        found[adapter] = (model, adapter)
        return found

    async def endpoint(self, model: Model, endpoint: str) -> tuple[str, str | None]:
        """The engine's endpoint as the gateway reaches it: (its URL, the unix socket that carries it or None).

        Engines listen on a unix socket of their agent's (or 127.0.0.1:PORT where lab.yaml says so): this machine's
        are reached at that socket; another machine's through the SSH connection to its agent, a forward from a private
        unix socket here (agents/wire/engine_address.py)."""
        address = EngineAddress.parse(endpoint)
        url = f"{address.origin}/v1"
        if model.machine == self.machine:
            return url, address.socket
        try:
            socket_path = await self.peers.tunnel(model.machine, address)
        except RemoteError as exc:
            raise NotServable(
                503,
                f"cannot reach {model.name} on {model.machine}: {exc.message}",
                "machine_offline",
                self.policies.retry_after_s,
            ) from None
        return url, socket_path

    def _provider_model(self, name: str) -> tuple[Provider, ProviderModel]:
        """A provider's model named in lab.yaml (its cross-check makes sure every fallback names one)."""
        found = find_provider_model(self.lab.providers, name)
        if found is None:
            raise NotServable(404, f"no provider has a model {name!r}", "model_not_found", param="model")
        return found

    def provider_target(self, name: str, reason: str | None = None) -> Target:
        provider, model = self._provider_model(name)
        return Target(
            model=model.name,
            tier="provider",
            base_url=provider.base_url.rstrip("/"),
            upstream_model=model.upstream_name,
            where=provider.name,
            simulated=provider.simulated,
            provider=provider,
            provider_model=model,
            reason=reason,
        )

    def over_budget(self, provider: Provider) -> bool:
        return provider.monthly_budget is not None and self.meter.spend_month.get(provider.name, 0.0) >= provider.monthly_budget

    # -- routing

    async def route(
        self, name: str, max_wait_s: float | None, conversation: str | None = None, avoid: frozenset[str] = frozenset()
    ) -> Target:
        """The target for a request of `name`; wakes or loads a local model, or falls back, as the policies say.
        A model with replicas: the placement chosen for ``conversation`` (agents/gateway/replicas.py), preferring
        machines not in ``avoid`` (a retry's)."""
        name = self.canonical(name)
        if name in self.local:
            model = self.local[name]
            if model.replicas:
                model = await choose(self, model, conversation, avoid)
            return await self._route_local(model, max_wait_s)
        served = self.served().get(name)
        if served is not None:
            engine_model, upstream = served
            target = await self._route_local(engine_model, max_wait_s, allow_fallback=False)
            target.model, target.upstream_model = name, upstream  # metered under its own name
            return target
        found = find_provider_model(self.lab.providers, name)
        if found is None:
            known = sorted([*self.local, *self.aliases, *self.served(), *(m.name for p in self.lab.providers for m in p.models)])
            raise NotServable(
                404,
                f"no model {name!r} in the lab or its providers (try: {', '.join(known[:20])})",
                "model_not_found",
                param="model",
            )
        provider, pmodel = found
        if self.over_budget(provider):
            local = self._local_for(pmodel.name)
            if self.policies.budget_exceeded == "fallback-local" and local is not None:
                target = await self._route_local(local, max_wait_s, allow_fallback=False)
                target.reason = f"{provider.name} is past its monthly budget"
                return target
            raise NotServable(
                429,
                f"{provider.name} has spent its monthly budget ({provider.monthly_budget}); "
                f"gateway.policies.budget_exceeded is {self.policies.budget_exceeded}",
                "budget_exceeded",
            )
        return self.provider_target(f"{provider.name}/{pmodel.name}")

    def _local_for(self, provider_model: str) -> Model | None:
        """The local model standing in for a provider's (its fallback, or its cloud_equivalent)."""
        for name, policy in self.gateway.models.items():
            if policy.fallback and policy.fallback.rpartition("/")[2] == provider_model:
                return self.local[name]
        return next((m for m in self.lab.models if m.cloud_equivalent == provider_model), None)

    async def _route_local(self, model: Model, max_wait_s: float | None, allow_fallback: bool = True) -> Target:
        policy = self.gateway.models.get(model.name)
        fallback = policy.fallback if policy and allow_fallback else None
        if fallback is not None:
            provider, _ = self._provider_model(fallback)
            if self.over_budget(provider):
                fallback = None  # the budget forces the other direction: local only
        budget_s = max_wait_s if max_wait_s is not None else (policy.max_wait_s if policy and policy.max_wait_s else None)
        self.last_request[model.name] = time.monotonic()
        try:
            await self.peers.reachable(model.machine)
        except Unreachable as exc:
            if fallback:
                return self.provider_target(fallback, str(exc))
            raise unreachable(exc, self.policies.retry_after_s) from None
        info = self.model_info(model.name, model.machine)
        if info is not None and info.state is ModelState.WARM and info.endpoint:
            return await self._local_target(model, info, woke=False)
        if info is not None and info.state is ModelState.FAILED:
            if fallback:
                return self.provider_target(fallback, f"{model.name} failed on {model.machine}")
            raise NotServable(502, f"{model.name} failed on {model.machine}: {why_failed(info)}", "engine_failed")
        if fallback and budget_s is not None and expected_bring_up_s(info) > budget_s:
            return self.provider_target(
                fallback,
                f"{model.name} is {info.state if info else 'unknown'}: "
                f"about {expected_bring_up_s(info):.1f} s to bring up, over the {budget_s:g} s budget",
            )
        timeout_s = min(self.policies.queue_timeout_s, budget_s) if budget_s is not None else self.policies.queue_timeout_s
        try:
            info = await self.ensure_warm(model, timeout_s)
        except NotServable as exc:
            if fallback and exc.code != "queue_full":
                return self.provider_target(fallback, exc.message)
            raise
        return await self._local_target(model, info, woke=True)

    async def _local_target(self, model: Model, info: ModelInfo, woke: bool) -> Target:
        assert info.endpoint is not None  # a warm model's, checked by every caller
        url, socket_path = await self.endpoint(model, info.endpoint)
        return Target(
            model=model.name,
            tier="local",
            base_url=url.rstrip("/"),
            upstream_model=info.served_name or model.name,
            where=model.machine,
            simulated=info.simulated,
            woke=woke,
            engine_model=model,
            unix_socket=socket_path,
            length_param=spec.length_param if (spec := self.engine_spec(model.engine)) is not None else None,
        )

    # -- a request at an engine that goes to sleep

    async def while_awake(self, target: Target, work: Awaitable[T]) -> T:
        """Run ``work`` (a request to ``target``), waking its model should it go to sleep meanwhile.

        vLLM queues a request that reaches a sleeping engine until someone wakes it (never a 503): one sent
        just as a rotation or `cetlab sleep` puts the model down would wait for the gateway's timeout. While
        requests wait at an engine, one watcher per model looks at its state and wakes it; if it cannot, they
        fail now, with the reason.
        """
        job = asyncio.ensure_future(work)
        model = target.engine_model
        if model is None:
            return await job
        key, at = placement_key(model), (model.name, model.machine)
        watcher = self._watchers.get(key)
        if watcher is None or watcher.done():
            watcher = self._watchers[key] = asyncio.create_task(self._wake_if_asleep(model), name=f"gateway-watch-{key}")
        self._watching[key] = self._watching.get(key, 0) + 1
        self.outstanding[at] = self.outstanding.get(at, 0) + 1
        self._poke(key)
        wakes = self.meter.stats(model.name).wakes
        try:
            await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not job.done():
                watcher.result()  # raises NotServable: the model could not be woken
            return await job
        finally:
            self._watching[key] -= 1
            if not self._watching[key]:
                del self._watching[key]
                watcher.cancel()
            self.outstanding[at] -= 1
            if not self.outstanding[at]:
                del self.outstanding[at]
            if not job.done():
                job.cancel()
                await asyncio.gather(job, return_exceptions=True)
            if self.meter.stats(model.name).wakes > wakes:
                target.woke = True

    def _poke(self, name: str) -> None:
        """A request joins: look again soon (the last tick may be a second old), at most once a second per model."""
        now = time.monotonic()
        if now - self._poked.get(name, 0.0) >= 1.0:
            self._poked[name] = now
            self._watch_interval[name] = WATCH_FIRST_S

    async def _wake_if_asleep(self, model: Model) -> None:
        """Ask the model's agent (fresh, not the tick) at growing intervals while requests wait; wake it if it sleeps."""
        while True:
            key = placement_key(model)
            interval = self._watch_interval.get(key, WATCH_FIRST_S)
            await asyncio.sleep(interval)
            self._watch_interval[key] = min(WATCH_MAX_S, interval * 2)
            await self.refresh(model.machine)
            info = self.model_info(model.name, model.machine)
            # only a sleeping engine holds requests (a stopped one refuses them: they fail, and are not reloaded for)
            if info is not None and info.state is ModelState.SLEEPING and not info.op:
                log.info("%s went to sleep with gateway requests waiting at its engine: waking it", model.name)
                await self.ensure_warm(model, self.policies.queue_timeout_s)

    # -- bringing models up

    async def ensure_warm(self, model: Model, timeout_s: float) -> ModelInfo:
        """Wait (in the bounded queue) until the model is warm; concurrent requests share one bring-up."""
        stats = self.meter.stats(model.name)
        if stats.queued >= self.policies.queue_size:
            raise NotServable(
                503,
                f"{plural(stats.queued, 'request')} already wait for {model.name} (gateway.policies.queue_size)",
                "queue_full",
                self.policies.retry_after_s,
            )
        stats.queued += 1
        try:
            key = placement_key(model)
            task = self._bring_ups.get(key)
            if task is None or task.done():
                task = self._bring_ups[key] = asyncio.create_task(self._bring_up(model), name=f"gateway-up-{key}")
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(task)
        except TimeoutError:
            raise NotServable(
                504, f"{model.name} was not warm within {timeout_s:g} s", "timeout", self.policies.retry_after_s
            ) from None
        finally:
            stats.queued -= 1

    async def _bring_up(self, model: Model) -> ModelInfo:
        """Wake or load the model, deciding on a fresh listing: the last tick can be a second old (a model that was
        going to sleep then may be asleep now, and needs waking, not waiting for)."""
        started = False
        while True:
            fresh = await self.refresh(model.machine)
            info = self.model_info(model.name, model.machine)
            if info is None:
                view = self._view(model.machine)
                raise NotServable(
                    503,
                    f"{model.machine} is {view.link if view else 'not a peer'}: its models are unknown",
                    "machine_offline",
                    self.policies.retry_after_s,
                )
            state = info.state
            if state is ModelState.WARM and info.endpoint:
                return info
            if state is ModelState.FAILED:
                raise NotServable(502, f"{model.name} failed on {model.machine}: {why_failed(info)}", "engine_failed")
            if fresh and state in ASLEEP and not info.op:
                if started:  # woken by us, then put back by someone else before we could use it
                    raise NotServable(
                        503, f"{model.name} went back to {state} on {model.machine}", "no_room", self.policies.retry_after_s
                    )
                await self._start(model)
                started = True
                continue
            await asyncio.sleep(WAKE_POLL_S if info.op == "wake" else LOAD_POLL_S)

    async def _start(self, model: Model) -> None:
        try:
            await request(self.peers, model.machine, MODELS_WARM, ModelParams(model=model.name))
        except RemoteError as exc:
            if exc.code == ErrorCode.MODEL_FILE_MISSING:  # no retry helps: the message says where and the fix
                raise NotServable(503, exc.message, "model_file_missing") from None
            job = exc.data.get("job") if isinstance(exc.data, dict) else None
            if job is not None:  # its GPUs run a training job (the lab queue gave them): no swap helps; back at its end
                retry = exc.data.get("retry_after_s") if isinstance(exc.data, dict) else None
                raise NotServable(
                    503,
                    f"{model.name} gave its GPUs to job {job}: {exc.message}",
                    "gpus_in_use_by_job",
                    int(retry) if isinstance(retry, int | float) and retry > 0 else self.policies.retry_after_s,
                ) from None
            if exc.code != ErrorCode.CONFLICT or self.policies.swap != "lru-unpinned":
                raise NotServable(
                    503, f"cannot bring {model.name} up on {model.machine}: {exc.message}", "no_room", self.policies.retry_after_s
                ) from None
            victim = self._swap_victim(model)
            if victim is None:
                raise NotServable(
                    503,
                    f"no room for {model.name} on {model.machine} and nothing idle to swap out: {exc.message}",
                    "no_room",
                    self.policies.retry_after_s,
                ) from None
            try:
                await request(
                    self.peers, model.machine, MODELS_SWAP, SwapParams.model_validate({"out": victim, "in": model.name})
                )
            except RemoteError as swap_exc:
                raise NotServable(
                    503,
                    f"swapping {victim} out for {model.name} failed: {swap_exc.message}",
                    "no_room",
                    self.policies.retry_after_s,
                ) from None
        self.meter.stats(model.name).wakes += 1
        self.brought_up.add(model.name)

    def _swap_victim(self, model: Model) -> str | None:
        """An unpinned, idle model on the same GPUs, least recently asked for: never one with requests in flight."""
        candidates = []
        for other in models_on(self.lab, model.machine):
            if other.name == model.name or not set(other.gpus) & set(model.gpus):
                continue
            info = self.model_info(other.name, model.machine)
            if info is None:
                continue
            busy = self.meter.stats(other.name).in_flight or info.requests_running or info.op
            if info.state in SWAPPABLE and not info.pinned and not busy:
                candidates.append((self.last_request.get(other.name, 0.0), other.name))
        return min(candidates)[1] if candidates else None

    async def refresh(self, machine: str) -> bool:
        """A fresh look at a machine's models, not the last tick's (ticks come once a second). False when the
        machine did not answer (the last tick's view stays; a lost connection is waited for first)."""
        try:
            listing = await request(self.peers, machine, MODELS_LIST)
        except RemoteError as exc:
            if exc.code == ErrorCode.DISCONNECTED:
                try:
                    await self.peers.wait_online(machine)
                except Unreachable as gone:
                    raise unreachable(gone, self.policies.retry_after_s) from None
            return False
        self.peers.apply_models(machine, listing)
        return True

    # -- idle TTL

    async def put_idle_to_sleep(self) -> None:
        """Models idle past their TTL go to sleep (or stop, where the engine cannot sleep)."""
        now = time.monotonic()
        for name, entry in self.local.items():
            policy = self.gateway.models.get(name)
            ttl = (
                policy.idle_ttl_s
                if policy and policy.idle_ttl_s
                else (self.policies.idle_ttl_s if name in self.brought_up else None)
            )
            if ttl is None or self.meter.stats(name).in_flight or now - self.last_request.get(name, now) < ttl:
                continue
            for model in placements(entry):  # each replica of an idle model
                info = self.model_info(name, model.machine)
                if info is None or info.state is not ModelState.WARM or info.pinned or info.op:
                    continue
                spec = self.engine_spec(model.engine)
                method = MODELS_SLEEP if spec is not None and spec.can_sleep else MODELS_COLD  # not known: cold works for all
                try:
                    await request(self.peers, model.machine, method, ModelParams(model=name))
                    self.brought_up.discard(name)
                    log.info("%s idle for %.0f s: %s", name, now - self.last_request.get(name, now), method.name)
                except RemoteError as exc:
                    log.warning("idle TTL of %s: %s", name, exc.message)
