"""The engine interface: a model server as a supervised child process with an HTTP API."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import shutil
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from agents.orchestra.lora_rules import lora_config_problem
from agents.orchestra.spec import EngineSpec, GpuBuild
from agents.runtime.ports import server_port
from agents.runtime.procfiles import LOG_KEEP, LOG_MAX_BYTES, copy_truncate, descendants
from agents.wire.lab.model import Model
from agents.wire.protocol import GpuSample
from agents.wire.safe_read import ADAPTER_CONFIG_MAX_BYTES, read_capped

if TYPE_CHECKING:
    from agents.orchestra.adopt import AdoptedProcess

GIB = 1024**3
MAX_GPU_MEMORY_UTILIZATION = 0.95
LOG_TAIL_BYTES = 256 * 1024
STOP_GRACE_S = 10.0
OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError")
_SERIALS = itertools.count(1)  # each Engine object gets the next: a record can tell a restarted engine from the one it knew

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


class EngineDown(Exception):
    """The engine did not answer (not listening yet, or gone)."""


class EngineRequestFailed(Exception):
    """The engine answered with an error status."""


def free_port(host: str = "127.0.0.1") -> int:
    return server_port(host)  # not port 0's: an outgoing connection may take that before the engine binds it


def _sum_samples(families: dict[str, Any], names: tuple[str, ...], suffix: str = "") -> float | None:
    for name in names:
        family = families.get(name)
        if family is not None:
            return sum(s.value for s in family.samples if s.name == name + suffix)
    return None


def parse_metrics(text: str) -> dict[str, float | None]:
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


class Engine:
    """One model server. Subclasses say how to start it; their ``spec`` says what it can do."""

    spec: ClassVar[EngineSpec] = EngineSpec(name="", title="")
    kind = ""
    simulated = False
    can_sleep = False
    has_metrics = False
    agent_pid_file: Path | None = None  # the agent that owns this engine now (a restarted agent takes over)
    gpu_totals: list[int] | None = None  # each GPU's memory in self.gpus order, where the pool knows it
    adapters: dict[str, str] = {}  # name -> path of the adapters loaded at run time (replaced, never mutated in place)

    def __init__(
        self, model: Model, path: Path, machine: str, gpus: list[int], log_path: Path, gpu_total_bytes: int | None = None
    ):
        self.model = model
        self.path = path
        self.machine = machine
        self.gpus = gpus
        self.log_path = log_path
        self.gpu_total_bytes = gpu_total_bytes
        self.host = "127.0.0.1"
        self.port = model.port or free_port(self.host)
        self.proc: asyncio.subprocess.Process | AdoptedProcess | None = None  # AdoptedProcess: started by a previous agent
        self._log_offset = 0
        self.stopping = False
        self.serial = next(_SERIALS)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "spec" in cls.__dict__:  # the spec is the one source of these
            cls.kind, cls.simulated = cls.spec.name, cls.spec.simulated
            cls.can_sleep, cls.has_metrics = cls.spec.can_sleep, cls.spec.has_metrics

    @classmethod
    def gpu_build(cls) -> GpuBuild:
        """What this machine's build of the engine runs on (CUDA archs, CPU only); engines that can tell override it."""
        return GpuBuild("unknown", min_compute_capability=cls.spec.min_compute_capability, detail="not probed")

    # -- what subclasses provide

    def check(self) -> None:
        """Raise RemoteError(UNAVAILABLE) when this engine cannot run on this machine."""

    def argv(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        env = {**os.environ, **self.model.env}
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA numbers GPUs as NVML does (PCI order), not fastest first
        return env

    @property
    def served_name(self) -> str:
        return self.model.served_name or self.model.name

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    # -- process

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.rotate_log()
        argv = self.argv()
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} cetlab starts {self.model.name}: {' '.join(argv)}\n".encode())
            log.flush()
            # own session: the whole server (workers included) stops as one process group
            self.proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=self.env(),
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc else None

    def pids(self) -> list[int]:
        """The server and every process under it (vLLM's engine core and workers hold the GPU memory)."""
        if self.pid is None:
            return []
        return [self.pid, *(p.pid for p in descendants(self.pid))]

    def vram_by_gpu(self, gpus: list[GpuSample]) -> dict[int, int] | None:
        """What NVML says this engine's processes hold on each of its GPUs (bytes), or None where it cannot tell."""
        return process_vram_bytes(gpus, self.pids(), self.gpus)

    async def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL it after a grace period."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.stopping = True
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            await asyncio.wait_for(self.proc.wait(), STOP_GRACE_S)
        except ProcessLookupError:
            pass
        except TimeoutError:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await self.proc.wait()

    # -- HTTP

    def _request(self, method: str, path: str, body: dict | None, timeout_s: float) -> bytes:
        import urllib.error  # lazy: not every agent serves models
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://{self.host}:{self.port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"} if data else {},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace")
            raise EngineRequestFailed(f"{method} {path} answered {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise EngineDown(f"{method} {path}: {getattr(exc, 'reason', exc)}") from None

    async def http(self, method: str, path: str, body: dict | None = None, timeout_s: float = 10.0) -> bytes:
        return await asyncio.to_thread(self._request, method, path, body, timeout_s)

    async def health(self) -> bool:
        try:
            await self.http("GET", "/health", timeout_s=2.0)
            return True
        except (EngineDown, EngineRequestFailed):
            return False

    async def warm_up(self, timeout_s: float) -> dict[str, Any]:
        """A real first completion: the engine compiles and allocates now, not on a user's request."""
        body = {"model": self.served_name, "prompt": self.model.warmup_prompt, "max_tokens": 8}
        return json.loads(await self.http("POST", "/v1/completions", body, timeout_s=timeout_s))

    async def sleep(self, level: int) -> None:
        raise NotImplementedError

    async def wake(self) -> None:
        raise NotImplementedError

    async def is_sleeping(self) -> bool:
        """Whether the engine sleeps now (engines with a sleep mode ask it)."""
        return False

    async def load_adapter(self, name: str, path: str) -> None:
        """Load (or, at start, select) a LoRA adapter; only engines whose spec has an adapter_format can."""
        raise EngineRequestFailed(f"the {self.kind} engine loads no adapters")

    async def metrics(self) -> dict[str, float | None]:
        """The engine's /metrics figures; the pool polls this every few seconds, so the log is rotated here too."""
        self.rotate_log()
        if not self.has_metrics:
            return {}
        return self.parse_metrics((await self.http("GET", "/metrics", timeout_s=3.0)).decode())

    def parse_metrics(self, text: str) -> dict[str, float | None]:
        """The console's figures from this engine's /metrics page (vLLM's series; other engines override)."""
        return parse_metrics(text)

    # -- the log

    def log_text(self) -> str:
        """This run's log (its last LOG_TAIL_BYTES)."""
        try:
            with open(self.log_path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(self._log_offset, size - LOG_TAIL_BYTES))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def rotate_log(self) -> None:
        """Rotate the engine log as job logs are (LOG_MAX_BYTES, LOG_KEEP files); the engine keeps appending."""
        if copy_truncate(self.log_path, LOG_MAX_BYTES, LOG_KEEP):
            self._log_offset = 0

    def log_tail(self, lines: int = 20) -> list[str]:
        return self.log_text().splitlines()[-lines:]

    def load_phases(self) -> dict[str, float]:
        # a log line is outside input: the spec drops a 400-digit "took" (no finite phase time)
        return self.spec.parse_phases(self.log_text())

    def out_of_memory(self) -> bool:
        text = self.log_text()
        return any(marker in text for marker in OOM_MARKERS)


def process_vram_bytes(samples: list[GpuSample], pids: list[int], gpus: list[int]) -> dict[int, int] | None:
    """Per GPU index in ``gpus``: the memory NVML reports for ``pids`` (summed); None when NVML gave no figure.

    The pool's fit check wants this, not the lab.yaml estimate: a warm model may hold far more or
    less, and a sleeping vLLM keeps its CUDA context and graphs (measured, not assumed).
    """
    wanted = set(pids)
    by_gpu: dict[int, int] = {}
    seen = False
    for sample in samples:
        if sample.index not in gpus:
            continue
        held = [p.mem_used_bytes for p in sample.processes if p.pid in wanted]
        if any(m is not None for m in held):
            seen = True
        by_gpu[sample.index] = sum(m for m in held if m is not None)
    return by_gpu if seen else None


class AdapterNotLoadable(EngineRequestFailed):
    """vLLM would refuse this adapter at run time; str() says why and offers the merge path."""


MERGE_HINT = "serve it merged into its base instead (`cetlab serve-checkpoint` merges an adapter no warm model can load)"


def adapter_problem(adapter_dir: Path, model: Model) -> str | None:
    """Why vLLM cannot hot-load the PEFT adapter in ``adapter_dir`` into ``model`` (None: it can).

    vLLM refuses any adapter when the server runs without --enable-lora, and the adapters
    agents.orchestra.lora_rules lists (modules_to_save, DoRA, bias, ranks above --max-lora-rank,
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

    def serve_flags(self) -> list[str]:
        """`vllm serve MODEL` flags after the model: the agent's, then lab.yaml's args (which win where they repeat)."""
        model, args = self.model, list(self.model.args)
        flags = [
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--served-model-name",
            self.served_name,
            "--enable-sleep-mode",
            "--disable-uvicorn-access-log",
        ]  # the agent polls /metrics: no access line each time
        if model.max_loras and "--enable-lora" not in args:
            flags += ["--enable-lora", "--max-loras", str(model.max_loras), "--max-lora-rank", str(model.max_lora_rank)]
        if "--tensor-parallel-size" not in args and len(self.gpus) > 1:
            flags += ["--tensor-parallel-size", str(len(self.gpus))]
        if "--gpu-memory-utilization" not in args and self.gpu_total_bytes and model.vram_gib:
            # vLLM takes a share of each GPU: the model's estimate, not the default 90%
            per_gpu = model.vram_gib * GIB / max(1, len(self.gpus))
            share = min(MAX_GPU_MEMORY_UTILIZATION, math.ceil(100 * per_gpu / self.gpu_total_bytes) / 100)
            flags += ["--gpu-memory-utilization", f"{share:.2f}"]
        return flags + args

    @property
    def runtime_dir(self) -> Path:
        """The engine's own temp folder, under the agent's state dir: a kept engine outlives the agent, and under
        systemd's PrivateTmp the agent's /tmp is deleted when it stops (vLLM's IPC sockets, its metrics files)."""
        return self.log_path.with_suffix(".run")

    def env(self) -> dict[str, str]:
        env = vllm_env(super().env())
        run = self.runtime_dir
        env.update(TMPDIR=str(run / "tmp"), VLLM_RPC_BASE_PATH=str(run / "rpc"), PROMETHEUS_MULTIPROC_DIR=str(run / "metrics"))
        return env

    async def start(self) -> None:
        # vLLM asks that a PROMETHEUS_MULTIPROC_DIR it did not make be wiped between runs: a new one each start
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
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
