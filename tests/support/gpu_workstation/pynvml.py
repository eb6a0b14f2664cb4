"""A stand-in pynvml for running the suite as if on a GPU workstation (CETLAB_TEST_AS_GPU_WORKSTATION=1, see
tests/conftest.py): the NVML interface of nvidia-ml-py answering for one GPU, the lab's workstation card (RTX 3050,
8 GiB, compute capability 8.6). SIMULATED: nothing here touches a driver, so the figures are fixed.

The real module's constants, error classes and structs are kept (tests and agents compare against them); only the
calls the agents make are answered here. It is found first on sys.path and PYTHONPATH, so the test process and every
process it starts (agents, `cetlab-agent doctor`, benches) see the same GPU."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import SimpleNamespace
from typing import Any

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec("pynvml", [p for p in sys.path if os.path.abspath(p or ".") != _here])
if _spec is None or _spec.loader is None:
    raise ImportError("the GPU workstation stand-in wraps nvidia-ml-py, which is not installed")
# loaded under a name of its own: the module adds its error classes to sys.modules[__name__] as it loads
_spec = importlib.util.spec_from_file_location("_real_pynvml", _spec.origin)
assert _spec is not None and _spec.loader is not None
_real = importlib.util.module_from_spec(_spec)
sys.modules["_real_pynvml"] = _real
_spec.loader.exec_module(_real)
# everything but its calls into the driver (constants such as nvmlMemory_v2 and the struct types stay)
globals().update({k: v for k, v in vars(_real).items() if not k.startswith("__") and not (k.startswith("nvml") and callable(v))})
NVMLError = _real.NVMLError

GIB = 1024**3
DEVICE = {
    "name": "NVIDIA GeForce RTX 3050",
    "uuid": "GPU-5ae1c0de-3050-4a11-8c37-000000000000",
    "cc": (8, 6),
    "mem_total": 8 * GIB,
    "mem_used": 512 * 1024**2,
    "util": 3,
    "temp": 41,
    "power_mw": 14_000,
    "limit_mw": 130_000,
    "fan": 30,
    "sm_clock": 1777,
}
DRIVER = "550.54.15"
_initialised = 0


def _handle(h: Any) -> None:
    if h != 0:
        raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
    if not _initialised:
        raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)


def nvmlInit() -> None:
    global _initialised
    _initialised += 1


def nvmlInitWithFlags(flags: int) -> None:
    nvmlInit()


def nvmlShutdown() -> None:
    global _initialised
    if not _initialised:
        raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)
    _initialised -= 1


def nvmlSystemGetDriverVersion() -> str:
    return DRIVER


def nvmlDeviceGetCount() -> int:
    return 1


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    _handle(index)
    return index


def nvmlDeviceGetName(h: int) -> str:
    _handle(h)
    return str(DEVICE["name"])


def nvmlDeviceGetUUID(h: int) -> str:
    _handle(h)
    return str(DEVICE["uuid"])


def nvmlDeviceGetCudaComputeCapability(h: int) -> tuple[int, int]:
    _handle(h)
    return DEVICE["cc"]


def nvmlDeviceGetUtilizationRates(h: int) -> SimpleNamespace:
    _handle(h)
    return SimpleNamespace(gpu=DEVICE["util"], memory=1)


def nvmlDeviceGetMemoryInfo(h: int, version: Any = None) -> SimpleNamespace:
    _handle(h)
    total, used = int(DEVICE["mem_total"]), int(DEVICE["mem_used"])
    return SimpleNamespace(total=total, used=used, free=total - used, reserved=0)


def nvmlDeviceGetTemperature(h: int, sensor: int) -> int:
    _handle(h)
    return int(DEVICE["temp"])


def nvmlDeviceGetPowerUsage(h: int) -> int:
    _handle(h)
    return int(DEVICE["power_mw"])


def nvmlDeviceGetEnforcedPowerLimit(h: int) -> int:
    _handle(h)
    return int(DEVICE["limit_mw"])


nvmlDeviceGetPowerManagementLimit = nvmlDeviceGetEnforcedPowerLimit


def nvmlDeviceGetFanSpeed(h: int) -> int:
    _handle(h)
    return int(DEVICE["fan"])


def nvmlDeviceGetClockInfo(h: int, clock_type: int) -> int:
    _handle(h)
    return int(DEVICE["sm_clock"])


def nvmlDeviceGetMigMode(h: int) -> list[int]:
    _handle(h)
    return [0, 0]


def nvmlDeviceGetComputeRunningProcesses(h: int) -> list[SimpleNamespace]:
    _handle(h)
    return []  # the engines and trainers the suite starts run on the CPU: none of them is on this GPU


nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses
nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses
nvmlDeviceGetGraphicsRunningProcesses = nvmlDeviceGetComputeRunningProcesses
nvmlDeviceGetGraphicsRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses
nvmlDeviceGetGraphicsRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses
