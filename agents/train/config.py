"""cetlab-train's YAML config: the TrainConfig model and its loader.

Errors name the file, the line and the key (``train.yaml:7: lora.r: ...``).
Relative paths in the file resolve against the file's folder; paths given on
the command line resolve against the current directory.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from agents.train.precision import PrecisionChoice
from agents.train.progress import ENV_VAR as PROGRESS_ENV_VAR
from agents.wire.lab.yaml_doc import KeyPath, LineMap, format_path, line_map

HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ConfigError(Exception):
    """The config is unreadable or invalid; str() is one line per problem."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraSettings(Strict):
    r: int = Field(default=8, ge=1)
    alpha: float = Field(default=16, gt=0)
    dropout: float = Field(default=0.05, ge=0, lt=1)
    # a list of module names, or "all-linear"
    target_modules: list[str] | Literal["all-linear"] = Field(default_factory=lambda: ["q_proj", "v_proj"])
    # modules trained in full and saved with the adapter (e.g. [embed_tokens, lm_head])
    modules_to_save: list[str] = Field(default_factory=list)


class TrainConfig(Strict):
    base_model: str  # a local folder (relative to the YAML file) or a Hub id "org/name"
    make_tiny_if_missing: bool = False  # create the tiny demo model at base_model if it is not there
    dataset: Path  # JSONL: {"text": ...} or {"prompt": ..., "completion": ...} per line
    output_dir: Path
    max_seq_len: int = Field(default=256, ge=8)

    lora: LoraSettings = Field(default_factory=LoraSettings)
    qlora: bool = False  # 4-bit base weights via bitsandbytes; CUDA only

    per_device_batch_size: int = Field(default=8, ge=1)
    grad_accumulation: int = Field(default=1, ge=1)
    epochs: float = Field(default=1.0, gt=0)
    max_steps: int = -1  # -1: run for `epochs`
    learning_rate: float = Field(default=2e-4, gt=0)
    lr_scheduler: str = "linear"  # any transformers SchedulerType: linear, cosine, constant ...
    warmup_steps: int = Field(default=0, ge=0)
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float = Field(default=1.0, ge=0)
    save_steps: int = Field(default=500, ge=1)
    save_total_limit: int | None = Field(default=None, ge=1)  # null: keep every checkpoint
    logging_steps: int = Field(default=1, ge=1)

    # auto: bf16 from compute capability 8.0, fp16 (loss scaling) on 7.x, fp32 on Pascal and the CPU (agents/train/precision.py)
    precision: PrecisionChoice = "auto"
    tf32: bool = False  # Ampere (8.0) and newer; elsewhere off, with a note
    sdpa: bool = True  # attn_implementation="sdpa" (else "eager")
    torch_compile: bool = False  # compute capability 7.0 and newer (Triton); elsewhere off, with a note
    gradient_checkpointing: bool = False
    dataloader_workers: int = Field(default=0, ge=0)
    # torch CPU threads (torch.set_num_threads); null: torch's default (OMP_NUM_THREADS or all cores).
    # Small models on a busy CPU run far faster with 1: idle OpenMP threads spin against other processes.
    cpu_threads: int | None = Field(default=None, ge=1)
    pretokenized_cache: Path | None = None  # a file (or a folder: <folder>/tokenized.pt)
    seed: int = 42
    resume_from_checkpoint: str | None = None  # a checkpoint folder, "latest", or null
    progress_file: Path | None = None  # default <output_dir>/progress.json; CETLAB_PROGRESS_FILE wins

    # the YAML file this came from (not a key in the file)
    source: Path | None = Field(default=None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _bf16_key(cls, data: Any) -> Any:
        if isinstance(data, dict) and "bf16" in data:
            raise ValueError(
                "bf16: replaced by precision: auto | bf16 | fp16 | fp32 (auto picks by the GPU's compute capability)"
            )
        return data

    @field_validator("max_steps")
    @classmethod
    def _max_steps(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError("must be a positive number of steps, or -1 to train for `epochs`")
        return value

    @field_validator("lr_scheduler")
    @classmethod
    def _scheduler(cls, value: str) -> str:
        known = {
            "linear",
            "cosine",
            "cosine_with_restarts",
            "polynomial",
            "constant",
            "constant_with_warmup",
            "inverse_sqrt",
            "reduce_lr_on_plateau",
            "cosine_with_min_lr",
            "warmup_stable_decay",
        }
        if value not in known:
            raise ValueError(f"unknown scheduler {value!r} (one of: {', '.join(sorted(known))})")
        return value

    @model_validator(mode="after")
    def _defaults(self) -> TrainConfig:
        if self.progress_file is None:
            self.progress_file = self.output_dir / "progress.json"
        return self

    @property
    def progress_path(self) -> Path:
        """Where the progress file goes: progress_file, set by loading (<output_dir>/progress.json unless given)."""
        return self.progress_file if self.progress_file is not None else self.output_dir / "progress.json"


# ---------------------------------------------------------------------------- loading

_PATH_KEYS = ("dataset", "output_dir", "pretokenized_cache", "progress_file")


class _Where:
    def __init__(self, source: Path, lines: LineMap, cli_keys: set[str]):
        self.source, self.lines, self.cli_keys = source, lines, cli_keys

    def __call__(self, path: KeyPath, message: str) -> str:
        key = format_path(path)
        if key in self.cli_keys:
            return f"{self.source}: {key} (from the command line): {message}"
        probe = path
        while probe and probe not in self.lines:
            probe = probe[:-1]
        line = self.lines.get(probe)
        place = f"{self.source}:{line}" if line else f"{self.source}"
        return f"{place}: {key}: {message}"


def _fields_at(loc: tuple[str | int, ...]) -> list[str]:
    model: Any = TrainConfig
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return []
        model = field.annotation
    return [name for name in model.model_fields if name != "source"]


def _describe(error: ErrorDetails) -> str:
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if error["type"] == "extra_forbidden":
        name = str(error["loc"][-1])
        close = difflib.get_close_matches(name, _fields_at(tuple(error["loc"])), n=1)
        return "unknown key" + (f" (did you mean {close[0]!r}?)" if close else "")
    if error["type"] == "missing":
        return "required key is missing"
    got = error.get("input")
    if not isinstance(got, (dict, list)):
        message += f" (got {got!r})"
    return message


def parse_override(text: str) -> tuple[str, Any]:
    """'lora.r=16' -> ('lora.r', 16); the value is read as YAML."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected key=value, e.g. --set lora.r=16")
    try:
        parsed = yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError:
        parsed = value
    return key.strip(), parsed


def load_config(
    path: str | os.PathLike[str],
    overrides: dict[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> TrainConfig:
    """Read, override, validate and resolve a cetlab-train YAML config.

    ``overrides`` maps dotted keys to values (from command-line flags); path
    values in it resolve against the current directory. Raises ConfigError.

    Over 80 lines: the recipe's keys resolved in one pass, in the order the reference documents them.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    source = Path(path).expanduser()
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read config file: {exc.strerror or exc}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{source}{line}: not valid YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:1: expected a mapping of keys (base_model:, dataset:, output_dir: ...)")
    lines = line_map(node)[0] if node is not None else LineMap()
    base_dir = source.resolve().parent
    cwd = Path.cwd()

    # relative paths: against the YAML file's folder, or the cwd for command-line values
    for key in _PATH_KEYS + ("base_model", "resume_from_checkpoint"):
        value = data.get(key)
        if isinstance(value, str) and value:
            data[key] = _resolve(key, value, base_dir)
    cli_keys: set[str] = set()
    for dotted, value in (overrides or {}).items():
        parts = dotted.split(".")
        if (
            isinstance(value, str)
            and value
            and len(parts) == 1
            and parts[0] in _PATH_KEYS + ("base_model", "resume_from_checkpoint")
        ):
            value = _resolve(parts[0], value, cwd)
        target = data
        for part in parts[:-1]:
            if not isinstance(target.get(part), dict):
                target[part] = {}
            target = target[part]
        target[parts[-1]] = value
        cli_keys.add(dotted)

    where = _Where(source, lines, cli_keys)
    try:
        config = TrainConfig.model_validate({**data, "source": source.resolve()})
    except ValidationError as exc:
        problems: list[str] = []
        for error in exc.errors():
            problem = where(tuple(error["loc"]), _describe(error))
            if problem not in problems:
                problems.append(problem)
        raise ConfigError("\n".join(problems)) from None

    # files that must exist
    if not config.dataset.is_file():
        what = "is a folder, expected a JSONL file" if config.dataset.is_dir() else "file not found"
        raise ConfigError(where(("dataset",), f"{what}: {config.dataset}"))
    base = Path(config.base_model)
    if base.is_absolute() and not base.exists() and not config.make_tiny_if_missing:
        raise ConfigError(
            where(
                ("base_model",),
                f"model folder not found: {base} (or set make_tiny_if_missing: true to create the tiny demo model there)",
            )
        )
    resume = config.resume_from_checkpoint
    if resume not in (None, "latest") and not Path(resume).is_dir():
        raise ConfigError(
            where(
                ("resume_from_checkpoint",),
                f"checkpoint folder not found: {resume} (give a checkpoint-<step> folder, 'latest' or null)",
            )
        )

    progress = environ.get(PROGRESS_ENV_VAR)
    if progress:
        config.progress_file = (cwd / Path(progress).expanduser()).resolve()
    return config


def _resolve(key: str, value: str, base_dir: Path) -> str:
    if key == "resume_from_checkpoint" and value == "latest":
        return value
    p = Path(value).expanduser()
    if key == "base_model" and not p.is_absolute():
        candidate = base_dir / p
        # a Hub id like "org/name" stays as is unless such a folder exists
        if HUB_ID_RE.match(value) and not value.startswith(".") and not candidate.exists():
            return value
        return str(candidate.resolve())
    return str((base_dir / p).resolve()) if not p.is_absolute() else str(p)
