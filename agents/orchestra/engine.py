"""The engine interface: a model server as a supervised child process with an HTTP API."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import itertools
import json
import os
import signal
import socket
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from agents.orchestra.spec import EngineSpec, GpuBuild
from agents.runtime.ports import server_port
from agents.runtime.procfiles import LOG_KEEP, LOG_MAX_BYTES, copy_truncate, descendants
from agents.runtime.torch_probe import TorchReader
from agents.runtime.waits import within
from agents.wire.engine_address import MAX_SOCKET_PATH_BYTES, EngineAddress
from agents.wire.lab.model import Model
from agents.wire.protocol import ErrorCode, GpuSample, RemoteError
from agents.wire.safe_read import open_regular
from agents.wire.sections.gpu_support import Stack, StackKind


class EngineProcess(Protocol):
    """An engine's server process as the engine drives it: the asyncio child it started, or one a previous agent
    started that the pool adopted at its start (agents/orchestra/adopt.py's AdoptedProcess, polled, not our child)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int | None: ...


GIB = 1024**3
LOG_TAIL_BYTES = 256 * 1024
STOP_GRACE_S = 10.0
OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError")
JsonBody = dict[str, Any] | list[Any]  # a request body, sent as JSON
_SERIALS = itertools.count(1)  # each Engine object gets the next: a record can tell a restarted engine from the one it knew


@dataclass(frozen=True)
class InstallCheck:
    """What the doctor says of an engine's install on this machine (`cetlab-agent doctor`, one line)."""

    name: str
    ok: bool
    message: str


class EngineDown(Exception):
    """The engine did not answer (not listening yet, or gone)."""


class EngineRequestFailed(Exception):
    """The engine answered with an error status."""


SOCKET_NAME = "engine.sock"


def free_port(host: str = "127.0.0.1") -> int:
    return server_port(host)  # not port 0's: an outgoing connection may take that before the engine binds it


def private_dir(path: Path) -> Path:
    """``path`` as a folder only this user can enter (made 0700, or checked: ours, a folder, no access for others)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(f"{path} is not a folder of this user: engines' sockets cannot go there")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def socket_path(run_dir: Path) -> Path:
    """The engine's socket in its run folder; a state dir too deep for a socket's 107 bytes gets a private folder of
    this user in the temp dir instead (named by a digest of the run folder, so a restarted agent finds it again)."""
    path = run_dir / SOCKET_NAME
    if len(str(path).encode()) <= MAX_SOCKET_PATH_BYTES:
        return path
    digest = hashlib.sha256(str(run_dir).encode()).hexdigest()[:24]
    short = Path(tempfile.gettempdir()) / f"cetlab-engines-{os.geteuid()}" / f"{digest}.sock"
    if len(str(short).encode()) > MAX_SOCKET_PATH_BYTES:
        raise OSError(f"{run_dir} and the temp dir are both too deep for a socket path ({MAX_SOCKET_PATH_BYTES} bytes)")
    private_dir(short.parent)
    return short


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a unix socket (the engine's): the Host header says localhost."""

    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


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
        self.address = self.listen_address()
        self.rpc_servers: list[str] = []  # llama.cpp: host:port of the helpers' rpc-servers (forwarded here), for --rpc
        self.proc: EngineProcess | None = None
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

    @classmethod
    def stack(cls, reader: TorchReader) -> Stack | None:
        """What the GPU support check judges of this engine here: its build's kernels, read now (slow reads cached);
        None: not checked. A simulated engine is a CPU process; engines with a GPU build override this."""
        if cls.spec.gpu_stack != StackKind.SIM:
            return None
        return Stack(name="sim engine", kind=StackKind.SIM, needs_gpu=False, source=f"{cls.spec.title} (SIM)", simulated=True)

    @classmethod
    def install_check(cls, needed: bool) -> InstallCheck | None:
        """The doctor's line on this engine's install (``needed``: a model of this machine uses it); None: nothing to say."""
        return None

    @classmethod
    def missing_said(cls, path: Path) -> str:
        """A model's path that is not there, with its fix: the doctor's line, and the refusal to warm such a model."""
        if cls.spec.simulated:
            made = "a folder" if cls.spec.model_formats != ("gguf",) else "a file"
            fix = f"`mkdir -p {path}`" if made == "a folder" else f"`touch {path}`"
            return f"{path} does not exist: {fix} ({made}, any content), or give sim.placeholder_mib"
        return f"{path} does not exist: {cls.fetch_hint(path)}, or fix models[].path"

    @classmethod
    def doctor_checks(cls, model: Model, path: Path, gpu_caps: dict[int, float | None]) -> list[InstallCheck]:
        """The doctor's lines on one model of this machine: its weights here, in a format this engine loads, each
        failure with what fixes it. ``gpu_caps``: the compute capability of each real GPU (empty on simulated ones)."""
        name = f"model {model.name}"
        if cls.spec.simulated:  # no real weights, but it starts only where its path is (as the real engine would)
            if path.exists() or model.sim.placeholder_mib is not None or model.make_tiny_if_missing:
                return [InstallCheck(name, True, f"{cls.spec.title}: simulated, no real weights needed")]
            return [InstallCheck(name, False, cls.missing_said(path))]
        if not path.exists():
            if model.make_tiny_if_missing:
                return [InstallCheck(name, True, f"{path} missing: the agent makes the tiny demo model there at first start")]
            return [InstallCheck(name, False, cls.missing_said(path))]
        fmt = cls.spec.accepts(str(path))
        if fmt is None:
            formats = " or ".join(cls.spec.model_formats)
            return [
                InstallCheck(name, False, f"{path}: {cls.spec.title} loads {formats}, not this; convert it or change engine:")
            ]
        return [InstallCheck(name, True, f"{path} ({fmt})")]

    @classmethod
    def fetch_hint(cls, path: Path) -> str:
        """The command that puts a model's weights at ``path``."""
        return f"download them there: `hf download REPO --local-dir {path}`"

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

    @classmethod
    def on_socket(cls, model: Model) -> bool:
        """Whether this engine's server can listen on a unix socket (engines without that option override it)."""
        return True

    @classmethod
    def tcp_warning(cls, model: Model) -> str | None:
        """Why this model's engine will listen on 127.0.0.1, where any user of the machine reaches it with no key (the
        doctor's WARN); None: on a unix socket in the agent's private folder."""
        if model.port is not None:
            return (
                f"listens on 127.0.0.1:{model.port} (its port: in lab.yaml): any user of this machine can generate, sleep "
                "and wake it there with no key; remove port: to put it on a unix socket only the agent reaches"
            )
        if not cls.on_socket(model):
            return (
                f"{cls.spec.title} has no unix-socket option: it listens on 127.0.0.1 (a free port), where any user of this "
                "machine can reach it with no key; on a shared machine serve it with engine vllm or llamacpp"
            )
        return None

    @property
    def runtime_dir(self) -> Path:
        """The engine's own folder under the agent's state dir (0700): its socket, and vLLM's temp files. A kept
        engine outlives the agent, and under systemd's PrivateTmp the agent's /tmp is deleted when it stops."""
        return self.log_path.with_suffix(".run")

    def listen_address(self) -> EngineAddress:
        """A unix socket in the run folder, unless lab.yaml gives the model a `port:` or the server has no socket option
        (then 127.0.0.1, which any local user reaches: the doctor warns)."""
        if self.model.port is not None:
            return EngineAddress(port=self.model.port)
        if not self.on_socket(self.model):
            return EngineAddress(port=free_port())
        try:
            return EngineAddress(socket=str(socket_path(self.runtime_dir)))
        except OSError as exc:  # the temp dir's folder of another user, or no room: refused, not served on a port
            raise RemoteError(
                ErrorCode.UNAVAILABLE, f"model {self.model.name}: no private folder for its engine's socket ({exc})"
            ) from None

    @property
    def endpoint(self) -> str:
        return self.address.endpoint

    def prepare_listen(self) -> None:
        """Before a start: the run folder private, and a killed engine's socket gone (vLLM's bind would fail on it)."""
        private_dir(self.runtime_dir)
        if self.address.socket is not None:
            Path(self.address.socket).unlink(missing_ok=True)

    # -- process

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.rotate_log()
        self.prepare_listen()
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
            await within(self.proc.wait(), STOP_GRACE_S)
        except ProcessLookupError:
            pass
        except TimeoutError:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await self.proc.wait()

    # -- HTTP

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        if self.address.socket is not None:
            return UnixHTTPConnection(self.address.socket, timeout_s)
        return http.client.HTTPConnection("127.0.0.1", self.address.port, timeout=timeout_s)

    def _request(self, method: str, path: str, body: JsonBody | None, timeout_s: float) -> bytes:
        """Every request the agent sends its engine (health, sleep, wake, adapters, metrics, warm-up), at its address."""
        data = None if body is None else json.dumps(body).encode()
        connection = self._connection(timeout_s)
        try:
            connection.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
            response = connection.getresponse()
            answer: bytes = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise EngineDown(f"{method} {path}: {exc}") from None
        finally:
            connection.close()
        if response.status >= 400:
            detail = answer[:300].decode(errors="replace")
            raise EngineRequestFailed(f"{method} {path} answered {response.status}: {detail}") from None
        return answer

    async def http(self, method: str, path: str, body: JsonBody | None = None, timeout_s: float = 10.0) -> bytes:
        return await asyncio.to_thread(self._request, method, path, body, timeout_s)

    async def health(self) -> bool:
        try:
            await self.http("GET", "/health", timeout_s=2.0)
            return True
        except (EngineDown, EngineRequestFailed):
            return False

    async def warm_up(self, timeout_s: float) -> dict[str, Any]:
        """A real first completion: the engine compiles and allocates now, not on a user's request."""
        prompt = self.model.warmup_prompt
        warmups: dict[str, tuple[str, dict[str, Any]]] = {
            "chat": ("/v1/completions", {"prompt": prompt, "max_tokens": 8}),
            "embedding": ("/v1/embeddings", {"input": prompt}),
            "rerank": ("/v1/rerank", {"query": prompt, "documents": [prompt]}),
        }
        path, extra = warmups[self.model.serves]
        body = {"model": self.served_name, **extra}
        answer = json.loads(await self.http("POST", path, body, timeout_s=timeout_s))
        if not isinstance(answer, dict):
            raise EngineRequestFailed(f"POST {path} answered {type(answer).__name__}, not a JSON object")
        return answer

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
        """The console's figures from this engine's /metrics page; an engine whose spec names series overrides it."""
        return {}

    # -- the log

    def log_text(self) -> str:
        """This run's log (its last LOG_TAIL_BYTES). The engine writes it as the agent's uid and models.get reads it
        on the loop: a FIFO or a link put in its place is refused at the open, never waited on (agents/wire/safe_read.py)."""
        try:
            fd = open_regular(self.log_path)
        except OSError:
            return ""
        try:
            size = os.fstat(fd).st_size
            start = max(self._log_offset, size - LOG_TAIL_BYTES)
            return os.pread(fd, LOG_TAIL_BYTES, start).decode(errors="replace")
        except OSError:
            return ""
        finally:
            os.close(fd)

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
