"""lab.yaml's `notify:` section: routes (Alertmanager, webhooks, commands), what each takes, and where its secrets live."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, field_validator, model_validator

from agents.wire.schema import Name, Strict, parse_duration

Seconds = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]
ENV_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
EnvName = Annotated[str, Field(pattern=ENV_RE)]


class Level(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class Kind(StrEnum):
    """What a notification is about: an alert rule (some under a wider name) or a job event."""

    GPU_HOT = "gpu_hot"
    VRAM_FULL = "vram_full"
    GPU_STARVED = "gpu_starved"
    NO_IMPROVEMENT = "no_improvement"
    CHECKPOINT_SLOW = "checkpoint_slow"
    DISK_FULL = "disk_full"
    DIVERGED = "diverged"
    STATE_LOST = "state_lost"
    MODEL_FAILED = "model_failed"  # the rule engine_failed: a model failed to load or died
    BUDGET = "budget"  # the rules budget_80 and budget_100
    MACHINE_OFFLINE = "machine_offline"
    JOB_FINISHED = "job_finished"
    JOB_FAILED = "job_failed"
    JOB_STALLED = "job_stalled"
    TEST = "test"  # `cetlab alerts notify-test`


RULE_KINDS = {
    "engine_failed": Kind.MODEL_FAILED,
    "budget_80": Kind.BUDGET,
    "budget_100": Kind.BUDGET,
    "offline": Kind.MACHINE_OFFLINE,
}


def kind_of_rule(rule: str) -> Kind | None:
    """The kind an alert rule is routed under (None: a rule no route can name, e.g. one added later)."""
    if rule in RULE_KINDS:
        return RULE_KINDS[rule]
    try:
        return Kind(rule)
    except ValueError:
        return None


class RateLimit(Strict):
    """At most `count` sends per `per`; the rest wait in the queue (never dropped)."""

    count: Annotated[int, Field(ge=1, le=100000)] = 20
    per: Seconds = 60.0


def _clear_url(value: str) -> str:
    """A URL written in lab.yaml: http(s), a host, and nothing that looks like a credential."""
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        raise ValueError("url: a URL has no spaces or control characters (percent-encode them)")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("url: expected an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            "url: a URL with user:password@ holds a secret: put the URL in the agent's environment (url_env) "
            "or a file of mode 600 (url_file), not in lab.yaml"
        )
    if parts.query:
        raise ValueError(
            "url: a URL with a ?query often carries a token: put it in the agent's environment (url_env) "
            "or a file of mode 600 (url_file), not in lab.yaml"
        )
    if parts.fragment:
        raise ValueError("url: a URL's #fragment is never sent to the endpoint (a token pasted there reaches nobody): remove it")
    return value


class RouteBase(Strict):
    name: Name
    levels: list[Level] = Field(default_factory=list)  # empty: every level
    kinds: list[Kind] = Field(default_factory=list)  # empty: every kind
    machines: list[Name] = Field(default_factory=list)  # empty: every machine (each agent sends its own)
    send_resolved: bool = True  # also say when an alert clears
    timeout_s: Seconds = 10.0  # one delivery attempt; then it counts as failed and is retried
    rate_limit: RateLimit = Field(default_factory=RateLimit)
    simulated: bool = False  # a local stand-in (the demo's receiver): labelled SIM wherever it shows

    def takes(self, kind: Kind, level: Level, machine: str) -> bool:
        """Whether this route takes a notification of that kind and level from that machine (`test` always)."""
        if kind == Kind.TEST:
            return True
        return (
            (not self.levels or level in self.levels)
            and (not self.kinds or kind in self.kinds)
            and (not self.machines or machine in self.machines)
        )


class HttpRoute(RouteBase):
    """A route over HTTP: its URL in clear (no credential in it), or a secret from the environment or a file of mode 600."""

    url: Annotated[str, Field(max_length=2048)] | None = None  # in clear: checked to hold no credential (see _clear_url)
    url_env: EnvName | None = None  # the agent's environment variable holding the URL (a Slack hook's holds its token)
    url_file: str | None = None  # a file of mode 600 holding the URL; relative to the lab file
    token_env: EnvName | None = None  # sent as "Authorization: Bearer <token>" (ntfy access tokens, a proxy's)
    token_file: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _url_holds_no_secret(cls, value: object) -> object:
        # checked on the whole route, so that the error does not echo the URL (and a token in it) back
        if isinstance(value, dict) and isinstance(value.get("url"), str):
            _clear_url(value["url"])
        return value

    @model_validator(mode="after")
    def _one_url(self) -> HttpRoute:
        given = [k for k in ("url", "url_env", "url_file") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of url, url_env (an environment variable) or url_file (a file of mode 600)"
                + (f"; got {', '.join(given)}" if given else "")
            )
        if self.token_env is not None and self.token_file is not None:
            raise ValueError("give token_env or token_file, not both")
        return self


class AlertmanagerRoute(HttpRoute):
    """Prometheus Alertmanager: alerts POSTed to its v2 API (url is its base, e.g. http://127.0.0.1:9093)."""

    kind: Literal["alertmanager"]
    resend_every: Seconds = 60.0  # firing alerts are posted again this often (Alertmanager resolves the silent ones)
    event_ttl: Seconds = 3600.0  # a job event (finished, failed) is an alert that ends by itself after this long


class WebhookRoute(HttpRoute):
    """A generic webhook: a JSON POST in one of the ready formats."""

    kind: Literal["webhook"]
    format: Literal["json", "slack", "discord", "ntfy"] = "json"

    @model_validator(mode="after")
    def _hook_url_is_secret(self) -> WebhookRoute:
        if self.format in ("slack", "discord") and self.url is not None:
            raise ValueError(
                f"a {self.format} incoming-webhook URL holds its token: give url_env (an environment variable of "
                "the agent) or url_file (a file of mode 600) instead of url"
            )
        return self


class CommandRoute(RouteBase):
    """A command the agent runs (argv, no shell) with the notification as JSON on stdin; exit code 0 means delivered."""

    kind: Literal["command"]
    argv: list[str] = Field(min_length=1)
    cwd: str | None = None  # default: the lab file's folder

    @field_validator("argv", mode="before")
    @classmethod
    def _argv_not_shell(cls, value: object) -> object:
        if isinstance(value, str):
            raise ValueError("expected an argv list like [/usr/local/bin/page-me, --urgent], not a shell string")
        return value


Route = Annotated[AlertmanagerRoute | WebhookRoute | CommandRoute, Field(discriminator="kind")]


class Notify(Strict):
    """Where alerts and job events go when nobody watches a console."""

    routes: list[Route] = Field(default_factory=list)
    watch_offline: Name | None = None  # the machine whose agent checks that the others answer (machine_offline)
    stall_after: Seconds = 1800.0  # a running job with no new step this long is job_stalled
    retry_first: Seconds = 5.0  # a failed delivery is retried after this, doubling each time ...
    retry_max: Seconds = 300.0  # ... up to this
    give_up_after: Seconds = 86400.0  # a notification not accepted after this long is dropped (and counted)
    flap_hold: Seconds = 60.0  # an alert's resolve waits this long: firing again meanwhile is one flap, not two notifications

    def route(self, name: str) -> HttpRoute | CommandRoute | None:
        return next((r for r in self.routes if r.name == name), None)


def cross_check(notify: Notify, machines: list[str]) -> list[tuple[tuple[str | int, ...], str]]:
    """Route names unique, machines named exist."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    if notify.watch_offline is not None and notify.watch_offline not in machines:
        problems.append(
            (("notify", "watch_offline"), f"no machine named {notify.watch_offline!r} (machines: {', '.join(machines)})")
        )
    seen: set[str] = set()
    for i, route in enumerate(notify.routes):
        if route.name in seen:
            problems.append((("notify", "routes", i, "name"), f"duplicate route name {route.name!r}"))
        seen.add(route.name)
        for j, machine in enumerate(route.machines):
            if machine not in machines:
                problems.append(
                    (("notify", "routes", i, "machines", j), f"no machine named {machine!r} (machines: {', '.join(machines)})")
                )
    return problems
