"""The vLLM engine (`vllm serve` with sleep mode, Prometheus metrics and runtime LoRA loading) and its simulated twin,
the sim engine (agents.orchestra.engines.vllm.twin: a real HTTP process with vLLM's contract and simulated delays).

The twin is started the way vLLM is (the same `serve` flags and environment, from VllmSleepMixin) and its server holds
vLLM's contract, so a regression in either shows in the tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from agents.orchestra.engine import Engine, EngineRequestFailed, InstallCheck
from agents.orchestra.engines.vllm.lora_rules import lora_config_problem
from agents.orchestra.spec import EngineSpec
from agents.orchestra.weights.vram import typed_need
from agents.runtime.torch_probe import TorchReader, cuda_archs, python_of
from agents.wire.capability import parse_capability
from agents.wire.lab.model import Model
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.safe_read import ADAPTER_CONFIG_MAX_BYTES, read_capped
from agents.wire.sections.gpu_support import Stack, StackKind

MAX_GPU_MEMORY_UTILIZATION = 0.95
VLLM_MIN = "7.0"  # vLLM 0.33 needs compute capability 7.0+ whatever its torch has (FIELD_NOTES.md)


def vllm_cli() -> str | None:
    """`vllm` beside the agent's Python first: systemd's PATH does not hold the venv."""
    beside = Path(sys.executable).with_name("vllm")
    return str(beside) if beside.exists() else shutil.which("vllm")


# Load-phase lines vLLM writes (the sim engine writes the same ones), parsed into seconds:
# "took 1.23 seconds" up to vLLM 0.12, "took 1.23 s" from 0.33 on.
_SECONDS = r"(\d+(?:\.\d+)?) ?(?:seconds|secs|s)\b"  # "took 12.5 seconds" (vLLM 0.11), "took 12.50 s" (0.33)
VLLM_PHASES = {
    "weights_s": r"Loading weights took " + _SECONDS,
    "model_load_s": r"Model loading took [\d.]+ GiB(?: memory)? and " + _SECONDS,
    "graph_capture_s": r"Graph capturing finished in " + _SECONDS,
    "init_engine_s": r"init engine \(profile, create kv cache, warmup model\) took " + _SECONDS,
    "first_pass_s": r"warm-up \(first forward pass\) took " + _SECONDS,
}
VLLM_METRICS: dict[str, str | None] = {
    "requests_running": "vllm:num_requests_running",
    "requests_waiting": "vllm:num_requests_waiting",
    "kv_cache_pct": "vllm:kv_cache_usage_perc",
    "prompt_tokens_total": "vllm:prompt_tokens_total",
    "generation_tokens_total": "vllm:generation_tokens_total",
    "ttft": "vllm:time_to_first_token_seconds",
}


def _sum_samples(families: dict[str, Any], names: tuple[str, ...], suffix: str = "") -> float | None:
    for name in names:
        family = families.get(name)
        if family is not None:
            return float(sum(s.value for s in family.samples if s.name == name + suffix))
    return None


def parse_vllm_metrics(text: str) -> dict[str, float | None]:
    """The figures the console shows, from a vLLM /metrics page (summed over labels)."""
    from prometheus_client.parser import text_string_to_metric_families  # lazy: not every agent serves models

    families = {f.name: f for f in text_string_to_metric_families(text)}
    kv = _sum_samples(families, ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"))
    return {
        "requests_running": _sum_samples(families, ("vllm:num_requests_running",)),
        "requests_waiting": _sum_samples(families, ("vllm:num_requests_waiting",)),
        "kv_cache_pct": None if kv is None else round(kv * 100, 1),
        "prompt_tokens_total": _sum_samples(families, ("vllm:prompt_tokens",), "_total"),
        "generation_tokens_total": _sum_samples(families, ("vllm:generation_tokens",), "_total"),
        "ttft_sum_s": _sum_samples(families, ("vllm:time_to_first_token_seconds",), "_sum"),
        "ttft_count": _sum_samples(families, ("vllm:time_to_first_token_seconds",), "_count"),
    }


class AdapterNotLoadable(EngineRequestFailed):
    """vLLM would refuse this adapter at run time; str() says why and offers the merge path."""


MERGE_HINT = "serve it merged into its base instead (`cetlab serve-checkpoint` merges an adapter no warm model can load)"


def adapter_problem(adapter_dir: Path, model: Model) -> str | None:
    """Why vLLM cannot hot-load the PEFT adapter in ``adapter_dir`` into ``model`` (None: it can).

    vLLM refuses any adapter when the server runs without --enable-lora, and the adapters
    agents.orchestra.engines.vllm.lora_rules lists (modules_to_save, DoRA, bias, ranks above --max-lora-rank,
    initialisations that changed the base weights).
    """
    config_file = adapter_dir / "adapter_config.json"
    try:
        config = json.loads(read_capped(config_file, ADAPTER_CONFIG_MAX_BYTES))
    except (OSError, ValueError) as exc:
        return f"{config_file} is not a readable adapter config ({getattr(exc, 'strerror', None) or exc})"
    if not isinstance(config, dict):
        return f"{config_file} is not a JSON object"
    if model.max_loras == 0:
        return f"model {model.name} runs without --enable-lora (max_loras: 0 in lab.yaml); {MERGE_HINT}"
    problem = lora_config_problem(config, model.max_lora_rank)
    if problem is not None and "max_lora_rank" in problem:
        return f"{problem} of model {model.name} (raise max_lora_rank in lab.yaml and restart the model), or {MERGE_HINT}"
    return None if problem is None else f"{problem}; {MERGE_HINT}"


def vllm_env(env: dict[str, str]) -> dict[str, str]:
    """The environment a vLLM server (or the sim engine standing in for it) needs, from ``env``."""
    env = dict(env)
    env["VLLM_SERVER_DEV_MODE"] = "1"  # exposes /sleep, /wake_up, /is_sleeping, /collective_rpc
    env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # exposes /v1/load_lora_adapter
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        if "expandable_segments" in env.get(name, ""):  # vLLM's sleep mode allocator cannot work with it
            del env[name]
    return env


class VllmSleepMixin(Engine):
    """vLLM's contract (flags, environment, sleep mode, runtime LoRA), shared by the vLLM and the sim engine.

    Sleep level 1 keeps the weights in host RAM; level 2 drops them, so waking follows vLLM's
    documented sequence: wake the weights, reload them (collective_rpc reload_weights), wake the KV cache.
    """

    can_sleep = True
    slept_level: int | None = None

    def parse_metrics(self, text: str) -> dict[str, float | None]:
        return parse_vllm_metrics(text)

    def listen_flags(self) -> list[str]:
        """vLLM's --uds (its API server binds the path; --host and --port are then unused), or 127.0.0.1:PORT."""
        if self.address.socket is not None:
            return ["--uds", self.address.socket]
        return ["--host", "127.0.0.1", "--port", str(self.address.port)]

    def serve_flags(self) -> list[str]:
        """`vllm serve MODEL` flags after the model: the agent's, then lab.yaml's args (which win where they repeat)."""
        model, args = self.model, list(self.model.args)
        flags = [
            *self.listen_flags(),
            "--served-model-name",
            self.served_name,
            "--enable-sleep-mode",
            "--disable-uvicorn-access-log",
        ]  # the agent polls /metrics: no access line each time
        if model.serves != "chat" and "--runner" not in args:
            flags += ["--runner", "pooling"]  # vLLM serves /v1/embeddings or /v1/rerank from a pooling model
        if model.max_loras and "--enable-lora" not in args:
            flags += ["--enable-lora", "--max-loras", str(model.max_loras), "--max-lora-rank", str(model.max_lora_rank)]
        if "--tensor-parallel-size" not in args and len(self.gpus) > 1:
            flags += ["--tensor-parallel-size", str(len(self.gpus))]
        typed = typed_need(model)
        if "--gpu-memory-utilization" not in args and self.gpu_total_bytes and typed.bytes:
            # vLLM takes a share of each GPU: lab.yaml's vram_gib, not the default 90% (an estimate from the files is
            # vLLM's least, one sequence of KV cache: left to vLLM's own share)
            per_gpu = typed.per_gpu(len(self.gpus))
            share = min(MAX_GPU_MEMORY_UTILIZATION, math.ceil(100 * per_gpu / self.gpu_total_bytes) / 100)
            flags += ["--gpu-memory-utilization", f"{share:.2f}"]
        return flags + args

    def env(self) -> dict[str, str]:
        env = vllm_env(super().env())
        run = self.runtime_dir
        env.update(TMPDIR=str(run / "tmp"), VLLM_RPC_BASE_PATH=str(run / "rpc"), PROMETHEUS_MULTIPROC_DIR=str(run / "metrics"))
        return env

    async def start(self) -> None:
        # vLLM asks that a PROMETHEUS_MULTIPROC_DIR it did not make be wiped between runs: a new one each start
        await asyncio.to_thread(shutil.rmtree, self.runtime_dir, True)  # a past run's files: many, maybe
        for sub in ("tmp", "rpc", "metrics"):
            (self.runtime_dir / sub).mkdir(parents=True, mode=0o700)
        await super().start()

    async def sleep(self, level: int) -> None:
        # mode=wait: vLLM (0.33 on) lets in-flight requests finish first; its default, abort, cuts users' streams.
        # Older vLLM ignores the parameter. Requests that arrive meanwhile queue until a wake.
        await self.http("POST", f"/sleep?level={level}&mode=wait", timeout_s=600.0)
        self.slept_level = level

    async def wake(self) -> None:
        # an engine adopted after an agent restart slept at the model's configured level
        level = self.slept_level or self.model.sleep_level
        if level == 2:
            await self.http("POST", "/wake_up?tags=weights", timeout_s=600.0)
            try:
                await self.http("POST", "/collective_rpc", {"method": "reload_weights"}, timeout_s=600.0)
            except EngineRequestFailed as exc:
                raise EngineRequestFailed(
                    f"sleep level 2 needs reload_weights, which this vLLM refused ({exc}); use sleep_level: 1 for this model"
                ) from None
            await self.http("POST", "/wake_up?tags=kv_cache", timeout_s=600.0)
        else:
            await self.http("POST", "/wake_up", timeout_s=600.0)
        self.slept_level = None

    async def is_sleeping(self) -> bool:
        return bool(json.loads(await self.http("GET", "/is_sleeping", timeout_s=3.0)).get("is_sleeping"))

    async def load_adapter(self, name: str, path: str) -> None:
        """Load a LoRA adapter at run time; AdapterNotLoadable (before asking) when vLLM would refuse it."""
        problem = adapter_problem(Path(path), self.model)
        if problem is not None:
            raise AdapterNotLoadable(problem)
        # load_inplace: a name already loaded (a second serve-checkpoint of the same step) is reloaded, not refused
        await self.http(
            "POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path, "load_inplace": True}, timeout_s=600.0
        )
        self.adapters = {**self.adapters, name: path}


