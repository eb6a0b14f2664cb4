"""A notification in each route's format: Alertmanager's v2 alerts, plain JSON, Slack, Discord, ntfy."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agents.wire.lab.notify import AlertmanagerRoute, Level, WebhookRoute
from agents.wire.sections.notify import Notification

NTFY_PRIORITY = {Level.INFO: "3", Level.WARNING: "4", Level.CRITICAL: "5"}
NTFY_TAGS = {Level.INFO: "information_source", Level.WARNING: "warning", Level.CRITICAL: "rotating_light"}
DISCORD_MAX = 2000  # characters of a Discord message's content
SLACK_EMOJI = {Level.INFO: ":information_source:", Level.WARNING: ":warning:", Level.CRITICAL: ":rotating_light:"}
LAST_LINES_SHOWN = 5


@dataclass(frozen=True)
class HttpRequest:
    """A POST to a route's URL (the URL itself is added by the sender, which alone reads the secret)."""

    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    path: str = ""  # appended to the route's URL (Alertmanager: /api/v2/alerts)


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def text(n: Notification) -> str:
    """The human text of a notification: its title, then its details (a failed job's last lines)."""
    lines = [n.title()]
    for key, value in n.details.items():
        if key == "last_lines" and isinstance(value, list):
            if value:
                lines.append("last lines:")
                lines += [f"  {line}" for line in value[-LAST_LINES_SHOWN:]]
        elif value is not None:
            lines.append(f"{key.replace('_', ' ')}: {value}")
    if n.alert_id:
        lines.append(f"alert {n.alert_id} · lab {n.lab}")
    return "\n".join(lines)


def _json(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()


def alertmanager_labels(n: Notification) -> dict[str, str]:
    """The labels that identify the alert in Alertmanager: the same for its firing and its resolve."""
    labels = {
        "alertname": n.kind.value,
        "rule": n.rule,
        "severity": n.level.value,
        "lab": n.lab,
        "machine": n.machine,
        "target": n.target,
        "source": "cetlab",
    }
    if n.gpu is not None:
        labels["gpu"] = str(n.gpu)
    if n.job is not None:
        labels["job"] = n.job
    if n.model is not None:
        labels["model"] = n.model
    if n.status == "event" or n.kind.value.startswith("job_"):
        labels["event_at"] = rfc3339(n.at)  # each job event is an alert of its own
    if n.simulated:
        labels["simulated"] = "true"
    return labels


def alertmanager_alert(n: Notification, route: AlertmanagerRoute, now: float) -> dict[str, Any]:
    """One postableAlert of Alertmanager's v2 API (labels, annotations, startsAt, endsAt)."""
    annotations = {"summary": n.message, "description": text(n)}
    if n.alert_id:
        annotations["alert_id"] = n.alert_id
    for key, value in n.details.items():
        if value is not None:
            annotations[key] = "\n".join(value) if isinstance(value, list) else str(value)
    alert: dict[str, Any] = {
        "labels": alertmanager_labels(n),
        "annotations": annotations,
        "startsAt": rfc3339(n.fired_at or n.at),
    }
    if n.status == "resolved":
        alert["endsAt"] = rfc3339(n.cleared_at or n.at)
    elif n.status == "event":
        alert["endsAt"] = rfc3339(n.at + route.event_ttl)
    else:  # firing: valid for four resends, as Prometheus does, so a dead agent's alerts end by themselves
        alert["endsAt"] = rfc3339(now + 4 * route.resend_every)
    return alert


def alertmanager_request(notifications: list[Notification], route: AlertmanagerRoute, now: float) -> HttpRequest:
    return HttpRequest(
        _json([alertmanager_alert(n, route, now) for n in notifications]), {"Content-Type": "application/json"}, "/api/v2/alerts"
    )


def webhook_request(n: Notification, route: WebhookRoute) -> HttpRequest:
    """The POST a webhook route sends for one notification, in its format."""
    if route.format == "slack":  # Slack's incoming webhooks (and Mattermost, Rocket.Chat): text, mrkdwn
        lines = text(n).split("\n")
        body: Any = {"text": f"{SLACK_EMOJI[n.level]} *{lines[0]}*" + "".join(f"\n{line}" for line in lines[1:])}
        return HttpRequest(_json(body), {"Content-Type": "application/json"})
    if route.format == "discord":  # Discord's webhooks: content, at most 2000 characters
        content = text(n)
        if len(content) > DISCORD_MAX:
            content = content[: DISCORD_MAX - 1] + "…"
        return HttpRequest(_json({"content": content, "username": "cetlab"}), {"Content-Type": "application/json"})
    if route.format == "ntfy":  # ntfy: the message is the body, title, priority and tags in headers (the URL names the topic)
        lines = text(n).split("\n")
        return HttpRequest(
            "\n".join(lines[1:] or lines).encode(),
            {
                "Content-Type": "text/plain; charset=utf-8",
                "X-Title": lines[0].encode("ascii", "replace").decode(),
                "X-Priority": NTFY_PRIORITY[n.level],
                "X-Tags": NTFY_TAGS[n.level],
            },
        )
    return HttpRequest(_json({"version": 1, **n.model_dump(mode="json")}), {"Content-Type": "application/json"})
