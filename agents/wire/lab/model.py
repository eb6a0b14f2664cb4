"""The lab.yaml schema and its loader: errors name the file, the line and the key path (agents/wire/lab/yaml_doc.py)."""

from __future__ import annotations

import time
from collections.abc import Collection
from datetime import date, datetime, tzinfo
from pathlib import Path
from typing import Annotated, Any, Literal, overload
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BeforeValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from agents.wire.lab.gateway import Gateway, Provider
from agents.wire.lab.gateway import cross_check as gateway_cross_check
from agents.wire.lab.gpu_numbers import gpu_number_problems
from agents.wire.lab.loopback import check_args, check_command, command_engine_problem
from agents.wire.lab.machines import Machine
from agents.wire.lab.notify import Notify
from agents.wire.lab.notify import cross_check as notify_cross_check
from agents.wire.lab.queue import MAX_PRIORITY, Need, Scheduler
from agents.wire.lab.queue import cross_check as queue_cross_check
from agents.wire.lab.replicas import replicas_cross_check
from agents.wire.lab.spread import RpcHelper
from agents.wire.lab.spread import cross_check as spread_cross_check
from agents.wire.lab.yaml_doc import MAX_BYTES as MAX_LAB_BYTES
from agents.wire.lab.yaml_doc import YamlDocError, data_path, describe, problem_at
from agents.wire.lab.yaml_doc import load as load_yaml
from agents.wire.schema import (
    Duration,
    EngineName,
    ModelName,
    Name,
    NonNegative,
    ParamName,
    Positive,
    Price,
    Strict,
    parse_duration,
)

# ---------------------------------------------------------------------------- money


class Costs(Strict):
    currency: str = "USD"
    electricity_per_kwh: Price | None = None
    timezone: str | None = None  # IANA name for "today" and "this month"; default: the machine's

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ZoneInfo(value)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(f"unknown time zone {value!r}; use an IANA name like Europe/Berlin or UTC") from None
        return value

    def zone(self) -> tzinfo | None:
        """The lab's time zone; None means the machine's local zone."""
        return ZoneInfo(self.timezone) if self.timezone else None

    def day(self, t: float | None = None) -> date:
        """The lab's day at time t (now): the agents book by it, so the console's "today" is it too, wherever its
        workstation is (a console in UTC and a lab in Berlin disagreed for an hour every night)."""
        return datetime.fromtimestamp(time.time() if t is None else t, self.zone()).date()


class CloudPrices(Strict):
    gpu_hour: dict[str, Price] = Field(default_factory=dict)  # by GPU model name
    tokens_per_million: dict[str, Price] = Field(default_factory=dict)  # by cloud_equivalent


# ---------------------------------------------------------------------------- models


class SimEngine(Strict):
    """Delays of the simulated engine (field-notes defaults for a 48 GB model)."""

    load_s: NonNegative = 15.0  # from page cache; cold from disk is load_s * cold_factor
    cold_factor: Positive = 14.0
    warmup_s: NonNegative = 40.0
    wake_s: NonNegative = 1.0
    tokens_per_s: NonNegative = 40.0
    fail_after_s: NonNegative | None = None  # crash on purpose (logs a CUDA OOM), for tests and demos
    traffic_rps: NonNegative = 0.0  # simulated client requests per second it serves itself, so demos show load
    placeholder_mib: NonNegative | None = None  # demo: write placeholder weights of this size if path is missing


class Replica(Strict):
    """One more placement of a model (agents/wire/lab/replicas.py): that machine's agent runs it as its own instance."""

    machine: Name
    gpus: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    port: int | None = Field(default=None, ge=1, le=65535)  # as the model's port: None, a unix socket of that agent's


class Model(Strict):
    name: Name
    path: str
    engine: EngineName  # one of agents.orchestra.engines' registry (checked when the agent loads lab.yaml)
    machine: Name
    gpus: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    # its VRAM need over all its GPUs; left out: estimated from its files (a GGUF's header, safetensors' headers and
    # config.json: agents/orchestra/weights/vram.py), unknown without them; `cetlab models` says which
    vram_gib: NonNegative | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    served_name: ModelName | None = None  # the name the engine serves it as: clients and the gateway ask for it
    port: int | None = Field(default=None, ge=1, le=65535)  # None: a unix socket of the agent's; a port: 127.0.0.1 (WARN)
    cloud_equivalent: str | None = None
    # what the engine is started to answer: chat (and completions), embedding (/v1/embeddings: llama-server --embedding,
    # vLLM --runner pooling) or rerank (/v1/rerank: llama-server --reranking, vLLM --runner pooling); the gateway refuses
    # a route the model does not serve, naming `model`
    serves: Literal["chat", "embedding", "rerank"] = "chat"
    sleep_level: Literal[1, 2] = 1  # 2 drops the weights: waking reloads them (vLLM's wake_up/reload_weights sequence)
    # runtime LoRA (vllm, sim): --enable-lora --max-loras N --max-lora-rank R; 0 serves without LoRA
    max_loras: int = Field(default=1, ge=0)
    max_lora_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] = 16  # the ranks vLLM accepts; an adapter's r must fit
    load_timeout_s: Duration = 1800.0  # start until /health answers; then the model is failed
    warmup_prompt: str = "Hello"  # the first request, sent before the model is called warm
    make_tiny_if_missing: bool = False  # demo: create the tiny random Llama (agents/train/tiny.py) at path first
    sim: SimEngine = Field(default_factory=SimEngine)
    # engine: command: any OpenAI-compatible server, from its argv ({socket}: a unix socket of the agent's, or {port} on
    # 127.0.0.1; {model}: its path, {gpus}: "0,1", {name}: its served name); health_path answers 200 once it serves; stop_command (optional) asks it to stop before a SIGTERM
    command: list[str] = Field(default_factory=list)
    health_path: Annotated[str, Field(pattern=r"^/[^\s]*$")] = "/health"
    stop_command: list[str] = Field(default_factory=list)
    # more placements beside machine/gpus: the gateway spreads requests over them and drains one before it goes out
    replicas: list[Replica] = Field(default_factory=list)
    drain_timeout_s: Duration = 60.0  # a replica taken out waits this long at most for its requests to end
    # llamacpp: helper machines whose GPUs lend memory to this model (their rpc-servers, on 127.0.0.1, reached over SSH)
    rpc: list[RpcHelper] = Field(default_factory=list)

    @field_validator("args")
    @classmethod
    def _engine_stays_on_loopback(cls, args: list[str]) -> list[str]:
        return check_args(args)

    @field_validator("command", "stop_command")
    @classmethod
    def _command_stays_on_loopback(cls, argv: list[str]) -> list[str]:
        return check_command(argv)

    @model_validator(mode="after")
    def _command_engine(self) -> Model:
        problem = command_engine_problem(self.engine, self.command, self.stop_command, self.port)
        if problem is not None:
            raise ValueError(problem)
        return self


class Orchestra(Strict):
    warm: list[Name] = Field(default_factory=list)
    sleeping: list[Name] = Field(default_factory=list)  # brought up, then put to sleep: wake in seconds
    cached: list[Name] = Field(default_factory=list)  # weights pre-read into RAM at agent start
    pinned: list[Name] = Field(default_factory=list)
    rotate_every: Duration | None = None
    rotation: list[list[Name]] = Field(default_factory=list)  # warm sets to cycle through
    # false: a rotation takes out only models its sets name, never one an operator warmed; true: every model not pinned
    rotation_takes_all: bool = False
    groups: dict[Name, list[ModelName]] = Field(default_factory=dict)  # fan-out sets for the gateway's orchestra call
    # models that may give their GPUs to a job of the lab queue (put to sleep, or stopped, and brought back after it)
    yields: list[Name] = Field(default_factory=list)


# ---------------------------------------------------------------------------- trainers


class TrainerParam(Strict):
    name: ParamName
    type: Literal["int", "float", "str", "bool", "choice"] = "str"
    default: int | float | bool | str | None = None
    choices: list[str] = Field(default_factory=list)
    min: float | None = None
    max: float | None = None
    help: str = ""
    flag: str | None = None  # e.g. "--max-steps"; default: --<name with dashes>


class TrainerNode(Strict):
    """One machine of a multi-node recipe: its GPUs and, for labs with several networks, the interface NCCL uses."""

    machine: Name
    gpus: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    nccl_socket_ifname: Annotated[str, Field(pattern=r"^\^?[A-Za-z0-9_.:-]{1,32}(,\^?[A-Za-z0-9_.:-]{1,32}){0,7}$")] | None = None


class Trainer(Strict):
    name: Name
    machine: Name  # with nodes: the first node's machine (the coordinator), filled in when left out
    gpus: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    # argv list, never a shell string; {job_id} and {output_dir} are expanded by the agent
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)  # added to the agent's; {job_id}/{output_dir} expanded
    cwd: str | None = None  # default: the lab file's folder (relative paths resolve against it)
    output_dir: str  # must be writable before a start; may hold {job_id}
    launcher: Literal["local", "torchrun"] = "local"
    nproc_per_node: int | None = Field(default=None, ge=1)  # torchrun; default: one per GPU
    params: list[TrainerParam] = Field(default_factory=list)
    checkpoint_dirs: list[str] = Field(default_factory=list)  # extra dirs to watch
    stop_grace_s: Duration = 60.0  # SIGTERM, then SIGKILL after this long
    # one job over several machines (launcher: torchrun, c10d rendezvous on the first node)
    nodes: list[TrainerNode] = Field(default_factory=list)
    rdzv_port: int | None = Field(default=None, ge=1024, le=65535)  # default: a free port on the first node
    # the lab queue (agents/scheduler/): what it needs instead of GPU numbers, and how it ranks (higher goes first)
    need: Need | None = None
    priority: Annotated[int, Field(ge=-MAX_PRIORITY, le=MAX_PRIORITY)] = 0

    @model_validator(mode="before")
    @classmethod
    def _first_node_coordinates(cls, value: Any) -> Any:
        if (
            isinstance(value, dict)
            and value.get("nodes")
            and isinstance(value["nodes"], list)
            and isinstance(value["nodes"][0], dict)
        ):
            first = value["nodes"][0]
            value = {
                **value,
                "machine": value.get("machine", first.get("machine")),
                "gpus": value.get("gpus", first.get("gpus", [])),
            }
        need = value.get("need") if isinstance(value, dict) else None
        if isinstance(need, dict) and "machine" not in value and isinstance(need.get("machines"), list) and need["machines"]:
            value = {**value, "machine": need["machines"][0]}  # a recipe by need: its first allowed machine is its home
        return value

    @field_validator("command", mode="before")
    @classmethod
    def _argv_not_shell(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("expected an argv list like [cetlab-train, --config, x.yaml], not a shell string")
        return value


class CheckpointDir(Strict):
    machine: Name  # the agent that watches it
    path: str  # a run folder (holding checkpoint-<step>/) or a folder of run folders; relative to the lab file


class Checkpoints(Strict):
    """Checkpoint discovery: the trainers' output dirs are always watched; these add more."""

    dirs: list[CheckpointDir] = Field(default_factory=list)  # runs not started by cetlab
    poll_s: Annotated[float, BeforeValidator(parse_duration), Field(gt=0, le=3600)] = 3.0
    settle_s: Duration = 5.0  # a checkpoint with a file modified this recently is still being saved


# ---------------------------------------------------------------------------- alerts & console


class Alerts(Strict):
    temp_c: float = 85.0
    temp_for_s: Duration = 30.0
    vram_pct: float = Field(default=95.0, ge=0, le=100)
    vram_for_s: Duration = 300.0
    starved_util_pct: float = Field(default=50.0, ge=0, le=100)
    starved_for_s: Duration = 120.0
    no_improvement_steps: int = Field(default=1000, ge=1)
    checkpoint_save_s: Duration = 30.0
    disk_free_pct: float = Field(default=5.0, ge=0, le=100)
    disk_for_s: Duration = 60.0
    offline_for_s: Duration = 30.0
    hysteresis_pct: float = Field(default=5.0, ge=0)  # a firing rule clears this far (% of its threshold) on the good side
    clear_for_s: Duration = 5.0  # ... and stays there this long, so a value near the line does not flap


class ConsoleSettings(Strict):
    """Client side: how the console and the CLI reach the agents."""

    key: str | None = None  # private key; default: platformdirs config dir / id_ed25519
    known_hosts: str | None = None  # default: platformdirs config dir / known_hosts
    trust_on_first_use: bool = False
    keepalive_s: Positive = 5.0
    call_timeout_s: Positive = 10.0
    connect_timeout_s: Positive = 5.0


class Lab(Strict):
    lab: Name
    costs: Costs = Field(default_factory=Costs)
    cloud_prices: CloudPrices = Field(default_factory=CloudPrices)
    machines: list[Machine] = Field(min_length=1)
    models: list[Model] = Field(default_factory=list)
    orchestra: Orchestra = Field(default_factory=Orchestra)
    trainers: list[Trainer] = Field(default_factory=list)
    alerts: Alerts = Field(default_factory=Alerts)
    notify: Notify = Field(default_factory=Notify)  # where alerts and job events go (agents/notify/)
    checkpoints: Checkpoints = Field(default_factory=Checkpoints)
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)
    gateway: Gateway | None = None
    providers: list[Provider] = Field(default_factory=list)
    scheduler: Scheduler = Field(default_factory=Scheduler)  # the lab queue's machine (agents/scheduler/)

    # Where the file was read from; relative paths in it are relative to its folder.
    source: Path | None = Field(default=None, exclude=True)

    def machine(self, name: str) -> Machine:
        for machine in self.machines:
            if machine.name == name:
                return machine
        raise KeyError(name)

    @overload
    def resolve(self, path: str) -> Path: ...

    @overload
    def resolve(self, path: None) -> None: ...

    def resolve(self, path: str | None) -> Path | None:
        """A path from lab.yaml, made absolute against the lab file's folder."""
        if path is None:
            return None
        p = Path(path).expanduser()
        if not p.is_absolute() and self.source is not None:
            p = self.source.parent / p
        return p


