"""NvmlSampler against a stand-in pynvml: the real module's error classes and constants, fake devices."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from typing import Any

import psutil
import pynvml
import pytest

from agents.telemetry.nvml import COMMAND_MAX_CHARS, GPU_LOST, NvmlSampler
from agents.wire.protocol import GpuProcess, GpuSample
from tests.support.fake_nvml import FakeNvml, GiB, gpu

NOT_AVAILABLE_BYTES = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def vanished_pid() -> int:
    return next(pid for pid in range(4_000_000, 3_000_000, -1) if not psutil.pid_exists(pid))


def test_two_healthy_gpus_report_in_protocol_units():
    nvml = FakeNvml(gpu(), gpu("NVIDIA A100-SXM4-40GB", util=0, mem_used=0, mem_total=40 * GiB, fan=0))
    sampler = NvmlSampler(nvml)

    assert sampler.status is None
    assert sampler.sample() == [
        GpuSample(
            index=0,
            name="NVIDIA H100 80GB HBM3",
            uuid="GPU-NVIDIA H100 80GB HBM3",
            util_pct=37.0,
            mem_used_bytes=20 * GiB,
            mem_total_bytes=80 * GiB,
            temp_c=61.0,
            power_w=312.5,
            power_limit_w=700.0,
            fan_pct=42.0,
            sm_clock_mhz=1980,
        ),
        GpuSample(
            index=1,
            name="NVIDIA A100-SXM4-40GB",
            uuid="GPU-NVIDIA A100-SXM4-40GB",
            util_pct=0.0,
            mem_used_bytes=0,
            mem_total_bytes=40 * GiB,
            temp_c=61.0,
            power_w=312.5,
            power_limit_w=700.0,
            fan_pct=0.0,
            sm_clock_mhz=1980,
        ),
    ]


def test_handles_names_and_memory_total_are_fetched_once():
    nvml = FakeNvml(gpu())
    sampler = NvmlSampler(nvml)
    nvml.gpus[0]["mem_total"] = 1
    samples = [sampler.sample()[0] for _ in range(3)]

    assert nvml.calls["handle", 0] == nvml.calls["name", 0] == nvml.calls["uuid", 0] == 1
    assert [s.mem_total_bytes for s in samples] == [80 * GiB] * 3
    assert nvml.calls["util", 0] == 3


def test_old_bindings_returning_bytes_give_str():
    sample = NvmlSampler(FakeNvml(gpu(b"Tesla V100-SXM2-16GB", uuid=b"GPU-5e1f"))).sample()[0]

    assert (sample.name, sample.uuid) == ("Tesla V100-SXM2-16GB", "GPU-5e1f")


def test_unsupported_fields_are_none_and_the_rest_report():
    not_supported = pynvml.NVMLError_NotSupported()
    nvml = FakeNvml(gpu("GeForce GTX 1080", fan=not_supported, temp=pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)))
    sample = NvmlSampler(nvml).sample()[0]

    assert sample.fan_pct is None and sample.temp_c is None
    assert (sample.util_pct, sample.power_w, sample.sm_clock_mhz) == (37.0, 312.5, 1980)
    assert sample.failed is None


@pytest.mark.parametrize("enforced_missing", [False, True], ids=["not-supported", "old-bindings"])
def test_power_limit_falls_back_to_the_management_limit(monkeypatch, enforced_missing):
    if enforced_missing:
        monkeypatch.delattr(FakeNvml, "nvmlDeviceGetEnforcedPowerLimit")
    nvml = FakeNvml(gpu(enforced_limit_mw=pynvml.NVMLError_NotSupported()))

    assert NvmlSampler(nvml).sample()[0].power_limit_w == 650.0


@pytest.mark.parametrize("lost_on", ["uuid", "temp", "compute"])
def test_a_lost_gpu_is_marked_failed_and_never_queried_again(lost_on):
    nvml = FakeNvml(gpu(), gpu("NVIDIA A100-SXM4-40GB", **{lost_on: pynvml.NVMLError_GpuIsLost()}))
    sampler = NvmlSampler(nvml)

    first = sampler.sample()
    calls_on_lost_gpu = {key: n for key, n in nvml.calls.items() if key[1] == 1}
    nvml.gpus[0]["util"] = 99
    second = sampler.sample()

    lost = GpuSample(index=1, name="NVIDIA A100-SXM4-40GB", failed=GPU_LOST)
    assert first[1] == second[1] == lost
    assert (first[0].util_pct, second[0].util_pct) == (37.0, 99.0)
    assert second[0].failed is None and second[0].power_w == 312.5
    assert {key: n for key, n in nvml.calls.items() if key[1] == 1} == calls_on_lost_gpu


def test_a_gpu_without_a_handle_is_failed_and_the_others_report():
    nvml = FakeNvml(gpu(), gpu(handle=pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)))
    samples = NvmlSampler(nvml).sample()

    assert samples[0].util_pct == 37.0
    assert samples[1] == GpuSample(index=1, name="N/A", failed="Insufficient Permissions")


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML library not found (is the NVIDIA driver installed?)"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVIDIA driver not loaded"),
        (pynvml.NVML_ERROR_UNKNOWN, "Unknown Error"),
    ],
)
def test_init_failure_sets_status_and_samples_nothing(code, reason):
    nvml = FakeNvml(gpu(), init_error=pynvml.NVMLError(code))
    sampler = NvmlSampler(nvml)

    assert sampler.status == f"no NVIDIA GPUs: {reason}"
    assert sampler.sample() == []
    sampler.close()
    assert nvml.shutdowns == 0


def test_library_not_found_class_at_init():
    sampler = NvmlSampler(FakeNvml(gpu(), init_error=pynvml.NVMLError_LibraryNotFound()))

    assert sampler.status == "no NVIDIA GPUs: NVML library not found (is the NVIDIA driver installed?)"
    assert sampler.sample() == []


def test_missing_pynvml_sets_status(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    sampler = NvmlSampler()

    assert sampler.status is not None
    assert sampler.status.startswith("no NVIDIA GPUs: nvidia-ml-py is not installed")
    assert sampler.sample() == []
    sampler.close()


def test_no_gpus_sets_status():
    sampler = NvmlSampler(FakeNvml())

    assert sampler.status == "no NVIDIA GPUs: the driver reports none"
    assert sampler.sample() == []


def test_fan_and_power_limit_are_cached_for_the_ttl():
    clock = Clock()
    nvml = FakeNvml(gpu())
    sampler = NvmlSampler(nvml, slow_ttl_s=10.0, clock=clock)

    sampler.sample()
    nvml.gpus[0].update(fan=80, enforced_limit_mw=400_000)
    clock.now += 9.9
    cached = sampler.sample()[0]
    clock.now += 0.1
    fresh = sampler.sample()[0]

    assert (cached.fan_pct, cached.power_limit_w) == (42.0, 700.0)
    assert (fresh.fan_pct, fresh.power_limit_w) == (80.0, 400.0)
    assert nvml.calls["fan", 0] == nvml.calls["enforced_limit_mw", 0] == 2
    assert nvml.calls["util", 0] == 3


def test_processes_are_merged_by_pid_with_host_user_and_command():
    me, gone = os.getpid(), vanished_pid()
    nvml = FakeNvml(gpu(compute=[(gone, NOT_AVAILABLE_BYTES), (me, 3 * GiB)], graphics=[(me, None), (gone, None)]))
    processes = NvmlSampler(nvml).sample()[0].processes

    own = psutil.Process(me)
    command = " ".join(own.cmdline())[:COMMAND_MAX_CHARS]
    assert command
    assert {p.pid: p for p in processes} == {
        me: GpuProcess(pid=me, user=own.username(), command=command, mem_used_bytes=3 * GiB),
        gone: GpuProcess(pid=gone),
    }
    assert [p.pid for p in processes] == sorted([me, gone])


def test_process_command_is_truncated_and_access_denied_is_none(monkeypatch):
    def denied(self):
        raise psutil.AccessDenied(self.pid)

    monkeypatch.setattr(psutil.Process, "username", denied)
    monkeypatch.setattr(psutil.Process, "cmdline", lambda self: ["python", "x" * 500])
    process = NvmlSampler(FakeNvml(gpu(compute=[(os.getpid(), GiB)]))).sample()[0].processes[0]

    assert process.user is None
    assert process.command == ("python " + "x" * 500)[:COMMAND_MAX_CHARS]
    assert len(process.command) == COMMAND_MAX_CHARS


def test_close_shuts_nvml_down_once_and_never_raises():
    nvml = FakeNvml(gpu())
    sampler = NvmlSampler(nvml)
    nvml.shutdown_error = pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    sampler.close()
    sampler.close()

    assert nvml.shutdowns == 1
    assert sampler.sample() == []


# ---------------------------------------------------------------------------- older drivers and bindings, MIG

FUNCTION_NOT_FOUND = pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


class OldDriverNvml(FakeNvml):
    """nvidia-ml-py 13 on a driver without the _v3 process calls: _v3 is not found, the unversioned call is a mismatch."""

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h: int) -> list[SimpleNamespace]:
        self.calls["compute_v3", h] += 1
        raise FUNCTION_NOT_FOUND

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h: int) -> list[SimpleNamespace]:
        return FakeNvml.nvmlDeviceGetComputeRunningProcesses(self, h)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        raise pynvml.NVMLLibraryMismatchError(
            "Unversioned function called and the pyNVML version does not match the NVML lib version."
        )

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, h: int) -> list[SimpleNamespace]:
        raise FUNCTION_NOT_FOUND

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, h: int) -> list[SimpleNamespace]:
        return FakeNvml.nvmlDeviceGetGraphicsRunningProcesses(self, h)

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called")


def test_process_lists_fall_back_to_v2_on_an_older_driver():
    me = os.getpid()
    nvml = OldDriverNvml(gpu(compute=[(me, 2 * GiB)]))
    sampler = NvmlSampler(nvml)
    first, second = sampler.sample()[0], sampler.sample()[0]

    assert [(p.pid, p.mem_used_bytes) for p in first.processes] == [(me, 2 * GiB)]
    assert second.processes == first.processes
    assert nvml.calls["compute_v3", 0] == 1  # the version that works is remembered


def test_process_lists_from_old_bindings_with_only_the_v1_call():
    me = os.getpid()
    nvml = FakeNvml(gpu(compute=[(me, GiB)]))  # FakeNvml has no _v2/_v3 attributes at all: old bindings
    assert not hasattr(nvml, "nvmlDeviceGetComputeRunningProcesses_v3")

    assert [(p.pid, p.mem_used_bytes) for p in NvmlSampler(nvml).sample()[0].processes] == [(me, GiB)]


class MemoryV2Nvml(FakeNvml):
    """Bindings with nvmlMemory_v2: v1's "used" includes the driver's reserved memory, v2's does not."""

    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    reserved = 512 * 1024**2

    def __init__(self, *gpus: dict[str, Any], driver_has_v2: bool = True):
        super().__init__(*gpus)
        self.driver_has_v2 = driver_has_v2

    def nvmlDeviceGetMemoryInfo(self, h: int, version: int | None = None) -> SimpleNamespace:
        total, used = self._get(h, "mem_total"), self._get(h, "mem_used")
        if version is None:
            return SimpleNamespace(total=total, used=used + self.reserved, free=total - used - self.reserved)
        assert version == pynvml.nvmlMemory_v2
        if not self.driver_has_v2:
            raise FUNCTION_NOT_FOUND
        return SimpleNamespace(total=total, used=used, reserved=self.reserved, free=total - used - self.reserved)


