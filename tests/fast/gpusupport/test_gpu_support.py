"""What each GPU can run (issue 19 item 4): compute capabilities, the stacks' kernels, the matrix, refusals before a launch, doctor."""

from __future__ import annotations

import sys

import pytest

from agents.gpusupport.matrix import judge, matrix
from agents.gpusupport.stacks import DEFAULT_SIM_STACKS, sim_stacks
from agents.runtime.torch_probe import TorchReader, python_of
from agents.telemetry.sim import SimSampler
from agents.wire.lab.machines import SimGpu
from agents.wire.lab.model import load_lab
from agents.wire.protocol import GpuSample
from agents.wire.sections.gpu_support import Stack, StackKind
from tests.support.gpu_support import CC
from tests.support.lab import REPO

PY = sys.executable


NAMES = {"P40": "Tesla P40", "V100": "Tesla V100", "3050": "NVIDIA GeForce RTX 3050", "H100": "NVIDIA H100 80GB HBM3"}


CUDA13 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]  # PyTorch's CUDA 13 wheels from the package index


CU126 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]  # PyTorch's own CUDA 12.6 wheel index


TORCH_CUDA13 = Stack(
    name="trainer torch",
    kind=StackKind.TORCH,
    version="2.13.0+cu130",
    cuda="13.0",
    archs=CUDA13,
    source="/lab/venv/bin/python: x",
)


TORCH_CU126 = Stack(
    name="trainer torch", kind=StackKind.TORCH, version="2.14.0+cu126", cuda="12.6", archs=CU126, source="/lab/venv/bin/python: x"
)


TORCH_CPU = Stack(
    name="trainer torch", kind=StackKind.TORCH, version="2.13.0+cpu", cpu_build=True, source="/lab/venv/bin/python: x"
)


VLLM = Stack(name="vLLM", kind=StackKind.VLLM, version="0.33.0", cuda="13.0", archs=CUDA13, min_capability=CC["V100"], source="x")


LLAMA_CUDA12 = Stack(name="llama-server", kind=StackKind.LLAMACPP, cuda="12.8", archs=["sm_61", "sm_70", "sm_86"], source="x")


LLAMA_CPU = Stack(name="llama-server", kind=StackKind.LLAMACPP, cpu_build=True, source="x")


# ---------------------------------------------------------------------------- the matrix, with typed fake stacks


@pytest.mark.parametrize(
    "gpu, stack, runs",
    [
        ("P40", TORCH_CUDA13, False),
        ("V100", TORCH_CUDA13, False),
        ("3050", TORCH_CUDA13, True),
        ("H100", TORCH_CUDA13, True),
        ("P40", TORCH_CU126, True),
        ("V100", TORCH_CU126, True),
        ("3050", TORCH_CU126, True),
        ("H100", TORCH_CU126, True),
        ("P40", TORCH_CPU, False),
        ("V100", TORCH_CPU, False),
        ("3050", TORCH_CPU, False),
        ("H100", TORCH_CPU, False),
        ("P40", VLLM, False),
        ("V100", VLLM, False),
        ("3050", VLLM, True),
        ("H100", VLLM, True),
        ("P40", LLAMA_CUDA12, True),
        ("V100", LLAMA_CUDA12, True),
        ("3050", LLAMA_CUDA12, True),
        ("H100", LLAMA_CUDA12, False),
        ("P40", LLAMA_CPU, False),
        ("H100", LLAMA_CPU, False),
    ],
)
def test_matrix_of_lab_gpus_and_builds(gpu, stack, runs):
    verdict = judge("m5", 1, NAMES[gpu], CC[gpu], stack)
    assert verdict.runs is runs, verdict.message
    assert (verdict.fix is None) is runs


def test_the_issue_wording_for_a_p40_under_a_cuda13_torch():
    verdict = judge("m5", 1, "Tesla P40", CC["P40"], TORCH_CUDA13, for_model=True)
    assert verdict.message.startswith(
        "m5 GPU 1 is a Tesla P40 (sm_61); this torch 2.13 build (CUDA 13.0) has kernels for sm_75 and newer; "
        "install PyTorch 2.14 from PyTorch's CUDA 12.6 wheel index (/lab/venv/bin/python -m pip install "
        "'torch==2.14.*' --index-url https://download.pytorch.org/whl/cu126)"
    )
    assert verdict.message.endswith("or serve this model with engine llamacpp")
    job = judge("m5", 1, "Tesla P40", CC["P40"], TORCH_CUDA13)
    assert "llamacpp" not in job.message  # a trainer has no other engine to go to


def test_reasons_name_the_build_and_the_fix():
    assert (
        "vLLM 0.33 needs compute capability 7.0 or newer; serve this model with engine llamacpp"
        in judge("m5", 2, "Tesla P40", CC["P40"], VLLM).message
    )
    v100 = judge("m5", 0, "Tesla V100", CC["V100"], VLLM).message
    assert "vLLM 0.33's torch (CUDA 13.0) has kernels for sm_75 and newer" in v100 and "CUDA 12.6" in v100
    cpu = judge("m5", 0, "Tesla V100", CC["V100"], TORCH_CPU).message
    assert "is a CPU build" in cpu and "CUDA 12.6 wheel index" in cpu
    assert "sm_86 kernels" in judge("workstation", 0, "RTX 3050", CC["3050"], TORCH_CUDA13).message
    h100 = judge("rented", 0, "H100", CC["H100"], LLAMA_CUDA12)
    assert "kernels up to sm_86" in h100.message and "CMAKE_CUDA_ARCHITECTURES" in h100.message
    assert "-DGGML_CUDA=ON" in judge("m5", 1, "Tesla P40", CC["P40"], LLAMA_CPU).message