# ---------------------------------------------------------------------------- loading


class LabError(YamlDocError):
    """lab.yaml is unreadable or invalid; str() is one line per problem, file:line first."""


def _cross_check(lab: Lab, engines: Collection[str] | None) -> list[tuple[tuple[str | int, ...], str]]:
    """References between sections: machines named, GPUs present, names unique, engines known (where ``engines`` is given)."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    for i, model in enumerate(lab.models):
        if engines is not None and model.engine not in engines:
            problems.append((("models", i, "engine"), f"no engine named {model.engine!r} (engines: {', '.join(engines)})"))
    machines = {m.name: m for m in lab.machines}
    for section in ("machines", "models", "trainers"):
        seen: set[str] = set()
        for i, item in enumerate(getattr(lab, section)):
            if item.name in seen:
                problems.append(((section, i, "name"), f"duplicate name {item.name!r}"))
            seen.add(item.name)
    problems += replicas_cross_check(lab.models, machines)
    for section in ("models", "trainers"):
        for i, item in enumerate(getattr(lab, section)):
            machine = machines.get(item.machine)
            if machine is None:
                problems.append(((section, i, "machine"), f"no machine named {item.machine!r} (machines: {', '.join(machines)})"))
                continue
            problems += gpu_number_problems(machine.name, machine.gpu_count, item.gpus, (section, i, "gpus"))
    models = {m.name for m in lab.models}
    for key in ("warm", "sleeping", "cached", "pinned"):
        for i, name in enumerate(getattr(lab.orchestra, key)):
            if name not in models:
                problems.append((("orchestra", key, i), f"no model named {name!r}"))
    for i, warm_set in enumerate(lab.orchestra.rotation):
        for j, name in enumerate(warm_set):
            if name not in models:
                problems.append((("orchestra", "rotation", i, j), f"no model named {name!r}"))
    for i, entry in enumerate(lab.checkpoints.dirs):
        if entry.machine not in machines:
            problems.append((("checkpoints", "dirs", i, "machine"), f"no machine named {entry.machine!r}"))
    for i, trainer in enumerate(lab.trainers):
        if trainer.launcher == "torchrun" and not trainer.gpus and trainer.nproc_per_node is None:
            problems.append((("trainers", i, "nproc_per_node"), "torchrun needs gpus or nproc_per_node"))
        problems += _nodes_cross_check(trainer, i, machines)
        names: set[str] = set()
        for j, param in enumerate(trainer.params):
            if param.name in names:
                problems.append((("trainers", i, "params", j, "name"), f"param {param.name!r} declared twice"))
            names.add(param.name)
            if param.type == "choice" and not param.choices:
                problems.append((("trainers", i, "params", j, "choices"), "a choice param needs choices: [...]"))
    problems += notify_cross_check(lab.notify, list(machines))
    problems += spread_cross_check(lab)
    problems += queue_cross_check(lab, machines)
    return problems + gateway_cross_check(
        lab.providers, lab.gateway, list(machines), {m.name for m in lab.models}, lab.orchestra.groups, lab.costs.currency
    )


def _nodes_cross_check(trainer: Trainer, i: int, machines: dict[str, Machine]) -> list[tuple[tuple[str | int, ...], str]]:
    """A multi-node recipe: torchrun, two machines or more, each named once, present, with the GPUs it lists."""
    if not trainer.nodes:
        return [(("trainers", i, "rdzv_port"), "rdzv_port needs nodes: [...]")] if trainer.rdzv_port is not None else []
    problems: list[tuple[tuple[str | int, ...], str]] = []
    if trainer.launcher != "torchrun":
        problems.append((("trainers", i, "launcher"), "a recipe with nodes needs launcher: torchrun"))
    if len(trainer.nodes) < 2:
        problems.append((("trainers", i, "nodes"), "nodes needs two machines or more (one machine: machine and gpus)"))
    first = trainer.nodes[0]
    if trainer.machine != first.machine or trainer.gpus != first.gpus:
        problems.append(
            (
                ("trainers", i, "machine"),
                f"with nodes, machine and gpus are the first node's ({first.machine} {first.gpus}); leave them out",
            )
        )
    seen: set[str] = set()
    for j, node in enumerate(trainer.nodes):
        machine = machines.get(node.machine)
        if node.machine in seen:
            problems.append((("trainers", i, "nodes", j, "machine"), f"machine {node.machine} is a node twice"))
        seen.add(node.machine)
        if machine is None:
            problems.append(
                (("trainers", i, "nodes", j, "machine"), f"no machine named {node.machine!r} (machines: {', '.join(machines)})")
            )
            continue
        if not node.gpus and trainer.nproc_per_node is None:
            problems.append((("trainers", i, "nodes", j, "gpus"), "a node without gpus needs the recipe's nproc_per_node"))
        problems += gpu_number_problems(machine.name, machine.gpu_count, node.gpus, ("trainers", i, "nodes", j, "gpus"))
    return problems


def parse_lab(text: str, source: str = "lab.yaml", path: Path | None = None, engines: Collection[str] | None = None) -> Lab:
    """Validate lab.yaml text; raises LabError naming file, line and key path. ``engines``: the names models may use
    (the agent passes its engine registry; the console runs none: the agent that would run the model refuses it)."""
    try:
        lines, dupes, data = load_yaml(text, source)
    except YamlDocError as exc:
        raise LabError(exc.problems) from None
    if not isinstance(data, dict):
        raise LabError([f"{source}:1: expected a mapping with at least 'lab:' and 'machines:'"])
    if dupes:
        problems = list(dict.fromkeys(problem_at(source, lines, p, "key given twice") for p, _ in dupes))  # once each
        raise LabError(
            problems[:20] + ([f"{source}: ... and {len(problems) - 20} more keys given twice"] if len(problems) > 20 else [])
        )
    try:
        lab = Lab.model_validate({**data, "source": path})
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            problem = problem_at(
                source, lines, data_path(data, error["loc"], error["type"] in ("missing", "extra_forbidden")), describe(error)
            )
            if problem not in problems:
                problems.append(problem)
        raise LabError(problems) from None
    cross = _cross_check(lab, engines)
    if cross:
        raise LabError([problem_at(source, lines, p, msg) for p, msg in cross])
    return lab


def load_lab(path: str | Path, engines: Collection[str] | None = None) -> Lab:
    path = Path(path).expanduser()
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_LAB_BYTES + 1)
    except OSError as exc:
        raise LabError([f"{path}: cannot read lab file: {exc.strerror or exc}"]) from None
    if len(raw) > MAX_LAB_BYTES:
        raise LabError([f"{path}: larger than {MAX_LAB_BYTES} bytes; a lab file is a few KB (is this the right file?)"])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise LabError([f"{path}:{line}: not UTF-8 (byte 0x{raw[exc.start]:02x}); save the file as UTF-8"]) from None
    return parse_lab(text, source=str(path), path=path.resolve(), engines=engines)
