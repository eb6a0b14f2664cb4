"""Reading one Hugging Face checkpoint folder: its kind, size, save time, losses, and what is wrong with it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from agents.wire.documents import BadDocument, LogRow, TrainerState, load_trainer_state
from agents.wire.safe_read import ADAPTER_CONFIG_MAX_BYTES, read_capped
from agents.wire.sections.checkpoints import CheckpointInfo

CHECKPOINT_RE = re.compile(r"^(tmp-)?checkpoint-(\d+)$")
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")
FULL_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")
OPTIMIZER_FILES = ("optimizer.pt", "optimizer.bin")


def _rows(log_history: Any) -> list[LogRow]:
    rows = []
    for row in log_history if isinstance(log_history, list) else []:
        if isinstance(row, LogRow):
            rows.append(row)
        elif isinstance(row, dict):
            try:
                rows.append(LogRow.model_validate(row))
            except ValidationError:
                continue
    return rows


def history_points(log_history: Any) -> tuple[list[list[int | float]], list[list[int | float]]]:
    """[[step, loss]], [[step, eval_loss]] from a log_history, tolerant of key names across versions.

    `loss` rows are the training curve; `train_loss` (the end-of-run average in recent versions, the
    per-step loss in some old ones) is used only at steps with no `loss` row. NaN and infinite losses
    are not points (see TrainerState.diverged_at_step)."""
    loss: dict[int, float] = {}
    fallback: dict[int, float] = {}
    evals: dict[int, float] = {}
    for row in _rows(log_history):
        if (step := row.at_step) is None:
            continue
        if row.loss is not None:
            loss[step] = row.loss
        elif row.train_loss is not None:
            fallback[step] = row.train_loss
        if row.eval_loss is not None:
            evals[step] = row.eval_loss
    merged = {**fallback, **loss}
    return [[s, merged[s]] for s in sorted(merged)], [[s, evals[s]] for s in sorted(evals)]


def value_at(points: list[list[int | float]], step: int) -> float | None:
    """The last value logged at or before `step`."""
    found = None
    for s, value in points:
        if s > step:
            break
        found = value
    return found


class Checkpoint(CheckpointInfo):
    """One checkpoint folder as parsed: what `checkpoints.list` sends, plus what discovery needs and never sends."""

    base_model: str | None = Field(default=None, exclude=True)  # an adapter's base (adapter_config.json)
    best_path: str | None = Field(default=None, exclude=True)  # best_model_checkpoint of its trainer_state.json
    loss_points: list[list[int | float]] = Field(default_factory=list, exclude=True)
    eval_points: list[list[int | float]] = Field(default_factory=list, exclude=True)

    def to_json(self) -> dict[str, Any]:
        return self.to_wire()


def _walk_files(path: Path) -> list[os.stat_result]:
    stats = []
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                stats.append(os.lstat(os.path.join(root, name)))  # a symlink's own size and time: never followed
            except OSError:  # removed while we looked: the next poll sees the new state
                pass
    return stats


def _trainer_state(ckpt: Checkpoint, path: Path) -> TrainerState | None:
    state_file = path / "trainer_state.json"
    if not state_file.exists():
        ckpt.problem = "no trainer_state.json (an interrupted or half-written save)"
        return None
    try:
        state = load_trainer_state(state_file)
    except BadDocument as exc:
        ckpt.problem = f"trainer_state.json does not match its schema ({exc})"
        return None
    if state is None:
        ckpt.problem = "trainer_state.json is unreadable (truncated or half-written?)"
    return state


def read_checkpoint(run: str, path: Path, settle_s: float, now: float, reported: bool = False) -> Checkpoint:
    """Everything about one checkpoint folder; a broken one comes back incomplete with the reason, never raises.

    `reported`: the trainer said it finished saving it, so fresh files do not mean a save in progress."""
    match = CHECKPOINT_RE.match(path.name)
    ckpt = Checkpoint(run=run, step=int(match.group(2)) if match else -1, path=str(path))
    stats = _walk_files(path)
    ckpt.size_bytes = sum(s.st_size for s in stats)
    mtimes = [s.st_mtime for s in stats]
    ckpt.written_at = max(mtimes) if mtimes else path.stat().st_mtime
    if len(mtimes) > 1:
        ckpt.save_s, ckpt.save_s_from = round(max(mtimes) - min(mtimes), 3), "file_times"
    names = set(os.listdir(path)) if path.is_dir() else set()
    ckpt.kind = (
        "adapter"
        if names & set(ADAPTER_FILES)
        else "full"
        if (names & set(FULL_FILES) or any(n.startswith("model-") for n in names))
        else "unknown"
    )
    ckpt.has_optimizer = bool(names & set(OPTIMIZER_FILES))
    adapter_problem = None
    if ckpt.kind == "adapter":
        try:
            base = json.loads(read_capped(path / "adapter_config.json", ADAPTER_CONFIG_MAX_BYTES)).get("base_model_name_or_path")
            ckpt.base_model = base if isinstance(base, str) else None
        except FileNotFoundError:
            pass
        except OSError as exc:  # a FIFO, a symlink (to /dev/zero ...), a device, too large: said as what it is
            adapter_problem = f"adapter_config.json is unreadable ({exc.strerror or exc})"
        except (ValueError, AttributeError):
            adapter_problem = "adapter_config.json is not a JSON object (truncated or half-written?)"
    state = _trainer_state(ckpt, path)
    if ckpt.problem is None:
        ckpt.problem = adapter_problem
    if state is not None:
        ckpt.epoch = state.epoch
        ckpt.best_path = state.best_model_checkpoint
        ckpt.loss_points, ckpt.eval_points = history_points(state.log_history)
        ckpt.loss = value_at(ckpt.loss_points, ckpt.step)
        ckpt.eval_loss = value_at(ckpt.eval_points, ckpt.step)
        ckpt.diverged_at_step = state.diverged_at_step
    if ckpt.problem is None and ckpt.kind == "unknown":
        ckpt.problem = "no model or adapter weights in it"
    age_s = now - ckpt.written_at
    if match and match.group(1):
        ckpt.problem = (
            "save in progress (temporary folder)" if age_s < settle_s else "left over from an interrupted save (temporary folder)"
        )
    elif age_s < settle_s and not reported:
        ckpt.problem = f"save in progress (written {max(0.0, age_s):.0f} s ago)"
    ckpt.complete = ckpt.problem is None
    return ckpt


def mark_best(checkpoints: list[Checkpoint]) -> None:
    """best_model_checkpoint of the newest state that names one, else the lowest eval_loss, else the lowest loss."""
    complete = [c for c in checkpoints if c.complete]
    for ckpt in checkpoints:
        ckpt.is_best = ckpt.newest = False
    if not complete:
        return
    complete[-1].newest = True
    best = None
    named = next((c.best_path for c in reversed(complete) if c.best_path), None)
    if named:
        best = next((c for c in complete if Path(c.path).name == Path(named).name), None)
    if best is None and any(c.eval_loss is not None for c in complete):
        best = min((c for c in complete if c.eval_loss is not None), key=lambda c: (c.eval_loss, c.step))
    if best is None and any(c.loss is not None for c in complete):
        best = min((c for c in complete if c.loss is not None), key=lambda c: (c.loss, c.step))
    if best is not None:
        best.is_best = True
