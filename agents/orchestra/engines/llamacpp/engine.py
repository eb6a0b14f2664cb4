"""The llama.cpp engine: `llama-server` serving one GGUF model, and its simulated twin (engine: sim-llamacpp).

What the pinned llama-server (llama-cpp-python 0.3.36's vendor/llama.cpp, tools/server/) offers, and how cetlab uses it:
- health: GET /health answers 503 while the model loads, 200 once it serves.
- metrics: --metrics exposes llamacpp:* series (prompt_tokens_total, tokens_predicted_total, requests_processing,
  requests_deferred, ...); it has no TTFT histogram and no KV-cache gauge, so those figures stay empty.
- GPUs: -ngl (layers on the GPU), --split-mode layer --tensor-split (a model over several GPUs, split by memory).
- sleep: llama-server has no sleep-on-request. Its --sleep-idle-seconds frees the model and KV cache after
  that long idle and reloads on the next task, inside the same process, with no call to trigger it; its router
  mode (--models-dir, /models/load, /models/unload, --models-max) runs each model in a child process of a
  router. cetlab runs one llama-server per model (its own GPUs, port and process group, so NVML charges
  the VRAM to that model), so taking a model off its GPUs stops the process: the GGUF is memory-mapped and
  stays in the page cache (state cached), and the next warm loads it at RAM speed (bench/bench_llamacpp.py).
  A model's args may add --sleep-idle-seconds: llama-server then sleeps on its own while cetlab shows it warm.
- LoRA: GGUF adapters are named at start (--lora FILE, several allowed) and switched at run time with
  POST /lora-adapters [{"id", "scale"}]. In the pinned version every request applies the adapters at their
  listed scale (1 unless --lora-scaled says otherwise), even with --lora-init-without-apply (that flag only
  keeps them out of the context at start; the server's per-request adapter list still has scale 1).
  A new adapter cannot be loaded into a running server; a PEFT checkpoint is converted to GGUF first
  (llama.cpp's convert_lora_to_gguf.py) and the model restarted with it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from agents.orchestra.engine import Engine, EngineRequestFailed, InstallCheck
from agents.orchestra.engines.llamacpp import build as llamacpp_build
from agents.orchestra.spec import EngineSpec, GpuBuild
from agents.runtime.children import OFFLINE, minimal_env
from agents.runtime.torch_probe import TorchReader
from agents.wire.lab.model import Model
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.safe_read import open_regular
from agents.wire.sections.gpu_support import Stack, StackKind

LLAMACPP_METRICS: dict[str, str | None] = {
    "requests_running": "llamacpp:requests_processing",
    "requests_waiting": "llamacpp:requests_deferred",
    "kv_cache_pct": None,
    "prompt_tokens_total": "llamacpp:prompt_tokens_total",
    "generation_tokens_total": "llamacpp:tokens_predicted_total",
    "ttft": None,
}
# ggml-cuda's floor: Maxwell (5.0) and newer; the P40/P4/P1000 (6.1) are llama.cpp's classic cards
LLAMACPP_CUDA_MIN_CC = 5.0
LLAMACPP_SPEC = EngineSpec(
    gpu_stack=StackKind.LLAMACPP,
    name="llamacpp",
    title="llama.cpp (llama-server)",
    free_mode="stop",
    adapters="at-start",
    adapter_format="gguf",
    multi_gpu="layer-split",
    tools_off_flag="--no-jinja",
    length_param="n_predict",  # tools go through the model's jinja chat template (on by default in the pinned build)
    model_formats=("gguf",),
    serves=("chat", "embedding", "rerank"),  # --embedding, --reranking
    metric_names=LLAMACPP_METRICS,
    min_compute_capability=LLAMACPP_CUDA_MIN_CC,
)
# llama-server log lines start with "M.SS.mmm.uuu" (minutes, seconds, ms, us since start)
_STAMPED = re.compile(r"^(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) \w (.*)$", re.M)
_PHASE_LINES = {"model_load_s": "llama_server: model loaded", "listening_s": "llama_server: listening on"}
# what llama-server is told to answer (without them it answers /v1/embeddings and /v1/rerank with a 501)
POOLING_FLAGS = {"chat": [], "embedding": ["--embedding"], "rerank": ["--reranking"]}
ALL_GPU_LAYERS = "999"  # -ngl: every layer on the GPU(s)


def parse_llamacpp_metrics(text: str) -> dict[str, float | None]:
    """The console's figures from llama-server's /metrics (llamacpp:* series; counters keep the _total name)."""
    from prometheus_client.parser import text_string_to_metric_families  # lazy: not every agent serves models

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = sample.value
    figures: dict[str, float | None] = {}
    for key, series in LLAMACPP_METRICS.items():
        if key == "ttft":
            continue
        figures[key] = values.get(series) if series else None
    figures["ttft_sum_s"] = figures["ttft_count"] = None
    return figures


def tensor_split(totals: list[int]) -> str:
    """--tensor-split proportions: each GPU's share of the layers by its memory (llama.cpp normalises them)."""
    if not totals or any(t <= 0 for t in totals):
        return ",".join("1" for _ in totals)
    gib = [t / 1024**3 for t in totals]
    return ",".join(f"{g:.1f}".rstrip("0").rstrip(".") for g in gib)


