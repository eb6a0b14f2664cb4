"""What enters the agent from outside (a trainer's progress.json, a checkpoint's trainer_state.json, an engine's /metrics), validated where it enters.

A document that is missing or half-written is "no news" (None). One that parses but does not
match its schema raises :class:`BadDocument`, whose message names the file and the field; the
caller reports it on its job or run and goes on. Numbers are finite or null by type: a NaN loss
(a diverged run) becomes null, and the step where it happened is kept (``diverged_at_step``).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agents.wire.protocol import Finite
from agents.wire.safe_read import NotARegularFile, TooLarge, read_capped
from agents.wire.sections.jobs import JobProgress

log = logging.getLogger("cetlab.documents")

D = TypeVar("D", bound=BaseModel)  # a document's schema

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024  # a trainer_state.json of a long run is a few MB; more is not one


class BadDocument(ValueError):
    """A file that parses but does not hold what its schema says."""


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


class Document(BaseModel):
    """Readers ignore keys they do not know: writers may add keys without a new version."""

    model_config = ConfigDict(extra="ignore")


class Progress(JobProgress):
    """cetlab-train's progress file (agents/train/progress.py has the protocol): what a job keeps of it, and the rest."""

    version: int = 1
    pid: int | None = None
    grad_norm: Finite = None
    elapsed_s: Finite = None
    diverged_at_step: int | None = None  # written by a trainer that replaced a NaN loss with null
    loss_diverged: bool = False  # the trainer wrote a NaN or infinite loss (set on reading, never by the writer)

    @model_validator(mode="before")
    @classmethod
    def _see_divergence(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = {**data, "loss_diverged": _non_finite(data.get("loss"))}
        return data

    @property
    def diverged_step(self) -> int | None:
        """Where the run diverged, if it did: the trainer's word, else this report's step when its loss is NaN."""
        if self.diverged_at_step is not None:
            return self.diverged_at_step
        return self.step if self.loss_diverged else None

    def kept(self) -> JobProgress:
        """What a job keeps of it."""
        return JobProgress.model_validate(self.model_dump(include=set(JobProgress.model_fields)))


class LogRow(Document):
    """One row of a trainer_state.json log_history (a logging step, an eval, or the end-of-run summary)."""

    step: int | None = None
    global_step: int | None = None
    loss: Finite = None
    train_loss: Finite = None
    eval_loss: Finite = None
    loss_diverged: bool = False

    @model_validator(mode="before")
    @classmethod
    def _see_divergence(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = {**data, "loss_diverged": _non_finite(data.get("loss")) or _non_finite(data.get("train_loss"))}
        return data

    @property
    def at_step(self) -> int | None:
        return self.step if self.step is not None else self.global_step


class TrainerState(Document):
    """A Hugging Face checkpoint's trainer_state.json (the fields the agent uses)."""

    epoch: Finite = None
    global_step: int | None = None
    best_model_checkpoint: str | None = None
    log_history: list[LogRow] = Field(default_factory=list)

    @field_validator("log_history", mode="before")
    @classmethod
    def _rows_only(cls, rows: Any) -> Any:
        # a row that is not an object carries nothing to read; skip it rather than refuse the run's history
        return [row for row in rows if isinstance(row, dict)] if isinstance(rows, list) else rows

    @property
    def diverged_at_step(self) -> int | None:
        """The first logged step whose training loss was NaN or infinite."""
        return next((row.at_step for row in self.log_history if row.loss_diverged), None)


def _problem(path: Path, exc: ValidationError) -> str:
    parts = []
    for error in exc.errors()[:3]:
        where = ".".join(str(p) for p in error["loc"]) or "document"
        parts.append(f"{where}: {error['msg']}")
    return f"{path}: " + "; ".join(parts)


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in a file, or None when it is missing, empty or half-written; BadDocument when it is not an object."""
    try:
        raw = read_capped(path, MAX_DOCUMENT_BYTES)
    except OSError as exc:
        return parse_json_object(exc, path)
    return parse_json_object(raw, path)


def parse_json_object(raw: bytes | OSError, path: Path) -> dict[str, Any] | None:
    """:func:`read_json_object` on what reading the file gave: its bytes, or the OSError (read off the loop elsewhere)."""
    if isinstance(raw, TooLarge):
        raise BadDocument(f"{path}: larger than {MAX_DOCUMENT_BYTES // 2**20} MiB")
    if isinstance(raw, NotARegularFile):  # a symlink, FIFO or device where a document belongs: never followed or waited on
        raise BadDocument(f"{path}: {raw.strerror}; not read")
    if isinstance(raw, OSError):
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):  # torn, empty, not UTF-8, or nested past reason
        return None
    if not isinstance(doc, dict):
        raise BadDocument(f"{path}: not a JSON object")
    return doc


def load(path: Path, schema: type[D], raw: bytes | OSError | None = None) -> D | None:
    """The document at ``path`` (or what reading it gave, `raw`) validated into ``schema``; None for no news,
    BadDocument for a bad one."""
    doc = read_json_object(path) if raw is None else parse_json_object(raw, path)
    if doc is None:
        return None
    try:
        return schema.model_validate(doc)
    except ValidationError as exc:
        raise BadDocument(_problem(path, exc)) from None


def load_progress(path: Path, raw: bytes | OSError | None = None) -> Progress | None:
    return load(path, Progress, raw)


def load_trainer_state(path: Path) -> TrainerState | None:
    return load(path, TrainerState)


class EngineFigures(Document):
    """A model server's /metrics page, as the engine parsed it (vLLM names, summed over labels)."""

    requests_running: Finite = None
    requests_waiting: Finite = None
    kv_cache_pct: Finite = None
    prompt_tokens_total: Finite = None
    generation_tokens_total: Finite = None
    ttft_sum_s: Finite = None
    ttft_count: Finite = None

    @property
    def ttft_s(self) -> float | None:
        """Mean time to first token since the engine started."""
        if not self.ttft_count or self.ttft_sum_s is None:
            return None
        return round(self.ttft_sum_s / self.ttft_count, 3)


class ChildRecord(Document):
    """The job runner's child.json: which process is the trainer (its pid and start time, against pid reuse)."""

    pid: int
    create_time: Finite = None


class ExitRecord(Document):
    """The job runner's exit.json: how the trainer ended."""

    exit_code: int | None = None
    ended_at: Finite = None
    error: str | None = None


def load_quietly(path: Path, schema: type[D]) -> D | None:
    """A runner's record, or None when it is missing, torn or not what its schema says (the caller treats it as absent)."""
    try:
        return load(path, schema)
    except BadDocument as exc:
        log.warning("%s", exc)
        return None
