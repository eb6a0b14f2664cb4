"""Shared fixtures: the demo lab's real agents on loopback, a connected FleetClient."""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path

import pytest
import yaml

from agents.shell.demo.lab import DemoLab
from tests.support.lab import HOUR_S, REPO, TESTS_DIR, age, pin_llama_server, trainer_env

# the fixtures tests/support/ defines, found by name as conftest's are: a test module imports none of them (one that
# imported `gw` but not the `gw_demo` it stands on errored in CI when a lint fix dropped the unused-looking name)
pytest_plugins = [
    "tests.support.checkpoints_view",
    "tests.support.cli_labs",
    "tests.support.command_engine",
    "tests.support.gateway_one_machine",
    "tests.support.gateway_provider",
    "tests.support.multinode",
    "tests.support.vram_tiny",
]

# demos started by tests (several at once, on a shared machine) never race for lab.yaml's gateway port 8400
os.environ["CETLAB_DEMO_ANY_GATEWAY_PORT"] = "1"


# ---------------------------------------------------------------- the machine the suite runs on

# CETLAB_TEST_AS_GPU_WORKSTATION=1: run the suite as on a workstation with a CUDA GPU, as far as that is honest without
# one. NVML (a stand-in pynvml, tests/support/gpu_workstation/) and nvidia-smi report one GPU (SIMULATED figures) to this
# process and every process it starts; torch in this process says it sees that CUDA device (is_available, the device's
# name and capability) for the code that only branches on it. Nothing runs on it: a tensor sent to CUDA still fails,
# and the processes the tests start (trainers, engines) keep their own, real torch. See docs/development.md.
GPU_WORKSTATION_ENV = "CETLAB_TEST_AS_GPU_WORKSTATION"
GPU_WORKSTATION = os.environ.get(GPU_WORKSTATION_ENV, "") not in ("", "0")
if GPU_WORKSTATION:
    _stand_ins = str(REPO / "tests" / "support" / "gpu_workstation")
    sys.path.insert(0, _stand_ins)
    os.environ["PYTHONPATH"] = os.pathsep.join([_stand_ins, *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ["PATH"] = os.pathsep.join([_stand_ins, os.environ.get("PATH", "")])


pin_llama_server(os.environ)


def _torch_sees_the_gpu() -> None:
    """torch.cuda in this process answering for the stand-in GPU (GPU_WORKSTATION only); torch itself is real."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return
    import pynvml  # the stand-in
    import torch

    name, capability = str(pynvml.DEVICE["name"]), tuple(pynvml.DEVICE["cc"])
    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.device_count = lambda: 1
    cuda.current_device = lambda: 0
    cuda.get_device_name = lambda device=None: name
    cuda.get_device_capability = lambda device=None: capability


def pytest_configure(config):
    if GPU_WORKSTATION:
        _torch_sees_the_gpu()


def pytest_report_header(config):
    if GPU_WORKSTATION:
        return f"{GPU_WORKSTATION_ENV}: NVML, nvidia-smi and this process's torch.cuda report one GPU (tests/support/gpu_workstation/)"
    return None


V100 = {"name": "Tesla V100", "memory_gib": 32, "tdp_w": 250}


# ---------------------------------------------------------------- the two tiers

# A test's folder is its tier: tests/e2e/<area>/ start processes (agents, trainers, sshd, llama-server, demo labs) and
# are marked e2e; tests/fast/<area>/ run in the test's own process (`make test-fast`, `-m "not e2e"`). The guard: what
# in a fast test's code (or its fixtures', or the tests' helpers it calls) starts a process, a server or a demo lab of
# processes, read from the code, refuses the run, so that a fast test cannot drift into starting one.
PROCESS_SIGNS = (
    "DemoLab",
    "run_agent(",
    "run_pool",
    "subprocess",
    "Popen",
    "create_subprocess",
    "sys.executable",
    "sshd",
    "llama_server",
    "asyncssh.listen",
    "asyncssh.connect",
    "os.fork",
    '"--demo"',  # the console's demo mode starts the demo lab's agents
    "engine.start()",  # a model server's process (the sim's too)
    "PeerClient(",  # an agent's SSH links to its peers
)


@cache
def _starts_processes(func: types.FunctionType) -> bool:
    """Whether this function, or a helper of the tests' own it calls (at any depth), shows a sign of PROCESS_SIGNS."""
    seen: set[types.FunctionType] = set()
    todo = [func]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            source = inspect.getsource(current)
        except (OSError, TypeError):
            continue
        if any(sign in source for sign in PROCESS_SIGNS):
            return True
        module = sys.modules.get(current.__module__)
        if module is None:
            continue
        for name in _names(current.__code__):
            helper = getattr(module, name, None)
            helper = inspect.unwrap(helper) if callable(helper) else helper  # a context manager's generator, say
            # the tests' helpers only: the product's code names subprocess where a test of it starts none
            if isinstance(helper, types.FunctionType) and helper.__code__.co_filename.startswith(TESTS_DIR):
                todo.append(helper)
    return False


def _names(code: types.CodeType) -> set[str]:
    """The global names a function's code uses, its inner functions' included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


@cache
def cuda_gpu_here() -> str | None:
    """What makes this a GPU machine (NVML lists a GPU, or torch sees a CUDA device), or None: CI and the usual dev box.

    Asked only when a collected test is marked needs_no_gpu; NVML first (cheap), torch's CUDA only if NVML says nothing.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            if count := pynvml.nvmlDeviceGetCount():
                return f"NVML lists {count} GPU(s)"
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library: not a GPU machine as far as NVML knows
        pass
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    if found.returncode == 0 and found.stdout.strip() not in ("", "0"):
        return f"torch sees {found.stdout.strip()} CUDA device(s)"
    return None


def tier_of(path: Path) -> str | None:
    """ "fast" or "e2e": the tier folder a test module is in (None outside tests/fast and tests/e2e)."""
    parts = path.resolve().relative_to(REPO / "tests").parts
    return parts[0] if parts and parts[0] in ("fast", "e2e") else None


def _in_use(defs: Sequence[pytest.FixtureDef], name: str) -> list[pytest.FixtureDef]:
    """The definitions of ``name`` a test gets: the closest, and the one it overrides only where it asks for it."""
    used: list[pytest.FixtureDef] = []
    for definition in reversed(defs):
        used.append(definition)
        if name not in definition.argnames:
            break
    return used


def pytest_collection_modifyitems(config, items):
    drifted = []
    for item in items:
        if item.get_closest_marker("needs_no_gpu") and (gpu := cuda_gpu_here()):
            item.add_marker(pytest.mark.skip(reason=f"needs a machine without a CUDA GPU, and {gpu}"))
        tier = tier_of(item.path)
        if tier == "e2e":
            item.add_marker(pytest.mark.e2e)
            continue
        function = getattr(item, "function", None)
        if function is None:
            continue
        funcs = [function]
        for name in item.fixturenames:
            funcs += [inspect.unwrap(d.func) for d in _in_use(item._fixtureinfo.name2fixturedefs.get(name, ()), name)]
        if item.get_closest_marker("slow") or any(isinstance(f, types.FunctionType) and _starts_processes(f) for f in funcs):
            drifted.append(item.nodeid)
    if drifted:
        raise pytest.UsageError(
            "these tests start processes (or are marked slow), so they belong in tests/e2e/, not tests/fast/: "
            + ", ".join(drifted)
        )


@pytest.fixture(scope="session")
def demo_lab(tmp_path_factory) -> Iterator[DemoLab]:
    """The bundled demo lab, its four agents running as real processes (shared by tests)."""
    with DemoLab(tmp_path_factory.mktemp("demo")) as demo:
        yield demo


@pytest.fixture
def lab_file(tmp_path):
    """Write a small lab.yaml (one sim machine by default); returns a function (data) -> Path."""

    def write(data: dict | None = None, name: str = "lab.yaml") -> Path:
        data = data or {
            "lab": "test-lab",
            "machines": [{"name": "box", "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}]}}],
        }
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write


@pytest.fixture
def small_demo(tmp_path, lab_file):
    """A one-machine lab with its agent running; yields the DemoLab (restartable agents)."""
    with DemoLab(tmp_path / "run", source=lab_file()) as demo:
        yield demo


@pytest.fixture(
    params=[
        "asyncssh",
        pytest.param("openssh", marks=pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client on PATH")),
    ]
)
def use_openssh(request) -> bool:
    """Both SSH clients a link can use: asyncssh (the console) and the system's ssh (one-shot CLI verbs)."""
    return request.param == "openssh"


# ---------------------------------------------------------------- real checkpoints (tests of checkpoints and their view)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from agents.train.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="module")
def hand_runs(tmp_path_factory, tiny_model) -> Path:
    """A run not started by cetlab (8 steps, a checkpoint every step) plus a corrupt, an in-progress and a tmp checkpoint."""
    root = tmp_path_factory.mktemp("hand")
    config = {
        "base_model": str(tiny_model),
        "dataset": str(REPO / "demo" / "train.jsonl"),
        "output_dir": "exp1",
        "max_seq_len": 32,
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        "per_device_batch_size": 4,
        "max_steps": 8,
        "learning_rate": 3e-3,
        "save_steps": 1,
        "logging_steps": 1,
        "seed": 0,
    }
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [sys.executable, "-m", "agents.train", "--config", str(root / "train.yaml")],
        cwd=REPO,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = root / "exp1"
    for folder in run.glob("checkpoint-*"):
        age(folder, HOUR_S)
    shutil.copytree(run / "checkpoint-8", run / "checkpoint-9")
    state = run / "checkpoint-9" / "trainer_state.json"
    state.write_text(state.read_text()[:200])  # truncated, as a crash mid-write leaves it
    age(run / "checkpoint-9", HOUR_S)
    shutil.copytree(run / "checkpoint-8", run / "tmp-checkpoint-11")
    age(run / "tmp-checkpoint-11", HOUR_S)
    shutil.copytree(run / "checkpoint-8", run / "checkpoint-10")  # being written right now (fresh files)
    (run / "checkpoint-10" / "trainer_state.json").unlink()
    age(run / "checkpoint-10", 0)
    for name in ("exp2", "exp3"):  # copies for the tests that delete
        shutil.copytree(run, root / name, symlinks=True)  # file times come along
    return root


@pytest.fixture(scope="module")
def checkpoints_lab(tmp_path_factory, tiny_model, hand_runs) -> Iterator[DemoLab]:
    """A one-machine lab whose agent sees hand_runs and serves the tiny model (sim and transformers)."""
    root = tmp_path_factory.mktemp("ckpt")
    source = root / "src"
    source.mkdir()
    shutil.copytree(REPO / "demo", source / "demo")
    train = [
        "cetlab-train",
        "--config",
        "demo/train.yaml",
        "--output-dir",
        "{output_dir}",
        "--set",
        f"base_model={tiny_model}",
        "--set",
        "logging_steps=1",
        "--set",
        "max_seq_len=32",
    ]
    fast = {"load_s": 0.1, "cold_factor": 1, "warmup_s": 0.1, "wake_s": 0.1}
    data = {
        "lab": "ckpt-test",
        "machines": [{"name": "box", "gpus": {"sim": [V100, V100]}}],
        "models": [
            {
                "name": "tiny-sim",
                "path": str(tiny_model),
                "engine": "sim",
                "machine": "box",
                "gpus": [1],
                "vram_gib": 1,
                "sim": fast,
            },
            {"name": "tiny-hf", "path": str(tiny_model), "engine": "transformers", "machine": "box", "load_timeout_s": "180s"},
        ],
        "orchestra": {"warm": ["tiny-sim"]},
        "trainers": [
            {
                "name": "tiny",
                "machine": "box",
                "gpus": [0],
                "command": train,
                "output_dir": "runs/{job_id}",
                "params": [
                    {"name": "max_steps", "type": "int", "default": 4, "min": 1},
                    {"name": "save_steps", "type": "int", "default": 2, "min": 1},
                    {"name": "resume_from_checkpoint", "type": "str"},
                ],
            }
        ],
        "checkpoints": {"dirs": [{"machine": "box", "path": str(hand_runs)}], "poll_s": 1, "settle_s": 600},
    }
    (source / "lab.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with DemoLab(root / "run", source=source / "lab.yaml") as demo:
        yield demo


@pytest.fixture
def run_pool(tmp_path, lab_file):
    """Start a DemoLab from a pool lab; yields (demo, connected client factory)."""
    labs: list[DemoLab] = []

    def start(data: dict) -> DemoLab:
        demo = DemoLab(tmp_path / f"run{len(labs)}", source=lab_file(data, name=f"lab{len(labs)}.yaml"))
        demo.start()
        labs.append(demo)
        demo.wait_listening()
        return demo

    yield start
    for demo in labs:
        demo.stop()


@pytest.fixture
async def in_process(tmp_path, lab_file):
    """Start a lab's agents in the test's event loop (a lab.yaml's data, the default one-machine lab by default); a
    client from `lab.client(role)` reaches them through memory pipes (tests/support/inprocess.py). Stopped at the end."""
    from tests.support.inprocess import InProcessLab

    labs: list[InProcessLab] = []

    async def start(data: dict | None = None, machines: list[str] | None = None) -> InProcessLab:
        lab = InProcessLab(lab_file(data, name=f"lab{len(labs)}.yaml"), tmp_path / f"state{len(labs)}")
        labs.append(lab)
        return await lab.start(machines)

    yield start
    for lab in labs:
        await lab.stop()