def gguf_problem(path: Path) -> str | None:
    """Why llama.cpp would not load this file (its header: magic GGUF, then a little-endian uint32 version); None: it reads."""
    try:  # never a FIFO waited on: the doctor's thread must end within its timeout
        fd = open_regular(path)
        try:
            head = os.pread(fd, 8, 0)
        finally:
            os.close(fd)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if head[:4] != b"GGUF":
        return f"not a GGUF file (it starts {head[:4]!r}, not b'GGUF'): convert it with llama.cpp's convert_hf_to_gguf.py"
    version = int.from_bytes(head[4:8], "little") if len(head) == 8 else 0
    if version not in (1, 2, 3):
        return f"a GGUF header of version {version}, which llama.cpp does not read (1 to 3); is the file whole?"
    return None


def lora_files(args: list[str]) -> list[str]:
    """The adapter files the args name (--lora F, --lora F1,F2, --lora-scaled F:S), in llama-server's id order."""
    files: list[str] = []
    for i, arg in enumerate(args[:-1]):
        if arg == "--lora":
            files += [f for f in args[i + 1].split(",") if f]
        elif arg == "--lora-scaled":
            files += [f.rsplit(":", 1)[0] for f in args[i + 1].split(",") if f]
    return files


class LlamacppEngine(Engine):
    spec = LLAMACPP_SPEC
    gpu_totals: list[int] | None = None  # each GPU's memory, in self.gpus order (the pool sets it), for --tensor-split

    @staticmethod
    def binary() -> Path | None:
        return llamacpp_build.find_llama_server()

    @classmethod
    def gpu_build(cls) -> GpuBuild:
        """CPU or CUDA and its archs, from cetlab's build stamp; a llama-server built elsewhere is looked into."""
        binary = cls.binary()
        if binary is None:
            return GpuBuild("absent", detail=f"no llama-server ({llamacpp_build.MAKE_HINT})")
        stamp = llamacpp_build.read_stamp(binary)
        if stamp is not None:
            if stamp.get("cuda"):
                archs = tuple(str(a) for a in stamp.get("cuda_archs", []))
                return GpuBuild("cuda", archs, LLAMACPP_CUDA_MIN_CC, f"{binary} (build stamp)")
            return GpuBuild("cpu", detail=f"{binary} (build stamp: CPU build)")
        try:  # not ours: a static CUDA build carries ggml-cuda's symbols, a shared one its library beside it
            cuda = b"ggml_backend_cuda" in binary.read_bytes() or any(binary.parent.glob("libggml-cuda*"))
        except OSError as exc:
            return GpuBuild("unknown", detail=f"{binary}: {exc.strerror}")
        return GpuBuild(
            "cuda" if cuda else "cpu",
            (),
            LLAMACPP_CUDA_MIN_CC if cuda else None,
            f"{binary} (no build stamp; CUDA archs not known)",
        )

    @classmethod
    def stack(cls, reader: TorchReader) -> Stack | None:
        """llama-server's build as gpu_build() reads it (its build stamp: CPU or CUDA with CMAKE_CUDA_ARCHITECTURES;
        a binary built elsewhere: CUDA or not, archs unknown, so no refusal)."""
        if cls.spec.simulated:
            return super().stack(reader)
        build = cls.gpu_build()
        name, kind = "llama-server", StackKind.LLAMACPP
        if build.kind == "absent":
            return Stack(name=name, kind=kind, source="llama-server", problem=f"not installed: {build.detail}")
        if build.kind == "unknown":
            return Stack(name=name, kind=kind, source=build.detail, problem=f"could not be read: {build.detail}")
        return Stack(
            name=name,
            kind=kind,
            cpu_build=build.kind == "cpu",
            archs=[f"sm_{a}" for a in build.archs if a.isdigit()],
            source=build.detail,
        )

    @classmethod
    def doctor_checks(cls, model: Model, path: Path, gpu_caps: dict[int, float | None]) -> list[InstallCheck]:
        """llama-server found where the agent looks, its build against the GPUs the model is on, and a GGUF whose
        header reads (magic GGUF and a version)."""
        checks = super().doctor_checks(model, path, gpu_caps)
        if cls.spec.simulated:
            return checks
        binary = cls.binary()
        if binary is None:
            where = f"${llamacpp_build.BINARY_ENV}, {llamacpp_build.build_dir()}/bin, PATH"
            caps = [cc for g in model.gpus if (cc := gpu_caps.get(g)) is not None]
            build_it = llamacpp_build.build_command(caps)
            checks.insert(0, InstallCheck(f"llama-server ({model.name})", False, f"not found ({where}): run `{build_it}`"))
        else:
            build = cls.gpu_build()
            placed = [g for g in model.gpus if g in gpu_caps]
            archs = (
                f"CUDA, kernels {' '.join('sm_' + a for a in build.archs) or 'not said'}" if build.kind == "cuda" else build.kind
            )
            cannot = [g for g in placed if (cc := gpu_caps[g]) is not None and build.runs_on(cc) is False]
            fix = f"run `{llamacpp_build.build_command(c for g in placed if (c := gpu_caps[g]) is not None)}` (needs nvcc)"
            checks.insert(
                0,
                InstallCheck(
                    f"llama-server ({model.name})",
                    not cannot,
                    f"{binary}: {archs}" + (f"; no kernels for GPU {', '.join(map(str, cannot))}: {fix}" if cannot else ""),
                ),
            )
        if path.is_file() and cls.spec.accepts(str(path)) is not None:
            problem = gguf_problem(path)
            if problem is not None:
                checks.append(InstallCheck(f"model {model.name} gguf", False, f"{path}: {problem}"))
        return checks

    @classmethod
    def fetch_hint(cls, path: Path) -> str:
        return f"download the GGUF there: `hf download REPO {path.name} --local-dir {path.parent}`"

    def check(self) -> None:
        if self.binary() is None:
            raise RemoteError(
                ErrorCode.UNAVAILABLE,
                f"llama-server is not on {self.machine}: {llamacpp_build.MAKE_HINT}, or set {llamacpp_build.BINARY_ENV}",
            )
        if self.spec.accepts(str(self.path)) is None:
            raise RemoteError(
                ErrorCode.UNAVAILABLE,
                f"model {self.model.name}: llama.cpp loads one .gguf file, not {self.path} "
                "(convert it with llama.cpp's convert_hf_to_gguf.py, or serve the folder with engine vllm or transformers)",
            )

    def split_flags(self) -> list[str]:
        """-ngl, and a split over several GPUs. With rpc helpers, their devices come first in llama-server's list and
        it splits the layers by each device's free memory, this machine's GPUs and the helpers' alike."""
        args = self.model.args
        flags = ["--rpc", ",".join(self.rpc_servers)] if self.rpc_servers else []
        if not any(a in args for a in ("-ngl", "--gpu-layers", "--n-gpu-layers")):
            flags += ["-ngl", ALL_GPU_LAYERS if self.gpus or self.rpc_servers else "0"]
        if len(self.gpus) > 1 and not self.rpc_servers and not any(a in args for a in ("-sm", "--split-mode")):
            flags += ["--split-mode", "layer"]
            if not any(a in args for a in ("-ts", "--tensor-split")):
                flags += ["--tensor-split", tensor_split(self.gpu_totals or [])]
        return flags

    def listen_flags(self) -> list[str]:
        """llama-server takes a --host ending in .sock as a unix socket path (its --port is then unused)."""
        if self.address.socket is not None:
            return ["--host", self.address.socket]
        return ["--host", "127.0.0.1", "--port", str(self.address.port)]

    def serve_flags(self) -> list[str]:
        """llama-server's flags after the model: the agent's, then lab.yaml's args (which win where they repeat)."""
        args = list(self.model.args)
        flags = [
            *self.listen_flags(),
            "--alias",
            self.served_name,
            "--metrics",
            *self.split_flags(),
            *POOLING_FLAGS[self.model.serves],
        ]
        return flags + args

    def argv(self) -> list[str]:
        return [str(self.binary() or "llama-server"), "-m", str(self.path), *self.serve_flags()]

    def parse_metrics(self, text: str) -> dict[str, float | None]:
        return parse_llamacpp_metrics(text)

    def load_phases(self) -> dict[str, float]:
        phases: dict[str, float] = {}
        for m in _STAMPED.finditer(self.log_text()):
            for key, marker in _PHASE_LINES.items():
                if marker in m.group(5):
                    phases[key] = int(m.group(1)) * 60 + int(m.group(2)) + int(m.group(3)) / 1e3 + int(m.group(4)) / 1e6
        return phases

    async def sleep(self, level: int) -> None:
        raise EngineRequestFailed("llama-server has no sleep on request (only --sleep-idle-seconds); the pool stops it instead")

    async def wake(self) -> None:
        raise EngineRequestFailed("llama-server has no wake on request; the pool starts it again")

    async def lora_adapters(self) -> list[dict[str, Any]]:
        """GET /lora-adapters: [{"id", "path", "scale"}, ...] of the adapters named at start."""
        doc = json.loads(await self.http("GET", "/lora-adapters", timeout_s=10.0))
        return doc if isinstance(doc, list) else []

    async def load_adapter(self, name: str, path: str) -> None:
        """Select an adapter named at start (scale 1, the others 0); one not named at start cannot be loaded now."""
        loaded = await self.lora_adapters()
        wanted = Path(path).resolve()
        ids = [a.get("id") for a in loaded if Path(str(a.get("path", ""))).resolve() == wanted]
        if not ids:
            raise EngineRequestFailed(
                f"llama-server loads adapters only at start; {path} is not among this model's --lora files "
                f"({', '.join(str(a.get('path')) for a in loaded) or 'none'}): add it to the model's args and restart it"
            )
        body = [{"id": a.get("id"), "scale": 1.0 if a.get("id") in ids else 0.0} for a in loaded]
        await self.http("POST", "/lora-adapters", body, timeout_s=30.0)


