"""What each GPU can run (issue 19 item 4): compute capabilities, the stacks' kernels, the matrix, refusals before a launch, doctor."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agents.runtime.torch_probe import TorchReader
from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from agents.wire.protocol import ErrorCode, GpuSample, RemoteError
from agents.wire.sections.gpu_support import StackKind
from console.lab.client import FleetClient
from tests.support.gpu_support import CC
from tests.support.lab import REPO
from tests.support.waits import wait_for

PY = sys.executable


CUDA13 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]  # PyTorch's CUDA 13 wheels from the package index


# ---------------------------------------------------------------------------- the real torch, read in a subprocess


def test_reads_the_installed_torch_arch_list_in_a_subprocess():
    import torch

    reader = TorchReader()
    stack = reader.stack(PY)
    assert stack.version == torch.__version__ and stack.cuda == torch.version.cuda
    assert stack.archs == torch.cuda.get_arch_list()
    assert stack.cpu_build is (torch.version.cuda is None)
    assert stack.source.startswith(PY) and not stack.simulated and stack.problem is None
    reader.stack(PY)
    assert reader.probes == 1  # cached until something is installed into that Python


def test_a_python_without_torch_or_a_hanging_one_is_a_problem_not_a_crash(tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(venv)], check=True)
    stack = TorchReader().stack(str(venv / "bin" / "python"))
    assert stack.problem is not None and "No module named 'torch'" in stack.problem
    slow = tmp_path / "python-slow"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    assert "took over 1 s" in (TorchReader(timeout_s=1).stack(str(slow)).problem or "")


# ---------------------------------------------------------------------------- a real agent refuses before launching


CUDA13_TORCH_SIM = {"version": "2.13.0+cu130", "cuda": "13.0", "archs": CUDA13}


def refusing_lab(root: Path) -> Path:
    """m5 pretends (SIM) that its trainers' torch is a CUDA 13 build: a V100 and a P40 it has no kernels for; the workstation's 3050 it has."""
    models = root / "models"
    (models / "llama-8b").mkdir(parents=True)
    stacks = {"torch": CUDA13_TORCH_SIM}
    data = {
        "lab": "support-test",
        "machines": [
            {
                "name": "m5",
                "gpus": {
                    "sim": [
                        {"name": "Tesla V100", "memory_gib": 32, "tdp_w": 250},
                        {"name": "Tesla P40", "memory_gib": 24, "tdp_w": 250},
                    ],
                    "stacks": stacks,
                },
            },
            {
                "name": "workstation",
                "gpus": {"sim": [{"name": "NVIDIA GeForce RTX 3050", "memory_gib": 8, "tdp_w": 130}], "stacks": stacks},
            },
        ],
        "models": [
            {
                "name": "llama-8b-vllm",
                "path": str(models / "llama-8b"),
                "engine": "vllm",
                "machine": "m5",
                "gpus": [1],
                "vram_gib": 16,
            },
            {
                "name": "llama-8b-sim",
                "path": str(models / "llama-8b"),
                "engine": "sim",
                "machine": "m5",
                "gpus": [0],
                "vram_gib": 16,
                "sim": {"load_s": 0, "warmup_s": 0, "wake_s": 0, "cold_factor": 1},
            },
        ],
        "trainers": [
            {
                "name": "on-p40",
                "machine": "m5",
                "gpus": [1],
                "command": [PY, "-c", "print('trained')"],
                "output_dir": "runs/{job_id}",
            },
            {
                "name": "on-3050",
                "machine": "workstation",
                "gpus": [0],
                "command": [PY, "-c", "print('trained')"],
                "output_dir": "runs/{job_id}",
            },
        ],
    }
    path = root / "lab.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def refusing(tmp_path_factory):
    root = tmp_path_factory.mktemp("support")
    with DemoLab(root / "run", source=refusing_lab(root)) as demo:
        yield demo


async def connect(demo: DemoLab) -> FleetClient:
    client = FleetClient(load_lab(demo.lab_path))
    await client.start()
    await client.wait_connected(15)
    return client


async def test_a_job_on_a_gpu_its_torch_cannot_run_is_refused_with_the_fix(refusing):
    client = await connect(refusing)
    try:
        with pytest.raises(RemoteError) as info:
            await client.call("m5", "jobs.start", {"recipe": "on-p40"})
        error = info.value
        assert error.code == ErrorCode.UNAVAILABLE
        assert error.message.startswith(
            "recipe on-p40 refused: m5 GPU 1 is a Tesla P40 (sm_61, SIM); this torch 2.13 build (CUDA 13.0) "
            "has kernels for sm_75 and newer; install PyTorch 2.14 from PyTorch's CUDA 12.6 wheel index"
        )
        assert error.data and error.data["gpu_support"]["runs"] is False and error.data["gpu_support"]["simulated"] is True
        assert (await client.call("m5", "jobs.list", {})) == []  # refused before anything was launched
        job = await client.call("workstation", "jobs.start", {"recipe": "on-3050"})  # the same torch has sm_86 kernels: it runs
        assert job["state"] in ("starting", "running", "exited")
    finally:
        await client.stop()


async def test_a_model_whose_engine_cannot_run_on_its_gpu_is_refused_and_the_sim_engine_is_not(refusing):
    client = await connect(refusing)
    try:
        with pytest.raises(RemoteError) as info:
            await client.call("m5", "models.warm", {"model": "llama-8b-vllm"})
        assert info.value.message == (
            "model llama-8b-vllm (engine vllm) refused: m5 GPU 1 is a Tesla P40 (sm_61, SIM); vLLM 0.33 needs compute "
            "capability 7.0 or newer; serve this model with engine llamacpp (GGUF)"
        )
        models = (await client.call("m5", "status"))["models"]["models"]
        assert next(m for m in models if m["name"] == "llama-8b-vllm")["state"] == "cold"
        await client.call("m5", "models.warm", {"model": "llama-8b-sim"})  # the sim engine needs no GPU
        await wait_for(
            lambda: (
                client.state.machines["m5"].model_list
                and any(m.name == "llama-8b-sim" and m.state == "warm" for m in client.state.machines["m5"].model_list)
            ),
            60,
        )
    finally:
        await client.stop()


async def test_the_matrix_reaches_the_console_typed(refusing):
    client = await connect(refusing)
    try:
        view = client.state.machines["m5"]
        await wait_for(lambda: view.gpu_support is not None and view.gpu_support.verdicts, 15)
        assert view.gpus[1].compute_capability == CC["P40"] and view.gpus[1].simulated
        rows = {(v.gpu, v.stack): v for v in view.gpu_support.verdicts}
        assert (
            rows[(1, "trainer torch")].runs is False
            and rows[(1, "vLLM")].runs is False
            and rows[(1, "llama-server")].runs is True
        )
        assert rows[(0, "vLLM")].runs is False  # a V100 is 7.0, but the default sim vLLM's torch is a CUDA 13 build
        assert all(s.simulated for s in view.gpu_support.stacks)
        answer = await client.call("m5", "gpus.support")
        assert answer["verdicts"][0]["machine"] == "m5"
    finally:
        await client.stop()


def test_the_cli_says_why_and_the_fix(refusing):
    done = subprocess.run(
        [str(Path(PY).with_name("cetlab")), "--lab", str(refusing.lab_path), "train", "on-p40"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode != 0
    assert (
        "m5 GPU 1 is a Tesla P40 (sm_61, SIM)" in done.stderr + done.stdout
        and "CUDA 12.6 wheel index" in done.stderr + done.stdout
    )
    status = subprocess.run(
        [str(Path(PY).with_name("cetlab")), "--lab", str(refusing.lab_path), "--json", "status"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )
    machine = next(m for m in json.loads(status.stdout)["machines"] if m["name"] == "m5")
    assert machine["gpus"][1]["compute_capability"] == {"major": 6, "minor": 1}
    support = {(v["gpu"], v["stack"]): v for v in machine["gpu_support"]["verdicts"]}
    assert support[(1, "vLLM")]["runs"] is False and "engine llamacpp" in support[(1, "vLLM")]["fix"]


# ---------------------------------------------------------------------------- doctor


def agent_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "agents.shell.daemon", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )


def test_doctor_runs_before_lab_yaml_exists(tmp_path):
    """A new machine, pre-flighted: NVML, torch and its CUDA kernels, disk; no lab.yaml needed (issue 23 item 14)."""
    done = agent_cli("doctor", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr  # here: no driver (a WARN before a lab says gpus: nvml), a CPU torch
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["lab.yaml"]["level"] == "WARN" and "not found" in checks["lab.yaml"]["message"]
    assert {"gpus", "torch", "disk", "time sync"} <= set(checks)
    assert "NVML" in checks["gpus"]["message"] or "NVIDIA" in checks["gpus"]["message"]


def test_doctor_prints_the_matrix_per_gpu_and_fails_what_lab_yaml_places_where_it_cannot_run(tmp_path):
    lab = refusing_lab(tmp_path)
    done = agent_cli("doctor", "--lab", str(lab), "--machine", "m5", "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 1, done.stdout
    lines = done.stdout.splitlines()
    assert any(
        line.startswith("OK")
        and "gpu 1 support" in line
        and "Tesla P40 (sm_61, SIM): trainer torch no, vLLM no, llama-server yes" in line
        for line in lines
    ), done.stdout
    fail = next(line for line in lines if line.startswith("FAIL") and "gpu 1 vLLM" in line)
    assert "model llama-8b-vllm: m5 GPU 1 is a Tesla P40 (sm_61, SIM); vLLM 0.33 needs compute capability 7.0" in fail
    torch_fail = next(line for line in lines if line.startswith("FAIL") and "gpu 1 trainer torch" in line)
    assert "trainer on-p40:" in torch_fail and "CUDA 12.6 wheel index" in torch_fail
    assert any(line.startswith("WARN") and "gpu 0 trainer torch" in line for line in lines)  # nothing is placed on GPU 0's torch


def test_doctor_on_a_demo_without_state_dir_checks_the_demos_agent(small_demo):
    done = agent_cli("doctor", "--lab", str(small_demo.lab_path), "--machine", "box", "--json")
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["host key"]["level"] == "OK" and str(small_demo.dir / "agents" / "box") in checks["host key"]["message"]
    assert checks["authorized keys"]["level"] == "OK"
    assert done.returncode == 0, done.stdout


# ---------------------------------------------------------------------------- the console


async def test_the_machine_detail_shows_which_stacks_each_gpu_runs(refusing):
    from textual.widgets import Static

    from console.tui.app import CetlabApp
    from console.tui.screens.fleet import FleetScreen
    from console.tui.screens.machine import MachineScreen
    from tests.support.waits import until_drawn
    from widgets.gpu_panel import GpuPanel

    app = CetlabApp(load_lab(refusing.lab_path))
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_for(lambda: app.state.machines["m5"].gpu_support is not None, 30)
        await until_drawn(pilot, FleetScreen)
        await pilot.press("enter")  # m5, the first card
        await until_drawn(pilot, MachineScreen)

        def support_text() -> str:
            panel = app.screen.query_one("#gpu-1", GpuPanel)
            return str(panel.query_one(".extra", Static).render())

        text = await wait_for(lambda: "not: vLLM" in support_text() and support_text())
        assert "compute 6.1" in text and "runs: llama-server" in text
        assert "not: trainer torch (this torch 2.13 build (CUDA 13.0) has kernels for sm_75 and newer)" in text
        assert "not: vLLM (vLLM 0.33 needs compute capability 7.0 or newer)" in text


# ---------------------------------------------------------------------------- a real-GPU machine (NVML answers faked), the installed torch


async def test_on_nvml_gpus_the_installed_torch_is_judged_and_a_cpu_build_refused(tmp_path):
    """The real path: NVML's capability (a fake driver's answers) against this Python's torch read in a subprocess (a CPU build here)."""
    import torch

    from agents.gpusupport.component import GpuSupportComponent
    from agents.jobs.component import JobsComponent
    from agents.runtime.store import Store
    from agents.shell.agent import Agent
    from agents.telemetry.nvml import NvmlSampler
    from agents.wire.lab.model import parse_lab
    from tests.support.fake_nvml import FakeNvml, gpu

    class WithCapability(FakeNvml):
        def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
            return self._get(h, "cc")

    lab = parse_lab(
        yaml.safe_dump(
            {
                "lab": "real",
                "machines": [{"name": "box", "gpus": "nvml"}],
                "trainers": [
                    {
                        "name": "train",
                        "machine": "box",
                        "gpus": [0],
                        "command": [PY, "-c", "print(1)"],
                        "output_dir": str(tmp_path / "runs/{job_id}"),
                    },
                    {
                        "name": "not-python",
                        "machine": "box",
                        "gpus": [0],
                        "command": ["true"],
                        "output_dir": str(tmp_path / "runs/{job_id}"),
                    },
                ],
            }
        )
    )
    agent = Agent(
        lab,
        "box",
        tmp_path / "state",
        gpu_sampler=NvmlSampler(nvml_module=WithCapability(gpu("Tesla V100-SXM2-32GB", cc=(7, 0)))),
        components=lambda core: [GpuSupportComponent(core), JobsComponent(core)],
    )
    support, jobs = agent.find(GpuSupportComponent), agent.find(JobsComponent)
    assert support is not None and jobs is not None
    (tmp_path / "state").mkdir()
    agent.store = Store(tmp_path / "state" / "state.db")
    try:
        await agent.start_components()
        agent.tick()
        await wait_for(lambda: support.section().stacks, 120)  # read in a thread at start
        section = support.section()
        torch_row = next(v for v in section.verdicts if v.stack == "trainer torch")
        assert not section.simulated and not torch_row.simulated and torch_row.capability == CC["V100"]
        if torch.version.cuda is None:  # CI and this machine: a CPU build on a (faked) GPU is refused with the fix
            assert torch_row.runs is False and "is a CPU build" in torch_row.reason
            with pytest.raises(RemoteError) as info:
                jobs.start_job("train", {})
            assert info.value.message.startswith("recipe train refused: box GPU 0 is a Tesla V100-SXM2-32GB (sm_70); this torch ")
            assert f"{PY} -m pip install 'torch==2.14.*' --index-url https://download.pytorch.org/whl/cu126" in info.value.message
        else:  # a developer's GPU workstation: what its torch really has
            from agents.gpusupport.matrix import has_kernels

            assert torch_row.runs is has_kernels(torch.cuda.get_arch_list(), CC["V100"])
        assert jobs.start_job("not-python", {}).state  # a program that is not Python: its torch is not known, nothing refused
    finally:
        for component in reversed(agent.components):
            await component.stop()
        agent.store.close()


