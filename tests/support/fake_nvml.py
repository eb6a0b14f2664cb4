"""What tests/e2e/gpusupport/test_gpu_support.py, tests/fast/gpusupport/test_gpu_support.py,
tests/fast/shell/test_faults.py, tests/fast/telemetry/test_nvml_sampler.py share: GiB, MIRRORED, gpu, FakeNvml."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pynvml

GiB = 1024**3


# Taken from the installed nvidia-ml-py so the stand-in raises exactly what the real one raises.
MIRRORED = (
    "NVMLError",
    "NVMLError_NotSupported",
    "NVMLError_GpuIsLost",
    "NVMLError_LibraryNotFound",
    "NVMLLibraryMismatchError",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_TEMPERATURE_GPU",
    "NVML_CLOCK_SM",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
)


def gpu(name: str | bytes = "NVIDIA H100 80GB HBM3", **fields: Any) -> dict[str, Any]:
    """One fake GPU's answers; a value that is an exception is raised by its query instead."""
    return {
        "name": name,
        "uuid": f"GPU-{name!s}",
        "util": 37,
        "mem_used": 20 * GiB,
        "mem_total": 80 * GiB,
        "temp": 61,
        "power_mw": 312_500,
        "enforced_limit_mw": 700_000,
        "management_limit_mw": 650_000,
        "fan": 42,
        "sm_clock": 1980,
        "compute": [],
        "graphics": [],
        **fields,
    }


class FakeNvml:
    """Stands in for the pynvml module; counts every device query as (field, GPU index)."""

    def __init__(self, *gpus: dict[str, Any], init_error: Exception | None = None):
        self.gpus = list(gpus)
        self.init_error = init_error
        self.calls: Counter[tuple[str, int]] = Counter()
        self.shutdowns = 0
        self.shutdown_error: Exception | None = None

    def _get(self, index: int, key: str) -> Any:
        self.calls[key, index] += 1
        value = self.gpus[index][key]
        if isinstance(value, BaseException):
            raise value
        return value

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1
        if self.shutdown_error is not None:
            raise self.shutdown_error

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self.gpus[index].setdefault("handle", index)
        return self._get(index, "handle")

    def nvmlDeviceGetName(self, h: int) -> str | bytes:
        return self._get(h, "name")

    def nvmlDeviceGetUUID(self, h: int) -> str | bytes:
        return self._get(h, "uuid")

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._get(h, "util"), memory=5)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        total, used = self._get(h, "mem_total"), self._get(h, "mem_used")
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._get(h, "temp")

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._get(h, "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return self._get(h, "enforced_limit_mw")

    def nvmlDeviceGetPowerManagementLimit(self, h: int) -> int:
        return self._get(h, "management_limit_mw")

    def nvmlDeviceGetFanSpeed(self, h: int) -> int:
        return self._get(h, "fan")

    def nvmlDeviceGetClockInfo(self, h: int, clock_type: int) -> int:
        assert clock_type == pynvml.NVML_CLOCK_SM
        return self._get(h, "sm_clock")

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in self._get(h, "compute")]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in self._get(h, "graphics")]


for _name in MIRRORED:
    setattr(FakeNvml, _name, getattr(pynvml, _name))