def vllm_stack(reader: TorchReader, cli: str | None) -> Stack:
    """vLLM: its minimum (7.0) and the kernels of the torch in vLLM's own Python (the `vllm` script's interpreter)."""
    minimum = parse_capability(VLLM_MIN)
    if cli is None:
        return Stack(
            name="vLLM", kind=StackKind.VLLM, min_capability=minimum, source="PATH", problem="not installed (no vllm command)"
        )
    python = python_of(cli) or sys.executable
    found = reader.probe(python)
    source = f"{python}: vllm.__version__, torch.cuda.get_arch_list()"
    if found.error is not None or found.vllm is None:
        return Stack(
            name="vLLM",
            kind=StackKind.VLLM,
            min_capability=minimum,
            source=source,
            problem=f"vLLM or its torch cannot be imported in {python}" + (f" ({found.error})" if found.error else ""),
        )
    return Stack(
        name="vLLM",
        kind=StackKind.VLLM,
        version=found.vllm,
        cuda=found.cuda,
        archs=cuda_archs(found.archs),
        cpu_build=found.cuda is None,
        min_capability=minimum,
        source=source,
    )


VLLM_SPEC = EngineSpec(
    serves=("chat", "embedding", "rerank"),  # --runner pooling
    gpu_stack=StackKind.VLLM,
    name="vllm",
    title="vLLM",
    free_mode="sleep",
    sleep_levels=(1, 2),
    adapters="runtime",
    adapter_format="peft",
    multi_gpu="tensor-parallel",
    model_formats=("hf",),
    metric_names=VLLM_METRICS,
    min_compute_capability=float(VLLM_MIN),  # vLLM's floor in every build (no Pascal)
    load_phases=VLLM_PHASES,
    auto_tools_flag="--enable-auto-tool-choice",  # with --tool-call-parser NAME (hermes, llama3_json, ...)
)


