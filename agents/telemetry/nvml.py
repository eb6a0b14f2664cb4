"""The real GPU sampler: NVIDIA GPUs through NVML (nvidia-ml-py), never raising."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from agents.wire.protocol import ComputeCapability, GpuBackend, GpuProcess, GpuSample

GPU_LOST = "GPU is lost"
NAME_UNKNOWN = "N/A"
COMMAND_MAX_CHARS = 200
# usedGpuMemory when the driver cannot tell (Windows WDDM); new bindings already turn it into None.
NOT_AVAILABLE_BYTES = ctypes.c_ulonglong(-1).value
# NVML error code constant -> why there are no GPUs, for the operator.
INIT_REASONS = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "NVML library not found (is the NVIDIA driver installed?)",
    "NVML_ERROR_DRIVER_NOT_LOADED": "NVIDIA driver not loaded",
    "NVML_ERROR_NO_PERMISSION": "no permission to query the NVIDIA driver",
}


# Process lists, newest struct first: old drivers lack _v3 (and _v2), old bindings have only the unversioned (v1) call.
PROCESS_VERSIONS = ("_v3", "_v2", "")
MIG_SUFFIX = " (MIG)"  # a GPU split into MIG instances: utilization and processes are per instance, often N/A here


class _GpuLost(Exception):
    """Raised out of one GPU's queries so that GPU stops being queried."""


class _Missing(Exception):
    """This NVML call is absent from the bindings or the driver: try an older version of it."""


@dataclass
class _Gpu:
    index: int
    handle: Any
    name: str = NAME_UNKNOWN
    uuid: str | None = None
    mem_total_bytes: int | None = None
    capability: ComputeCapability | None = None
    failed: str | None = None
    slow: dict[str, tuple[float, Any]] = field(default_factory=dict)  # field -> (clock s, value)
    # per family of versioned calls (memory, Compute, Graphics): the position of the newest one that works here
    working: dict[str, int] = field(default_factory=dict)


def _text(value: bytes | str | None) -> str | None:
    """Old bindings return bytes, new ones str."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value


def _error_text(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def _host_process(pid: int, mem_used_bytes: int | None) -> GpuProcess:
    """The user and command line from the host, each None when gone or not ours to read."""

    def ask(question: Callable[[psutil.Process], Any]) -> Any:
        try:
            return question(psutil.Process(pid))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None

    user = ask(psutil.Process.username)
    command = ask(lambda proc: " ".join(proc.cmdline())[:COMMAND_MAX_CHARS] or None)
    return GpuProcess(pid=pid, user=user, command=command, mem_used_bytes=mem_used_bytes)


def _capability(value: Any) -> ComputeCapability | None:
    """nvmlDeviceGetCudaComputeCapability's (major, minor), e.g. (6, 1) for a Tesla P40; None when N/A or odd."""
    try:
        major, minor = value
        return ComputeCapability(major=int(major), minor=int(minor))
    except (TypeError, ValueError):
        return None


