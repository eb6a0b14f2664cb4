"""The engine interface: a model server as a supervised child process with an HTTP API."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from agents.lab import Model

GIB = 1024**3
LOG_TAIL_BYTES = 256 * 1024
STOP_GRACE_S = 10.0
OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError")

# Load-phase lines vLLM writes (the sim engine writes the same ones), parsed into seconds.
_PHASES = {
    "weights_s": re.compile(r"Loading weights took ([\d.]+) seconds"),
    "model_load_s": re.compile(r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds"),
    "graph_capture_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "init_engine_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) seconds"),
    "first_pass_s": re.compile(r"warm-up \(first forward pass\) took ([\d.]+) seconds"),
}


class EngineDown(Exception):
    """The engine did not answer (not listening yet, or gone)."""


class EngineRequestFailed(Exception):
    """The engine answered with an error status."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _sum_samples(families: dict[str, Any], names: tuple[str, ...], suffix: str = "") -> float | None:
    for name in names:
        family = families.get(name)
        if family is not None:
            return sum(s.value for s in family.samples if s.name == name + suffix)
    return None


def parse_metrics(text: str) -> dict[str, float | None]:
    """The figures the console shows, from a vLLM /metrics page (summed over labels)."""
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
    """One model server. Subclasses say how to start it and what it can do."""

    kind = ""
    simulated = False
    can_sleep = False
    has_metrics = False
    agent_pid_file: Path | None = None  # the agent that owns this engine now (a restarted agent takes over)

    def __init__(self, model: Model, path: Path, machine: str, gpus: list[int], log_path: Path, gpu_total_bytes: int | None = None):
        self.model = model
        self.path = path
        self.machine = machine
        self.gpus = gpus
        self.log_path = log_path
        self.gpu_total_bytes = gpu_total_bytes
        self.host = "127.0.0.1"
        self.port = model.port or free_port(self.host)
        self.proc: asyncio.subprocess.Process | None = None
        self._log_offset = 0
        self.stopping = False

    # -- what subclasses provide

    def check(self) -> None:
        """Raise RemoteError(UNAVAILABLE) when this engine cannot run on this machine."""

    def argv(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        env = {**os.environ, **self.model.env}
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)
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
        argv = self.argv()
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} cetlab starts {self.model.name}: {' '.join(argv)}\n".encode())
            log.flush()
            # own session: the whole server (workers included) stops as one process group
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
                env=self.env(), start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc else None

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
        except asyncio.TimeoutError:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await self.proc.wait()

    # -- HTTP

    def _request(self, method: str, path: str, body: dict | None, timeout_s: float) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://{self.host}:{self.port}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data else {})
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

    async def metrics(self) -> dict[str, float | None]:
        if not self.has_metrics:
            return {}
        return parse_metrics((await self.http("GET", "/metrics", timeout_s=3.0)).decode())

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

    def log_tail(self, lines: int = 20) -> list[str]:
        return self.log_text().splitlines()[-lines:]

    def load_phases(self) -> dict[str, float]:
        text = self.log_text()
        phases = {}
        for key, pattern in _PHASES.items():
            found = pattern.findall(text)
            if found:
                phases[key] = float(found[-1])
        return phases

    def out_of_memory(self) -> bool:
        text = self.log_text()
        return any(marker in text for marker in OOM_MARKERS)


class VllmSleepMixin:
    """vLLM's sleep mode endpoints (dev mode): level 1 keeps weights in host RAM, level 2 drops them."""

    can_sleep = True

    async def sleep(self, level: int) -> None:
        await self.http("POST", f"/sleep?level={level}", timeout_s=600.0)

    async def wake(self) -> None:
        await self.http("POST", "/wake_up", timeout_s=600.0)

    async def is_sleeping(self) -> bool:
        return bool(json.loads(await self.http("GET", "/is_sleeping", timeout_s=3.0)).get("is_sleeping"))

    async def load_adapter(self, name: str, path: str) -> None:
        await self.http("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, timeout_s=600.0)