class VllmEngine(VllmSleepMixin, Engine):
    spec = VLLM_SPEC

    @classmethod
    def install_check(cls, needed: bool) -> InstallCheck:
        found = importlib.util.find_spec("vllm") is not None
        if not needed:
            return InstallCheck("vllm", True, "importable" if found else "not installed (no model of this machine needs it)")
        cli = vllm_cli()
        if found and cli is not None:
            return InstallCheck("vllm", True, f"importable, {cli}")
        return InstallCheck("vllm", False, "models of this machine use engine: vllm, which is not installed (pip install vllm)")

    def check(self) -> None:
        if vllm_cli() is None:
            raise RemoteError(
                ErrorCode.UNAVAILABLE, f"vllm is not installed on {self.machine} (pip install vllm there, or use engine: sim)"
            )

    def argv(self) -> list[str]:
        return [vllm_cli() or "vllm", "serve", str(self.path), *self.serve_flags()]

    @classmethod
    def stack(cls, reader: TorchReader) -> Stack:
        return vllm_stack(reader, vllm_cli())


class SimEngine(VllmSleepMixin, Engine):
    spec = dataclasses.replace(
        VLLM_SPEC, name="sim", title="vLLM (simulated)", simulated=True, min_compute_capability=None, gpu_stack=StackKind.SIM
    )

    def argv(self) -> list[str]:
        sim = self.model.sim
        argv = [
            sys.executable,
            "-m",
            "agents.orchestra.engines.vllm.twin",
            str(self.path),
            *self.serve_flags(),
            "--load-s",
            str(sim.load_s),
            "--cold-factor",
            str(sim.cold_factor),
            "--warmup-s",
            str(sim.warmup_s),
            "--wake-s",
            str(sim.wake_s),
            "--tokens-per-s",
            str(sim.tokens_per_s),
            "--traffic-rps",
            str(sim.traffic_rps),
        ]
        # follow the agent that owns the state dir, not just our parent, so a restarted agent can re-adopt us
        argv += ["--agent-pid-file", str(self.agent_pid_file)] if self.agent_pid_file else ["--parent-pid", str(os.getpid())]
        if sim.fail_after_s is not None:
            argv += ["--fail-after-s", str(sim.fail_after_s)]
        return argv