class NvmlSampler:
    """Samples every NVIDIA GPU; unsupported fields are None, a lost GPU is marked failed."""

    backend: GpuBackend = "nvml"
    simulated = False

    def __init__(self, nvml_module: Any = None, slow_ttl_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.slow_ttl_s = slow_ttl_s
        self.status: str | None = None
        self._clock = clock
        self._gpus: list[_Gpu] = []
        self._initialised = False
        if nvml_module is None:
            try:
                import pynvml

                nvml_module = pynvml
            except ImportError as exc:
                self.status = f"no NVIDIA GPUs: nvidia-ml-py is not installed ({exc})"
                return
        self._nvml = nvml_module
        # Process queries raise NVMLLibraryMismatchError (not an NVMLError) on a driver/bindings mismatch.
        names = ("NVMLError", "NVMLLibraryMismatchError")
        self._errors = tuple(getattr(nvml_module, name) for name in names if hasattr(nvml_module, name))
        self._mismatch = getattr(nvml_module, "NVMLLibraryMismatchError", None)
        try:
            nvml_module.nvmlInit()
            self._initialised = True
            count = nvml_module.nvmlDeviceGetCount()
        except self._errors as exc:
            self.status = f"no NVIDIA GPUs: {self._reason(exc)}"
            self.close()
            return
        if count == 0:
            self.status = "no NVIDIA GPUs: the driver reports none"
        self._gpus = [self._open(index) for index in range(count)]

    def sample(self) -> list[GpuSample]:
        return [self._sample(gpu) for gpu in self._gpus]

    def close(self) -> None:
        self._gpus = []
        if self._initialised:
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except self._errors:
                pass

    def _reason(self, exc: Exception) -> str:
        code = getattr(exc, "value", None)
        for constant, reason in INIT_REASONS.items():
            if code is not None and code == getattr(self._nvml, constant, None):
                return reason
        return _error_text(exc)

    def _open(self, index: int) -> _Gpu:
        try:
            gpu = _Gpu(index, self._nvml.nvmlDeviceGetHandleByIndex(index))
        except self._errors as exc:
            return _Gpu(index, None, failed=GPU_LOST if self._is_lost(exc) else _error_text(exc))
        try:
            gpu.name = _text(self._query(gpu, "nvmlDeviceGetName")) or NAME_UNKNOWN
            if self._mig_enabled(gpu):
                gpu.name += MIG_SUFFIX
            gpu.uuid = _text(self._query(gpu, "nvmlDeviceGetUUID"))
            memory = self._memory(gpu)
            gpu.mem_total_bytes = None if memory is None else int(memory.total)
            gpu.capability = _capability(self._query(gpu, "nvmlDeviceGetCudaComputeCapability"))
        except _GpuLost:
            gpu.failed = GPU_LOST
        return gpu

    def _is_lost(self, exc: Exception) -> bool:
        lost: bool = getattr(exc, "value", None) == self._nvml.NVML_ERROR_GPU_IS_LOST
        return lost

    def _query(self, gpu: _Gpu, function: str, *args: Any, **kwargs: Any) -> Any:
        """One NVML call on one GPU: None when N/A (unsupported, or missing from old bindings)."""
        try:
            return self._call(gpu, function, *args, **kwargs)
        except _Missing:
            return None

    def _call(self, gpu: _Gpu, function: str, *args: Any, **kwargs: Any) -> Any:
        """One NVML call: None when N/A; raises _Missing when the bindings or the driver lack it."""
        fn = getattr(self._nvml, function, None)
        if fn is None:
            raise _Missing(function)
        try:
            return fn(gpu.handle, *args, **kwargs)
        except self._errors as exc:
            if self._is_lost(exc):
                raise _GpuLost from exc
            if self._is_missing(exc):
                raise _Missing(function) from exc
            return None
        except TypeError as exc:  # old bindings: no such keyword (e.g. version=)
            raise _Missing(function) from exc

    def _is_missing(self, exc: Exception) -> bool:
        return (self._mismatch is not None and isinstance(exc, self._mismatch)) or getattr(exc, "value", None) == getattr(
            self._nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", object()
        )

    def _first_working(self, gpu: _Gpu, family: str, calls: list[tuple[str, dict[str, Any]]]) -> Any:
        """The first of ``calls`` (newest first) that this driver and these bindings have; remembered per GPU (as nvitop does)."""
        start = gpu.working.get(family, 0)
        for position, (function, kwargs) in enumerate(calls[start:], start):
            try:
                value = self._call(gpu, function, **kwargs)
            except _Missing:
                continue
            gpu.working[family] = position
            return value
        return None

    def _memory(self, gpu: _Gpu) -> Any:
        """Memory info, v2 where it exists: v1's "used" counts the driver's reserved memory too."""
        version = getattr(self._nvml, "nvmlMemory_v2", None)
        calls = [("nvmlDeviceGetMemoryInfo", {"version": version})] if version is not None else []
        return self._first_working(gpu, "memory", [*calls, ("nvmlDeviceGetMemoryInfo", {})])

    def _mig_enabled(self, gpu: _Gpu) -> bool:
        mode = self._query(gpu, "nvmlDeviceGetMigMode")
        enabled = getattr(self._nvml, "NVML_DEVICE_MIG_ENABLE", 1)
        return isinstance(mode, (list, tuple)) and bool(mode) and mode[0] == enabled

    def _slow(self, gpu: _Gpu, key: str, fetch: Callable[[], Any]) -> Any:
        """A slow-changing field, fetched at most once per slow_ttl_s."""
        now = self._clock()
        cached = gpu.slow.get(key)
        if cached is not None and now - cached[0] < self.slow_ttl_s:
            return cached[1]
        value = fetch()
        gpu.slow[key] = (now, value)
        return value

    def _sample(self, gpu: _Gpu) -> GpuSample:
        if gpu.failed is None:
            try:
                return self._read(gpu)
            except _GpuLost:
                gpu.failed = GPU_LOST
        return GpuSample(index=gpu.index, name=gpu.name, failed=gpu.failed)

    def _read(self, gpu: _Gpu) -> GpuSample:
        utilization = self._query(gpu, "nvmlDeviceGetUtilizationRates")
        memory = self._memory(gpu)
        temp_c = self._query(gpu, "nvmlDeviceGetTemperature", self._nvml.NVML_TEMPERATURE_GPU)
        power_mw = self._query(gpu, "nvmlDeviceGetPowerUsage")
        power_limit_mw = self._slow(gpu, "power_limit_mw", lambda: self._power_limit_mw(gpu))
        fan_pct = self._slow(gpu, "fan_pct", lambda: self._query(gpu, "nvmlDeviceGetFanSpeed"))
        sm_clock_mhz = self._query(gpu, "nvmlDeviceGetClockInfo", self._nvml.NVML_CLOCK_SM)
        return GpuSample(
            index=gpu.index,
            name=gpu.name,
            uuid=gpu.uuid,
            util_pct=None if utilization is None else float(utilization.gpu),
            mem_used_bytes=None if memory is None else int(memory.used),
            mem_total_bytes=gpu.mem_total_bytes,
            temp_c=None if temp_c is None else float(temp_c),
            power_w=None if power_mw is None else power_mw / 1000,
            power_limit_w=None if power_limit_mw is None else power_limit_mw / 1000,
            fan_pct=None if fan_pct is None else float(fan_pct),
            sm_clock_mhz=None if sm_clock_mhz is None else int(sm_clock_mhz),
            processes=self._processes(gpu),
            compute_capability=gpu.capability,
        )

    def _power_limit_mw(self, gpu: _Gpu) -> int | None:
        limit_mw: int | None = self._query(gpu, "nvmlDeviceGetEnforcedPowerLimit")
        if limit_mw is None:
            limit_mw = self._query(gpu, "nvmlDeviceGetPowerManagementLimit")
        return limit_mw

    def _processes(self, gpu: _Gpu) -> list[GpuProcess]:
        """Compute and graphics processes merged by pid, with user and command from the host."""
        mem_by_pid: dict[int, int | None] = {}
        for kind in ("Compute", "Graphics"):
            function = f"nvmlDeviceGet{kind}RunningProcesses"
            for proc in self._first_working(gpu, kind, [(function + v, {}) for v in PROCESS_VERSIONS]) or []:
                used = getattr(proc, "usedGpuMemory", None)
                if mem_by_pid.get(proc.pid) is None:
                    mem_by_pid[proc.pid] = None if used is None or used == NOT_AVAILABLE_BYTES else int(used)
        return [_host_process(pid, used) for pid, used in sorted(mem_by_pid.items())]
