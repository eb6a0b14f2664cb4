"""The typed notification (what a route receives, what the queue keeps) and the delivery state consoles read."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agents.wire.lab.notify import Kind, Level
from agents.wire.protocol import Finite

Detail = str | int | Finite | bool | list[str] | None


class Notification(BaseModel):
    """One alert firing or resolving, or one job event; kept in the queue as JSON, sent in the route's format."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["firing", "resolved", "event"]  # an event (job finished, failed, stalled; a test) has no end to wait for
    kind: Kind
    rule: str  # the alert rule (gpu_hot, budget_80 ...) or the event's kind
    level: Level
    lab: str
    machine: str
    target: str  # "gpu0", "job m5-3", "model llama-3.1-8b", "disk", "provider sim-cloud"
    message: str
    at: float  # unix time it happened (fired, cleared, the job ended)
    alert_id: str | None = None  # "<machine>#<n>" for an alert
    fired_at: float | None = None
    cleared_at: float | None = None
    value: Finite = None
    threshold: Finite = None
    gpu: int | None = None
    job: str | None = None
    model: str | None = None
    details: dict[str, Detail] = Field(default_factory=dict)  # final_loss, best_checkpoint, last_lines ...
    simulated: bool = False  # from a machine with simulated GPUs (labelled SIM)

    def title(self) -> str:
        """One line: level, machine and what happened."""
        state = {"firing": "", "resolved": "RESOLVED ", "event": ""}[self.status]
        sim = " (SIM)" if self.simulated else ""
        return f"[{self.level.upper()}] {state}{self.machine}{sim}: {self.message}"


class Delivery(BaseModel):
    """The last answer of a route's endpoint."""

    at: float
    ok: bool
    answer: str  # "HTTP 200", "exit code 0", "connection refused" (secrets redacted)


class RouteStatus(BaseModel):
    """One route as one agent sees it: what it sends to, what waits, what went wrong."""

    name: str
    kind: str  # alertmanager | webhook | command
    format: str | None = None  # webhooks: json | slack | discord | ntfy
    simulated: bool = False  # the demo's local receiver: SIM
    target: str  # the clear URL, or where the secret is read ("$SLACK_URL", "file /etc/cetlab/slack.url"), or the argv[0]
    queued: int = 0  # waiting to be sent (retrying, or held by the rate limit)
    delivered: int = 0  # accepted by the endpoint, all time
    failures: int = 0  # failed attempts, all time
    dropped: int = 0  # given up after notify.give_up_after
    rate_limited: bool = False  # sends are held by the route's rate limit now
    next_try_at: float | None = None  # the next attempt of the oldest queued one
    last_delivery: Delivery | None = None  # the last accepted send
    last_failure: Delivery | None = None  # the last failed attempt
    problem: str | None = None  # the route cannot send at all now (a missing environment variable, a file too open)


class NotifyStatus(BaseModel):
    """`notify.status`: a machine's routes."""

    machine: str
    routes: list[RouteStatus] = Field(default_factory=list)


class TestResult(BaseModel):
    """`notify.test`: what the endpoint answered to a test notification."""

    route: str
    machine: str
    ok: bool
    answer: str
    elapsed_s: float
