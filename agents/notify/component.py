"""Component "notify": alerts and job events to each route that takes them, queued in state.db, sent off the tick."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agents.checkpoints.port import CheckpointsPort
from agents.notify.flaps import Flaps, Incident
from agents.notify.outbox import Outbox
from agents.notify.secrets import describe
from agents.notify.sender import RouteSender
from agents.notify.watch import OfflineWatch, Outage
from agents.runtime.hooks import Hooks
from agents.wire.catalogue.method import NoParams
from agents.wire.catalogue.notify import NOTIFY_STATUS, NOTIFY_TEST
from agents.wire.catalogue.notify import NotifyTestParams as TestParams
from agents.wire.lab.notify import AlertmanagerRoute, Kind, Level, kind_of_rule
from agents.wire.local_events import AlertsChanged
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.alerts import AlertInfo
from agents.wire.sections.jobs import JobInfo
from agents.wire.sections.notify import Notification, NotifyStatus, RouteStatus, TestResult
from agents.wire.sections.tick import Tick
from agents.wire.states import JobState

if TYPE_CHECKING:
    from agents.runtime.core import AgentCore
    from agents.runtime.rpc import Peer
    from agents.wire.lab.model import Lab

log = logging.getLogger("cetlab.notify")

LAST_LINES = 10  # of a failed job's log, in its notification
STORED_KEYS_MAX = 10000


@dataclass
class _Progress:
    step: int | None
    since: float
    stalled: bool = False


class NotifyComponent(Hooks):
    """Routes of lab.yaml's `notify:`; each agent sends what it raised itself, so no console needs to be open."""

    reads_tick = True

    name = "notify"

    def __init__(self, core: AgentCore) -> None:
        self.core = core
        self._outbox: Outbox | None = None
        self.senders: dict[str, RouteSender] = {}
        self._progress: dict[str, _Progress] = {}
        self._watch: OfflineWatch | None = None
        self._stored: set[tuple[str, str]] = set()  # (route, key) known to be in the queue (or sent)
        self._firing: list[AlertInfo] = []  # the alerts firing now, as the alerts component last said (AlertsChanged)
        self.flaps = Flaps(core.lab.notify.flap_hold)
        core.subscribe(AlertsChanged, self.alerts_changed)
        self._register()

    @property
    def outbox(self) -> Outbox:
        assert self._outbox is not None, "notify used before start"
        return self._outbox

    async def start(self) -> None:
        self._outbox = Outbox(self.core.store)
        self._open_routes()

    async def reconfigure(self, old: Lab, new: Lab) -> None:
        """A pushed lab.yaml: the routes (and the offline watch) are rebuilt from it when its `notify:` or machines
        changed; what is queued stays in the outbox and goes out on the routes of the same name."""
        if old.notify == new.notify and old.machines == new.machines:
            return
        await self.stop()
        self.senders, self._watch = {}, None
        self._open_routes()

    def _open_routes(self) -> None:
        core = self.core
        settings = core.lab.notify
        base = core.lab.source.parent if core.lab.source is not None else None
        for route in settings.routes:  # on every machine: `machines` filters what is about a machine (the watcher's news too)
            self.senders[route.name] = RouteSender(route, settings, self.outbox, base, self._firing_for)
        for sender in self.senders.values():
            sender.start()
        if settings.watch_offline == core.machine.name and self.senders:
            self._watch = OfflineWatch(core.lab, core.machine.name, core.store, self._offline, self._back)
            self._watch.start()

    async def stop(self) -> None:
        if self._watch is not None:
            await self._watch.stop()
        for sender in self.senders.values():
            await sender.stop()

    def section(self) -> None:
        return None  # delivery state is asked for (notify.status): it changes with every send, not with the tick

    # -- what goes out

    def _queue(
        self, kind: Kind, key: str, notification: Notification, only_if_fired: str | None = None, not_before: float = 0.0
    ) -> None:
        for name, sender in self.senders.items():
            route = sender.route
            if not route.takes(kind, notification.level, notification.machine):
                continue
            if notification.status == "resolved" and (
                not route.send_resolved or only_if_fired is None or not self.outbox.has(name, only_if_fired)
            ):
                continue  # a resolve only follows a firing this route was sent
            if (name, key) in self._stored:
                continue  # a job that ended stays in the jobs section: its event is stored once, not written every tick
            queued = self.outbox.put(name, key, notification, not_before)
            if queued is not None:
                if len(self._stored) >= STORED_KEYS_MAX:
                    self._stored.clear()  # the queue's unique key still sends each once; this only saves writes
                self._stored.add((name, key))
            if queued:
                sender.wake.set()

    def _base(self) -> dict[str, Any]:
        return {"lab": self.core.lab.lab, "machine": self.core.machine.name, "simulated": self.core.simulated}

    def _alert_notification(self, alert: AlertInfo, status: Literal["firing", "resolved"], kind: Kind) -> Notification:
        level = Level(alert.level) if alert.level in {lv.value for lv in Level} else Level.WARNING
        return Notification(
            status=status,
            kind=kind,
            rule=alert.rule,
            level=level,
            target=alert.target,
            message=alert.message,
            at=(alert.cleared_at or alert.fired_at) if status == "resolved" else alert.fired_at,
            alert_id=alert.id,
            fired_at=alert.fired_at,
            cleared_at=alert.cleared_at if status == "resolved" else None,
            value=alert.value,
            threshold=alert.threshold,
            gpu=alert.gpu,
            job=alert.job,
            model=alert.model,
            **self._base(),
        )

    def alerts_changed(self, news: AlertsChanged) -> None:
        """The alerts component's news, in the tick an alert fires or clears: queue it (once per firing) for each route."""
        self._firing = news.active
        if not self.senders:
            return
        now = time.time()
        for alert in news.fired:
            kind = kind_of_rule(alert.rule)
            if kind is None or alert.n <= 0:  # n <= 0: an alert the full disk kept out of state.db
                continue
            verdict, incident = self.flaps.fired(alert, now)
            if verdict == "new":
                self._queue(kind, f"{alert.id}:firing", self._alert_notification(alert, "firing", kind))
                continue
            self._take_back(f"{incident.first.id}:resolved")  # it fired again within the hold: no resolve, no firing
            if verdict == "flapping":
                self._queue(kind, f"{incident.first.id}:flapping", self._flapping(alert, incident, kind))
        for alert in news.cleared:
            kind = kind_of_rule(alert.rule)
            if kind is not None and alert.n > 0:
                incident = self.flaps.cleared(alert, now)
                first = incident.first
                resolved = self._alert_notification(alert, "resolved", kind)
                self._queue(
                    kind,
                    f"{first.id}:resolved",
                    resolved.model_copy(update={"alert_id": first.id, "fired_at": first.fired_at}),
                    only_if_fired=f"{first.id}:firing",
                    not_before=now + self.flaps.hold_s,
                )

    def _take_back(self, key: str) -> None:
        for name in self.senders:
            if self.outbox.cancel(name, key):
                self._stored.discard((name, key))

    def _flapping(self, alert: AlertInfo, incident: Incident, kind: Kind) -> Notification:
        firing = self._alert_notification(alert, "firing", kind)
        said = (
            f"flapping: fired {incident.flaps + 1} times, each time within {self.flaps.hold_s:g} s of clearing: {alert.message}"
        )
        return firing.model_copy(update={"alert_id": incident.first.id, "fired_at": incident.first.fired_at, "message": said})

    def _outage(self, outage: Outage, status: Literal["firing", "resolved"], at: float) -> Notification:
        minutes = (at - outage.since) / 60
        message = (
            f"{outage.machine} is offline: {outage.error}"
            if status == "firing"
            else f"{outage.machine} answers again after {minutes:.0f} min offline"
        )
        return Notification(
            status=status,
            kind=Kind.MACHINE_OFFLINE,
            rule="offline",
            level=Level.CRITICAL,
            lab=self.core.lab.lab,
            machine=outage.machine,
            target="machine",
            message=message,
            at=at,
            alert_id=f"{outage.machine}#offline",
            fired_at=outage.since,
            cleared_at=at if status == "resolved" else None,
            details={"watched_by": self.core.machine.name},
            simulated=self.core.lab.machine(outage.machine).simulated,
        )

    def _offline(self, outage: Outage) -> None:
        key = f"{outage.machine}#offline@{outage.since:.3f}"
        self._queue(Kind.MACHINE_OFFLINE, f"{key}:firing", self._outage(outage, "firing", outage.since))

    def _back(self, outage: Outage, at: float) -> None:
        key = f"{outage.machine}#offline@{outage.since:.3f}"
        self._queue(Kind.MACHINE_OFFLINE, f"{key}:resolved", self._outage(outage, "resolved", at), only_if_fired=f"{key}:firing")

    def _firing_for(self, route: AlertmanagerRoute) -> list[Notification]:
        """The alerts firing now that this route takes (Alertmanager gets them again every resend_every)."""
        out = []
        for alert in self._firing:
            kind = kind_of_rule(alert.rule)
            if kind is None or not route.takes(kind, Level(alert.level), self.core.machine.name):
                continue
            first = self.flaps.first_of(alert)  # a flap of an incident fires under its first firing's id
            if not self.outbox.has(route.name, f"{first.id}:firing"):
                continue  # fired before this route existed, or not sent yet (its queued row goes first)
            firing = self._alert_notification(alert, "firing", kind)
            out.append(firing.model_copy(update={"alert_id": first.id, "fired_at": first.fired_at}))
        return out

    def on_tick(self, tick: Tick) -> None:
        """Job events of this tick: a run finished, failed, or stalled (no new step for notify.stall_after)."""
        if not self.senders:
            return
        now = tick.telemetry.t
        seen = set()
        for job in tick.jobs:
            if job.coordinator is not None and job.coordinator != self.core.machine.name:
                continue  # a node of another machine's job: its coordinator tells
            seen.add(job.id)
            if job.state in (JobState.EXITED, JobState.FAILED, JobState.LOST):
                self._job_ended(job)
            elif job.state == JobState.RUNNING:
                self._job_progress(job, now)
        for job_id in set(self._progress) - seen:
            del self._progress[job_id]

    def _job_ended(self, job: JobInfo) -> None:
        ended = job.ended_at or 0.0
        if ended < self.outbox.since:
            return  # ended before this agent sent notifications at all
        if job.state == JobState.EXITED and job.stop_requested is None and job.exit_code == 0:
            kind, level, what = Kind.JOB_FINISHED, Level.INFO, "finished"
        elif job.state == JobState.EXITED:
            return  # stopped on an operator's request: somebody was there
        else:
            kind, level, what = Kind.JOB_FAILED, Level.CRITICAL, str(job.state)
        details: dict[str, Any] = {"steps": job.step, "max_steps": job.max_steps, "elapsed_s": job.elapsed_s}
        if kind == Kind.JOB_FINISHED:
            details["final_loss"] = job.loss
            best = self._best_checkpoint(job)
            if best is not None:
                details["best_checkpoint"] = best
            elif job.checkpoints:  # the checkpoints component has not judged the run yet (its files settle first)
                details["last_checkpoint"] = max(job.checkpoints, key=lambda c: c.step).path
        else:
            details["exit_code"] = job.exit_code
            details["error"] = job.error
            details["last_lines"] = job.last_lines[-LAST_LINES:]
        loss = f", final loss {job.loss:.4g}" if kind == Kind.JOB_FINISHED and job.loss is not None else ""
        reason = f": {job.error}" if kind == Kind.JOB_FAILED and job.error else ""
        message = f"job {job.id} ({job.recipe}) {what} at step {job.step if job.step is not None else '-'}{loss}{reason}"
        self._queue(
            kind,
            f"job {job.id}:{kind.value}",
            Notification(
                status="event",
                kind=kind,
                rule=kind.value,
                level=level,
                target=f"job {job.id}",
                message=message,
                at=ended,
                job=job.id,
                details={k: v for k, v in details.items() if v is not None},
                **self._base(),
            ),
        )

    def _best_checkpoint(self, job: JobInfo) -> str | None:
        """The run's best checkpoint as the checkpoints component found it (None while it has not)."""
        checkpoints = self.core.find(CheckpointsPort)
        for run in checkpoints.run_summaries() if checkpoints is not None else []:
            if run.job == job.id and run.best_step is not None:
                loss = f" (loss {run.best_loss:.4g})" if run.best_loss is not None else ""
                return f"{run.path.rstrip('/')}/checkpoint-{run.best_step}{loss}"
        return None

    def _job_progress(self, job: JobInfo, now: float) -> None:
        progress = self._progress.get(job.id)
        if progress is None or progress.step != job.step:
            self._progress[job.id] = _Progress(job.step, now)
            return
        stall = self.core.lab.notify.stall_after
        if progress.stalled or now - progress.since < stall:
            return
        progress.stalled = True
        minutes = (now - progress.since) / 60
        message = f"job {job.id} ({job.recipe}) stalled: no new step for {minutes:.0f} min (at step {job.step if job.step is not None else '-'})"
        self._queue(
            Kind.JOB_STALLED,
            f"job {job.id}:stalled:{job.step}",
            Notification(
                status="event",
                kind=Kind.JOB_STALLED,
                rule="job_stalled",
                level=Level.WARNING,
                target=f"job {job.id}",
                message=message,
                at=now,
                job=job.id,
                details={"step": job.step, "stalled_s": round(now - progress.since)},
                **self._base(),
            ),
        )

    # -- seeing and testing it

    def status(self) -> NotifyStatus:
        routes = []
        for name, sender in self.senders.items():
            route = sender.route
            routes.append(
                RouteStatus.model_validate(
                    {
                        **self.outbox.route_counts(name),
                        "name": name,
                        "kind": getattr(route, "kind"),  # noqa: B009 (HttpRoute, the base, has none; every route built has one)
                        "format": getattr(route, "format", None),
                        "simulated": route.simulated,
                        "target": describe(route),
                        "queued": self.outbox.pending_count(name),
                        "rate_limited": sender.rate_limited,
                        "next_try_at": sender.next_try_at,
                        "problem": sender.problem,
                    }
                )
            )
        return NotifyStatus(machine=self.core.machine.name, routes=routes)

    async def test(self, route_name: str) -> TestResult:
        sender = self.senders.get(route_name)
        if sender is None:
            names = [r.name for r in self.core.lab.notify.routes]
            raise RemoteError(
                ErrorCode.NOT_FOUND,
                f"no route {route_name!r} in lab.yaml's notify.routes"
                + (f" (routes: {', '.join(names)})" if names else " (it has none)"),
            )
        now = time.time()
        notification = Notification(
            status="event",
            kind=Kind.TEST,
            rule="test",
            level=Level.INFO,
            target="route " + route_name,
            message=f"test notification from {self.core.machine.name} for route {route_name} (cetlab alerts notify-test)",
            at=now,
            **self._base(),
        )
        answer, _ = await sender.send(notification)
        self.outbox.record(route_name, answer)
        log.info("route %s: test sent: %s", route_name, answer.answer)
        return TestResult(
            route=route_name,
            machine=self.core.machine.name,
            ok=answer.ok,
            answer=answer.answer,
            elapsed_s=round(answer.at - now, 3),
        )

    def _register(self) -> None:
        rpc = self.core.rpc

        @rpc.implements(NOTIFY_STATUS)
        async def notify_status(peer: Peer, _params: NoParams) -> NotifyStatus:
            return self.status()

        @rpc.implements(NOTIFY_TEST)
        async def notify_test(peer: Peer, params: TestParams) -> TestResult:
            return await self.test(params.route)
