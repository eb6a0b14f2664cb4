"""The cetlab-train progress protocol: one small JSON file, rewritten atomically.

The trainer (``cetlab-train``) keeps a status file up to date so that the agent
can follow a run without parsing logs. This module is the whole protocol; it
imports nothing heavy (only the standard library), so the agent can import it
on its own.

Where the file is
-----------------
``progress_file`` in the trainer's YAML config, by default
``<output_dir>/progress.json``. The environment variable
``CETLAB_PROGRESS_FILE`` overrides both (the agent sets it when it launches a
trainer, so it knows where to look).

When it is written
------------------
* once at start (``state: "starting"``), before the model is loaded;
* when training begins (``"running"``, with ``step`` = the step resumed from);
* after every logging step (``logging_steps``, 1 by default);
* when a checkpoint save begins (``"saving"``) and right after it ends
  (back to ``"running"``, with the new entry in ``checkpoints``);
* at the end: ``"finished"`` (exit status 0) or ``"failed"`` (exit status
  non-zero, ``error`` set).

Every write goes to a temporary file in the same folder followed by
``os.replace``, so a reader sees either the previous or the next complete
document, never a torn one. Readers should still use :func:`read_progress`,
which treats a missing, empty or unparsable file as "no news" (``None``).

Format (version 1)
------------------
A JSON object; numbers are JSON numbers, times are Unix seconds (float)::

    {
      "version": 1,
      "pid": 12345,                 # the trainer process
      "state": "running",           # starting | running | saving | finished | failed
      "step": 40,                   # optimizer steps done (global_step; continues on resume)
      "max_steps": 100,             # the step training stops at (null until known)
      "epoch": 1.6,                 # fractional epoch (null until known)
      "loss": 1.234,                # last logged training loss (null until the first log)
      "learning_rate": 0.0009,      # at the last logged step
      "grad_norm": 0.87,            # at the last logged step (null if not clipped/known)
      "tokens_per_s": 5120.0,       # non-padding input tokens/s over the last logging window
      "samples_per_s": 160.0,       # training rows/s over the last logging window
      "eta_s": 12.5,                # estimated seconds to max_steps (0 when finished)
      "elapsed_s": 30.2,            # seconds since the trainer process started its run
      "checkpoints": [              # checkpoints on disk (rotated ones are dropped)
        {"step": 20, "path": "/abs/out/checkpoint-20", "save_s": 0.41, "at": 1760000000.0}
      ],
      "updated_at": 1760000001.5,   # when this document was written
      "error": null,                # one line when state is "failed"
      "stop_reason": null,          # "max_steps" | "signal:SIGTERM" | "signal:SIGINT" | null
      "diverged_at_step": null,     # optional: the first step whose loss was NaN or infinite
      "precision": "fp16",          # bf16 | fp16 | fp32: what the run trains in (null until chosen)
      "notes": ["tf32 off: ..."]    # one line each: what was chosen for this GPU and what was turned off
    }

A diverged run (a NaN or infinite loss) is a normal event: write ``"loss": NaN``
(Python's json writes it unless told not to) or ``"loss": null`` with
``diverged_at_step``. The agent reads either as "loss: NaN, diverged at step N",
shows it on the job and raises an alert.

``save_s`` is the wall time of the checkpoint save alone (model/adapter,
optimizer, scheduler, RNG and trainer state). A checkpoint directory is a
standard Hugging Face one: ``<output_dir>/checkpoint-<step>/`` holding
``trainer_state.json`` and ``adapter_model.safetensors``.

Stopping: on SIGTERM (or a first Ctrl-C) the trainer finishes the current
optimizer step, saves a checkpoint, writes ``state: "finished"`` with
``stop_reason: "signal:SIGTERM"`` and exits 0 (a signal that comes before
training has begun ends the run the same way, with no checkpoint). A second
signal stops it at once: ``"failed"``, exit status 130.

Readers must ignore keys they do not know; new keys may be added without
bumping ``version``. The agent validates the document against this schema
(``agents.wire.documents.Progress``); one that does not match (``"checkpoints": 5``)
is reported on its job and otherwise ignored.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

VERSION = 1
STATES = ("starting", "running", "saving", "finished", "failed")
ENV_VAR = "CETLAB_PROGRESS_FILE"

# Every key a writer sends; write_progress fills the ones a caller leaves out.
FIELDS: dict[str, Any] = {
    "version": VERSION,
    "pid": None,
    "state": "starting",
    "step": 0,
    "max_steps": None,
    "epoch": None,
    "loss": None,
    "learning_rate": None,
    "grad_norm": None,
    "tokens_per_s": None,
    "samples_per_s": None,
    "eta_s": None,
    "elapsed_s": None,
    "checkpoints": [],
    "updated_at": None,
    "error": None,
    "stop_reason": None,
    "diverged_at_step": None,
    "precision": None,
    "notes": [],
}


def write_progress(path: str | os.PathLike[str], data: dict[str, Any]) -> None:
    """Write ``data`` as the progress document at ``path``, atomically.

    Missing keys take their defaults from :data:`FIELDS`; ``pid`` defaults to
    this process and ``updated_at`` is always set to now. The parent folder is
    created if needed.
    """
    path = Path(path)
    doc = {**FIELDS, "checkpoints": [], "notes": [], **data}
    if doc["pid"] is None:
        doc["pid"] = os.getpid()
    doc["updated_at"] = time.time()
    if doc["state"] not in STATES:
        raise ValueError(f"progress state must be one of {', '.join(STATES)}, not {doc['state']!r}")
    text = json.dumps(doc, allow_nan=False, default=_jsonable)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.write("\n")
    os.replace(tmp, path)


def read_progress(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The progress document at ``path``, or ``None`` when it is missing,
    empty, half-written or not a JSON object."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError):
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _jsonable(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def clean_number(value: Any) -> float | None:
    """A finite float, or None (JSON has no NaN/inf)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if number != number or number in (float("inf"), float("-inf")):
        return None
    return number