@pytest.mark.parametrize(("driver_has_v2", "expected_used"), [(True, 20 * GiB), (False, 20 * GiB + MemoryV2Nvml.reserved)])
def test_memory_reads_v2_where_the_driver_has_it(driver_has_v2, expected_used):
    sample = NvmlSampler(MemoryV2Nvml(gpu(), driver_has_v2=driver_has_v2)).sample()[0]

    assert sample.mem_used_bytes == expected_used and sample.mem_total_bytes == 80 * GiB


class MigNvml(FakeNvml):
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        return self._get(h, "mig")


def test_a_mig_gpu_is_shown_as_such_and_never_crashes():
    no_permission = pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
    nvml = MigNvml(
        gpu(
            "NVIDIA A100-SXM4-40GB",
            mig=[1, 1],
            util=pynvml.NVMLError_NotSupported(),
            compute=no_permission,
            graphics=no_permission,
        ),
        gpu("NVIDIA A100-SXM4-40GB", mig=pynvml.NVMLError_NotSupported()),
    )
    mig, plain = NvmlSampler(nvml).sample()

    assert mig.name == "NVIDIA A100-SXM4-40GB (MIG)" and mig.failed is None
    assert mig.util_pct is None and mig.processes == [] and mig.mem_used_bytes == 20 * GiB
    assert plain.name == "NVIDIA A100-SXM4-40GB" and plain.util_pct == 37.0