def convert_lora_argv(peft_dir: Path, base_dir: Path, out: Path) -> list[str] | None:
    """llama.cpp's own converter for a PEFT adapter (None when no cetlab build of llama-server carries it).

    convert_lora_to_gguf.py reads the base's config.json from ``base_dir`` (no weights needed) and writes
    the adapter's tensors under llama.cpp's names (blk.N.attn_q.weight.lora_a, ...).
    """
    binary = llamacpp_build.find_llama_server()
    script = binary.parent.parent / "convert_lora_to_gguf.py" if binary else None
    if script is None or not script.is_file() or not (script.parent / "conversion").is_dir():
        return None
    return [sys.executable, str(script), str(peft_dir), "--base", str(base_dir), "--outfile", str(out), "--outtype", "f32"]


def converter_env() -> dict[str, str]:
    """convert_lora_to_gguf.py imports gguf-py from the llama.cpp tree (copied beside the build); it gets the agent's
    PATH, HOME and locale only, and is kept off the network: it reads the adapter and the base's config it is given, and
    never reaches for a tokenizer by the base model's name."""
    binary = llamacpp_build.find_llama_server()
    paths = [str(binary.parent.parent / "gguf-py")] if binary is not None else []
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return minimal_env({**OFFLINE, **({"PYTHONPATH": os.pathsep.join(paths)} if paths else {})})