def test_unknown_is_not_a_refusal():
    unread = Stack(name="trainer torch", kind=StackKind.TORCH, source="x", problem="no torch in /usr/bin/python3")
    assert judge("m5", 0, "Tesla V100", CC["V100"], unread).runs is None
    assert judge("m5", 0, "Tesla V100", None, TORCH_CUDA13).runs is None  # capability N/A from the driver
    assert (
        judge("m5", 0, "x", CC["V100"], Stack(name="llama-server", kind=StackKind.LLAMACPP, source="x")).runs is None
    )  # archs unsaid


def test_matrix_covers_every_gpu_and_stack_and_skips_failed_gpus():
    gpus = [
        GpuSample(index=0, name="Tesla V100", compute_capability=CC["V100"]),
        GpuSample(index=1, name="Tesla P40", compute_capability=CC["P40"]),
        GpuSample(index=2, name="Tesla P40", failed="GPU is lost"),
    ]
    rows = matrix("m5", gpus, [TORCH_CU126, VLLM, LLAMA_CUDA12])
    assert [(r.gpu, r.stack, r.runs) for r in rows] == [
        (0, "trainer torch", True),
        (0, "vLLM", False),
        (0, "llama-server", True),
        (1, "trainer torch", True),
        (1, "vLLM", False),
        (1, "llama-server", True),
    ]


def test_engines_map_to_their_stacks():
    from agents.orchestra.engines import ENGINES

    kind = {name: cls.spec.gpu_stack for name, cls in ENGINES.items()}
    assert kind["vllm"] == StackKind.VLLM and kind["transformers"] == StackKind.TORCH and kind["llamacpp"] == StackKind.LLAMACPP
    assert all(kind[name] == StackKind.SIM for name, cls in ENGINES.items() if cls.spec.simulated)  # CPU processes
    assert kind["command"] is None  # any server: its kernels are not known, so not checked
    sim = ENGINES["sim"].stack(TorchReader())
    assert sim is not None and sim.kind == StackKind.SIM and not sim.needs_gpu and ENGINES["command"].stack(TorchReader()) is None


# ---------------------------------------------------------------------------- capabilities: sim spec, name table


def test_sim_gpus_carry_their_compute_capability_labelled_simulated():
    sampler = SimSampler(
        [
            SimGpu(name="Tesla P40", memory_gib=24, tdp_w=250),
            SimGpu(name="Tesla V100", memory_gib=32, tdp_w=250),
            SimGpu(name="NVIDIA GeForce RTX 3050", memory_gib=8, tdp_w=130),
            SimGpu(name="Custom", memory_gib=8, tdp_w=100, compute_capability="7.5"),
            SimGpu(name="Unknown", memory_gib=8, tdp_w=100),
        ],
        background=False,
    )
    samples = sampler.sample()
    assert [str(s.compute_capability) for s in samples] == ["6.1", "7.0", "8.6", "7.5", "None"]
    assert all(s.simulated for s in samples)
    assert samples[0].model_dump(mode="json")["compute_capability"] == {"major": 6, "minor": 1}


def test_the_python_of_a_trainer_script_is_its_shebang(tmp_path):
    script = tmp_path / "train"
    script.write_text(f"#!{PY}\nprint('hi')\n")
    assert python_of(script) == PY
    assert python_of(PY) == PY
    binary = tmp_path / "trainer-bin"
    binary.write_bytes(b"\x7fELF...")
    assert python_of(binary) is None


def test_the_demo_lab_keeps_training_on_its_simulated_v100_and_p40s():
    """The demo's sim machines assume a lab installed as docs/engines.md says: torch 2.14 CUDA 12.6 runs on the V100 and the P40s."""
    lab = load_lab(REPO / "lab.yaml")
    m5 = lab.machine("m5")
    stacks = sim_stacks(m5.gpus.stacks)
    samples = SimSampler(m5.gpus.sim, background=False).sample()
    rows = matrix("m5", samples, list(stacks.values()))
    assert all(v.runs for v in rows if v.kind == StackKind.TORCH), [v.message for v in rows if not v.runs]
    assert [v.runs for v in rows if v.kind == StackKind.VLLM] == [False] * 5
    assert stacks[StackKind.TORCH].archs == DEFAULT_SIM_STACKS.torch.archs
    pharaoh = lab.machine("pharaoh")  # the demo's one misinstalled box (SIM): a CUDA 13 torch, and no trainer placed there
    rows = matrix(
        "pharaoh", SimSampler(pharaoh.gpus.sim, background=False).sample(), list(sim_stacks(pharaoh.gpus.stacks).values())
    )
    assert next(v for v in rows if v.kind == StackKind.TORCH).runs is False
    assert not [t for t in lab.trainers if t.machine == "pharaoh" or any(n.machine == "pharaoh" for n in t.nodes)]


# ---------------------------------------------------------------------------- NVML


def test_nvml_compute_capability_is_read_once_per_gpu_and_na_where_unsupported():
    import pynvml

    from agents.telemetry.nvml import NvmlSampler
    from tests.support.fake_nvml import FakeNvml, gpu

    class WithCapability(FakeNvml):
        def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:  # nvidia-ml-py returns (major, minor)
            return self._get(h, "cc")

    unsupported = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake = WithCapability(gpu("Tesla P40", cc=(6, 1)), gpu("Tesla V100-SXM2-32GB", cc=(7, 0)), gpu("odd", cc=unsupported))
    sampler = NvmlSampler(nvml_module=fake)
    first, second = sampler.sample(), sampler.sample()
    assert [str(g.compute_capability) for g in second] == ["6.1", "7.0", "None"]
    assert first == second and fake.calls["cc", 0] == 1 and not second[0].simulated
    assert NvmlSampler(nvml_module=FakeNvml(gpu("old bindings"))).sample()[0].compute_capability is None  # no such call
