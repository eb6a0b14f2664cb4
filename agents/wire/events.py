"""The events an agent pushes (tick, log, notice): one model each, built where the agent pushes, validated where they enter.

The agent builds a ``Notice`` or a ``LogEvent`` and sends ``event.to_wire()``; the client core (agents/runtime/link.py)
reads every pushed line back with ``parse_event`` and hands readers the model, or drops an event that does not
validate (``EventInvalid`` names the event and the field). A tick's sections are typed one by one by the view
(agents/runtime/view.py): its envelope is typed here.

Kept apart from the method catalogue: the client core parses events on its read loop, and a cold CLI does not
build the catalogue's hundred models to read its first line.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationError

from agents.wire.protocol import EVENT_LOG, EVENT_NOTICE, EVENT_TICK, FiniteFloat
from agents.wire.sections.alerts import AlertInfo
from agents.wire.sections.base import Section
from agents.wire.states import JobState

# a notice's level: an alert's level, or "error" for something that failed (a job, a model, serving a checkpoint)
NoticeLevel = Literal["info", "warning", "error", "critical"]


class PushEvent(Section):
    """One pushed event's data; ``event`` is its name on the wire (the topic a console subscribes to)."""

    event: ClassVar[str]


class TickEvent(PushEvent):
    """`tick`: the sections that changed since the last tick (all of them when ``full``), each typed by the view."""

    event: ClassVar[str] = EVENT_TICK
    t: FiniteFloat  # the sample's time
    full: bool = False  # the whole state (just subscribed): sections not in it are gone
    changed: dict[str, Any] = Field(
        default_factory=dict
    )  # section name -> its JSON (see SECTION_MODELS; "gpus": those that changed)


class LogEvent(PushEvent):
    """`log` (topic ``log:<job>``, after ``jobs.logs`` with follow): new lines of a job's log."""

    event: ClassVar[str] = EVENT_LOG
    job: str
    lines: list[str] = Field(default_factory=list)
    offset: int  # where the next read continues
    ended: bool = False  # the job ended and its log was read to the end: the last event of the follow
    state: JobState | None = None  # None: the job is gone from the agent
    exit_code: int | None = None


class Notice(PushEvent):
    """`notice`: something worth a toast (an alert fired or cleared, a job ended, a model failed)."""

    event: ClassVar[str] = EVENT_NOTICE
    level: NoticeLevel
    message: str  # without the machine's name: the console puts it in front
    machine: str | None = None
    alert: AlertInfo | None = None  # the alert that fired or cleared, where the notice is one


EVENT_MODELS: dict[str, type[PushEvent]] = {m.event: m for m in (TickEvent, LogEvent, Notice)}


class EventInvalid(ValueError):
    """A pushed event that is not one this client knows, or whose data does not fit its model."""

    def __init__(self, event: str, field: str, message: str):
        super().__init__(f"event {event!r}: {field}: {message}")
        self.event, self.field = event, field


def parse_event(event: Any, data: Any) -> PushEvent:
    """The typed data of one pushed event; raises EventInvalid naming the event and the field."""
    model = EVENT_MODELS.get(event) if isinstance(event, str) else None
    if model is None:
        raise EventInvalid(str(event)[:80], "event", "not an event this client knows")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "data"
        raise EventInvalid(event, field, first["msg"]) from None