SIM_LLAMACPP_SPEC = dataclasses.replace(
    LLAMACPP_SPEC,
    name="sim-llamacpp",
    title="llama.cpp (simulated)",
    simulated=True,
    gpu_stack=StackKind.SIM,
    min_compute_capability=None,
)


class SimLlamacppEngine(LlamacppEngine):
    """agents.orchestra.engines.llamacpp.twin: llama-server's contract (flags, routes, metric names, refusals), simulated delays."""

    spec = SIM_LLAMACPP_SPEC

    @staticmethod
    def binary() -> Path | None:
        return Path(sys.executable)

    @classmethod
    def gpu_build(cls) -> GpuBuild:
        return GpuBuild("unknown", detail="simulated")

    def check(self) -> None:
        if self.spec.accepts(str(self.path)) is None:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"model {self.model.name}: llama.cpp loads one .gguf file, not {self.path}")

    def argv(self) -> list[str]:
        sim = self.model.sim
        argv = [
            sys.executable,
            "-m",
            "agents.orchestra.engines.llamacpp.twin",
            "-m",
            str(self.path),
            *self.serve_flags(),
            "--sim-load-s",
            str(sim.load_s),
            "--sim-cold-factor",
            str(sim.cold_factor),
            "--sim-warmup-s",
            str(sim.warmup_s),
            "--sim-tokens-per-s",
            str(sim.tokens_per_s),
            "--sim-traffic-rps",
            str(sim.traffic_rps),
        ]
        argv += (
            ["--sim-agent-pid-file", str(self.agent_pid_file)] if self.agent_pid_file else ["--sim-parent-pid", str(os.getpid())]
        )
        if sim.fail_after_s is not None:
            argv += ["--sim-fail-after-s", str(sim.fail_after_s)]
        return argv