# ---------------------------------------------------------------------------- a trainer Python that never answers (issue 30 R4)


def hanging_python(tmp_path: Path) -> Path:
    """A trainer "python" whose torch probe waits on a FIFO nobody ever writes; run as the trainer, it exits at once."""
    fifo = tmp_path / "never-written"
    import os

    os.mkfifo(fifo)
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\ncase "$2" in *get_arch_list*) read line < {fifo} ;; esac\nexit 0\n')
    python.chmod(0o755)
    return python


async def test_a_trainer_python_that_hangs_stalls_no_tick_and_its_stack_is_unknown(tmp_path):
    """R4: the support check reads a trainer's torch off the event loop with a timeout; a launch meanwhile waits on no
    subprocess, the agent's ticks keep coming at 1 Hz, and past the timeout the trainer's torch is unknown, not refused."""
    from agents.gpusupport.component import GpuSupportComponent
    from agents.jobs.component import JobsComponent
    from agents.shell.agent import Agent
    from agents.telemetry.nvml import NvmlSampler
    from agents.wire.lab.model import parse_lab
    from tests.support.fake_nvml import FakeNvml, gpu

    class WithCapability(FakeNvml):
        def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
            return self._get(h, "cc")

    python = hanging_python(tmp_path)
    lab = parse_lab(
        yaml.safe_dump(
            {
                "lab": "real",
                "machines": [{"name": "box", "gpus": "nvml", "sample_interval_s": 1.0}],
                "trainers": [
                    {
                        "name": "train",
                        "machine": "box",
                        "gpus": [0],
                        "command": [str(python), "-c", "print(1)"],
                        "output_dir": str(tmp_path / "runs/{job_id}"),
                    }
                ],
            }
        )
    )
    reader = TorchReader(timeout_s=4)
    agent = Agent(
        lab,
        "box",
        tmp_path / "state",
        gpu_sampler=NvmlSampler(nvml_module=WithCapability(gpu("Tesla V100-SXM2-32GB", cc=(7, 0)))),
        components=lambda core: [GpuSupportComponent(core, reader), JobsComponent(core)],
    )
    agent.serves_tcp = False
    tick_at: list[float] = []  # when each of the agent's own 1 Hz ticks came
    one_tick = agent.tick

    def noted_tick(gpus: list[GpuSample] | None = None) -> None:
        tick_at.append(time.monotonic())
        one_tick(gpus)

    agent.tick = noted_tick  # type: ignore[method-assign]
    support, jobs = agent.find(GpuSupportComponent), agent.find(JobsComponent)
    assert support is not None and jobs is not None
    await agent.start()
    try:
        await wait_for(lambda: len(tick_at) >= 2, 20)
        job = jobs.start_job("train", {})  # its Python is being read: the launch goes on unchecked, the loop never waits
        assert job.state
        await wait_for(lambda: len(tick_at) >= 4, 20)
        assert max(b - a for a, b in zip(tick_at, tick_at[1:])) < 2.0, tick_at
        await wait_for(lambda: support.section().stacks, 30)  # the start-up read, past its timeout
        torch_row = next(v for v in support.section().verdicts if v.stack == "trainer torch")
        assert torch_row.runs is None, torch_row
        torch_stack = next(s for s in support.section().stacks if s.kind == StackKind.TORCH)
        assert torch_stack.problem is not None and "took over 4 s" in torch_stack.problem
        jobs.start_job("train", {})  # a timed-out read is read again, in its thread: still no wait here
        count = len(tick_at)
        await wait_for(lambda: len(tick_at) >= count + 2, 20)
        gaps = [b - a for a, b in zip(tick_at, tick_at[1:])]
        assert max(gaps) < 2.0, gaps
    finally:
        await agent.stop()
