"""`cetlab-agent doctor`: one line per check of this machine (driver, engines, state dir, keys, disk, clock)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import socket
import stat
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from agents.runtime.keys import AUTHORIZED_KEYS_NAME, HOST_KEY_NAME, KeyFileError, parse_authorized_keys
from agents.wire.catalogue.doctor import Level
from agents.wire.lab.machines import SimGpus
from agents.wire.lab.model import Alerts, Lab, Trainer
from agents.wire.lab.replicas import models_on
from agents.wire.words import noun, plural

OK: Level = "OK"
WARN: Level = "WARN"
FAIL: Level = "FAIL"


@dataclass(frozen=True)
class Check:
    name: str
    level: Level
    message: str
    fix: str | None = None  # the one command that fixes it, where there is one

    def to_json(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def check_gpus(lab: Lab | None, machine: str) -> Check:
    gpus = lab.machine(machine).gpus if lab is not None else "nvml"
    if isinstance(gpus, SimGpus):
        return Check("gpus", OK, f"SIMULATED: {plural(len(gpus.sim), 'GPU')} from lab.yaml")
    if gpus == "none":
        return Check("gpus", OK, "none (lab.yaml says gpus: none)")
    from agents.telemetry.nvml import NvmlSampler

    sampler = NvmlSampler()
    try:
        if sampler.status is not None:
            if lab is None:  # a pre-flight: the lab may yet say gpus: none
                return Check("gpus", WARN, f"{sampler.status}; a GPU machine needs the NVIDIA driver (and nvidia-ml-py)")
            return Check("gpus", FAIL, f"{sampler.status} (lab.yaml says gpus: nvml)")
        samples = sampler.sample()
    finally:
        sampler.close()
    failed = [s for s in samples if s.failed]
    names = ", ".join(sorted({s.name for s in samples}))
    if failed:
        return Check(
            "gpus",
            FAIL,
            f"NVML: {len(failed)} of {plural(len(samples), 'GPU')} failed: "
            + "; ".join(f"GPU {s.index}: {s.failed}" for s in failed),
        )
    return Check("gpus", OK, f"NVML: {plural(len(samples), 'GPU')} ({names})")


def check_torch(lab: Lab | None, machine: str) -> Check:
    if importlib.util.find_spec("torch") is None:
        return Check("torch", WARN, "not installed: trainers that need it will fail (pip install torch)")
    import torch

    if torch.cuda.is_available():
        return Check("torch", OK, f"{torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} devices")
    simulated = lab is not None and (isinstance(lab.machine(machine).gpus, SimGpus) or lab.machine(machine).gpus == "none")
    return Check(
        "torch",
        OK if simulated else WARN,
        f"{torch.__version__}, torch.cuda.is_available() is False"
        + ("" if simulated else ": trainers run on the CPU (a CPU-only torch build, or a driver/CUDA mismatch)"),
    )


def check_torch_probed(lab: Lab, machine: str) -> Check:
    """The agent's own Python's torch, read in a subprocess (an agent that imported torch would keep its memory)."""
    import sys

    from agents.runtime.torch_probe import TorchReader

    found = TorchReader().probe(sys.executable)
    if found.error is not None:
        return Check("torch", WARN, f"{found.error}: trainers that need it will fail", f"{sys.executable} -m pip install torch")
    simulated = isinstance(lab.machine(machine).gpus, SimGpus) or lab.machine(machine).gpus == "none"
    if found.cuda is None and not simulated:
        return Check("torch", WARN, f"{found.version}, a CPU build: trainers run on the CPU")
    return Check("torch", OK, f"{found.version}" + (f", CUDA {found.cuda}" if found.cuda else ", a CPU build"))


def check_engines(lab: Lab, machine: str) -> list[Check]:
    """Each engine's own line on its install here (a model of this machine using it makes a missing one a FAIL)."""
    from agents.orchestra.engines import ENGINES

    needed = {m.engine for m in models_on(lab, machine)}
    checks = []
    for name, engine in ENGINES.items():
        found = engine.install_check(name in needed)
        if found is not None:
            checks.append(Check(found.name, OK if found.ok else FAIL, found.message))
    return checks


def check_models(lab: Lab, machine: str) -> list[Check]:
    """Each model lab.yaml places here, as its engine judges it: the engine's binary, the weights and their format."""
    from agents.orchestra.engines import ENGINES
    from agents.orchestra.weights.vram import disagreement

    models = models_on(lab, machine)
    if not models:
        return []
    gpu_caps: dict[int, float | None] = {}
    if lab.machine(machine).gpus == "nvml":  # simulated GPUs have no kernels to judge a build against
        from agents.telemetry.nvml import NvmlSampler

        sampler = NvmlSampler()
        try:
            samples = sampler.sample() if sampler.status is None else []
        finally:
            sampler.close()
        gpu_caps = {g.index: (cc.major + cc.minor / 10 if (cc := g.compute_capability) else None) for g in samples}
    checks = []
    for model in models:
        engine = ENGINES.get(model.engine)
        if engine is None:
            checks.append(Check(f"model {model.name}", FAIL, f"no engine named {model.engine!r} (engines: {', '.join(ENGINES)})"))
            continue
        path = lab.resolve(model.path) or Path(model.path)
        for found in engine.doctor_checks(model, path, gpu_caps):
            checks.append(Check(found.name, OK if found.ok else FAIL, found.message))
        on_tcp = engine.tcp_warning(model)
        if on_tcp is not None:
            checks.append(Check(f"model {model.name} listen", WARN, on_tcp))
        if path.exists() and (vram := disagreement(model, path)) is not None:  # a missing path: the engine's check says so
            checks.append(Check(f"model {model.name} vram", WARN, vram))
    return checks


def check_rpc_helper(lab: Lab, machine: str) -> list[Check]:
    """A machine that lends its GPUs to a model served on another (lab.yaml's rpc:) runs llama.cpp's rpc-server for it:
    found here, or a FAIL with the command that builds it (built with llama-server)."""
    from agents.orchestra.engines.llamacpp import build as llamacpp_build

    helped = [(m, h) for m in lab.models for h in m.rpc if h.machine == machine]
    if not helped:
        return []
    names = ", ".join(m.name for m, _ in helped)
    binary = llamacpp_build.find_rpc_server()
    if binary is None:
        caps: list[float] = []
        if lab.machine(machine).gpus == "nvml" and any(h.gpus for _, h in helped):
            from agents.telemetry.nvml import NvmlSampler

            sampler = NvmlSampler()
            try:
                samples = sampler.sample() if sampler.status is None else []
            finally:
                sampler.close()
            lent = {g for _, h in helped for g in h.gpus}
            caps = [cc.major + cc.minor / 10 for g in samples if g.index in lent and (cc := g.compute_capability)]
        where = f"${llamacpp_build.RPC_BINARY_ENV}, beside llama-server in {llamacpp_build.build_dir()}/bin, PATH"
        fix = llamacpp_build.build_command(caps)
        return [Check(f"rpc-server ({names})", FAIL, f"not found ({where}): this machine lends its GPUs to {names}", fix)]
    return [Check(f"rpc-server ({names})", OK, f"{binary}: listens on 127.0.0.1 only, reached over the agents' SSH")]


def check_ports(lab: Lab, machine: str, held: frozenset[int] = frozenset()) -> list[Check]:
    """The ports this machine's entry names (the agent's, the gateway's, fixed engine ports): free, or who may hold them.

    ``held``: the ports the running agent that asks holds itself (its SSH port, its gateway, its engines)."""
    here = lab.machine(machine)
    wanted: list[tuple[str, str, int]] = []
    if here.via == "agent":
        wanted.append(("agent port", here.host, here.port))
    if lab.gateway is not None and lab.gateway.machine == machine and lab.gateway.port:
        wanted.append(("gateway port", lab.gateway.host, lab.gateway.port))
    wanted += [(f"port of {m.name}", "127.0.0.1", m.port) for m in models_on(lab, machine) if m.port]
    checks = []
    for name, host, port in wanted:
        if port in held:
            checks.append(Check(name, OK, f"{host}:{port} held by this agent"))
            continue
        try:
            with socket.create_server((host, port)):
                pass
            checks.append(Check(name, OK, f"{host}:{port} free"))
        except OSError as exc:
            checks.append(
                Check(
                    name,
                    WARN if not held else FAIL,  # asked of a running agent: not its own, so another process holds it
                    f"{host}:{port}: {exc.strerror or exc}"
                    + (": the running agent's own, or another process's" if not held else ""),
                    fix=f"ss -ltnp 'sport = :{port}'",
                )
            )
    return checks


def check_precision() -> list[Check]:
    """What `precision: auto` picks on each CUDA device, and what it turns off (from the compute capability)."""
    if importlib.util.find_spec("torch") is None:
        return []
    import torch

    from agents.train.precision import plan_precision

    checks = []
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        capability, name = torch.cuda.get_device_capability(index), torch.cuda.get_device_name(index)
        plan = plan_precision("auto", capability, tf32=True, torch_compile=True, device_name=name)
        off = [note.split(":")[0] for note in plan.notes[1:]]
        checks.append(
            Check(
                f"precision cuda:{index}",
                OK,
                f"{name} ({capability[0]}.{capability[1]}): {plan.precision}"
                + (f"; {' and '.join(off)}" if off else "; tf32 and torch_compile available"),
            )
        )
    return checks


def check_state_dir(state_dir: Path, ssh_server: bool = True, machine: str = "MACHINE") -> list[Check]:
    """ssh_server: the agent serves SSH itself (`via: agent`); a `via: sshd` agent makes and reads no host key."""
    if not state_dir.exists():
        return [Check("state dir", WARN, f"{state_dir} does not exist yet (the agent creates it, mode 700)")]
    mode = stat.S_IMODE(state_dir.stat().st_mode)
    checks = []
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        checks.append(Check("state dir", FAIL, f"{state_dir} is writable by others (mode {mode:o})", f"chmod 700 {state_dir}"))
    else:
        checks.append(Check("state dir", OK, f"{state_dir} (mode {mode:o})"))
    host_key = state_dir / HOST_KEY_NAME
    if not host_key.exists() and not ssh_server:
        checks.append(Check("host key", OK, "none needed: via: sshd (consoles come through this machine's sshd)"))
    elif not host_key.exists():
        checks.append(Check("host key", WARN, f"{host_key} missing: created at the first start"))
    else:
        key_mode = stat.S_IMODE(host_key.stat().st_mode)
        too_open = key_mode & (stat.S_IRWXG | stat.S_IRWXO)
        checks.append(
            Check(
                "host key",
                FAIL if too_open else OK,
                f"{host_key} is too open (mode {key_mode:o})" if too_open else f"{host_key} (mode {key_mode:o})",
                f"chmod 600 {host_key}" if too_open else None,
            )
        )
    authorized = state_dir / AUTHORIZED_KEYS_NAME
    if not authorized.exists():
        checks.append(
            Check(
                "authorized keys",
                WARN,
                f"{authorized} missing: no console can log in",
                f"cetlab-agent authorize --machine {machine} --state-dir {state_dir} --role operator YOUR_KEY.pub",
            )
        )
    else:
        auth_mode = stat.S_IMODE(authorized.stat().st_mode)
        if auth_mode & (stat.S_IWGRP | stat.S_IWOTH):
            checks.append(
                Check(
                    "authorized keys", FAIL, f"{authorized} is writable by others (mode {auth_mode:o})", f"chmod 600 {authorized}"
                )
            )
            return checks
        try:
            entries = parse_authorized_keys(authorized.read_text(), str(authorized))
            operators = sum(1 for e in entries if e.role == "operator")
            checks.append(
                Check(
                    "authorized keys",
                    OK if entries else WARN,
                    f"{plural(len(entries), 'key')} ({plural(operators, 'operator')})"
                    if entries
                    else "no keys: no console can log in",
                )
            )
        except KeyFileError as exc:
            checks.append(Check("authorized keys", FAIL, str(exc)))
    return checks


def check_disk(lab: Lab | None, state_dir: Path) -> Check:
    probe = state_dir if state_dir.exists() else next((p for p in state_dir.parents if p.exists()), Path("/"))
    usage = shutil.disk_usage(probe)
    free_pct = 100 * usage.free / usage.total if usage.total else 0.0
    threshold = (lab.alerts if lab is not None else Alerts()).disk_free_pct
    level = FAIL if free_pct < threshold else WARN if free_pct < 2 * threshold else OK
    return Check(
        "disk",
        level,
        f"{usage.free / 1024**3:.1f} GiB free ({free_pct:.0f}%) on {probe}"
        + (f", below {threshold:g}%" if level == FAIL else ""),
    )


def check_clock() -> Check:
    """Costs and history need a synchronised clock; timedatectl says, where systemd runs."""
    if shutil.which("timedatectl") is None:
        return Check("time sync", WARN, "unknown (no timedatectl)")
    try:
        out = subprocess.run(
            ["timedatectl", "show", "-p", "NTPSynchronized", "--value"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("time sync", WARN, f"unknown ({exc})")
    value = out.stdout.strip()
    if out.returncode != 0 or value not in ("yes", "no"):
        return Check("time sync", WARN, f"unknown ({(out.stderr.strip() or 'timedatectl gave no answer').splitlines()[0]})")
    return Check(
        "time sync", OK if value == "yes" else WARN, "NTP synchronised" if value == "yes" else "the clock is not NTP-synchronised"
    )


Step = tuple[str, Callable[[], list[Check]]]  # what it checks (said when it runs out of time), and the check


def check_steps(lab: Lab, machine: str, state_dir: Path, held: frozenset[int] | None = None) -> list[Step]:
    """The doctor of a machine with its lab.yaml entry, step by step. A running agent runs them with a deadline, and
    passes ``held`` (the ports it holds itself): there torch is read in a subprocess, never imported into the agent."""
    in_agent = held is not None
    return [
        ("gpus", lambda: [check_gpus(lab, machine)]),
        ("torch", lambda: [check_torch_probed(lab, machine)] if in_agent else [check_torch(lab, machine), *check_precision()]),
        ("gpu support", lambda: check_gpu_support(lab, machine)),
        ("trainers", lambda: check_trainers(lab, machine)),
        ("engines", lambda: check_engines(lab, machine)),
        ("models", lambda: check_models(lab, machine) + check_rpc_helper(lab, machine)),
        ("ports", lambda: check_ports(lab, machine, held or frozenset())),
        ("keys", lambda: check_state_dir(state_dir, ssh_server=lab.machine(machine).via == "agent", machine=machine)),
        ("disk", lambda: [check_disk(lab, state_dir)]),
        ("clock", lambda: [check_clock()]),
    ]


def run_checks(lab: Lab, machine: str, state_dir: Path) -> list[Check]:
    return [check for _what, step in check_steps(lab, machine, state_dir) for check in step()]


def trainer_pythons(lab: Lab, machine: str) -> dict[str, list[str]]:
    """The Python each recipe that runs here starts (as a node too), with the recipes that start it, in lab.yaml's order."""
    from agents.runtime.torch_probe import python_of

    found: dict[str, list[str]] = {}
    for trainer in lab.trainers:
        if machine not in ([n.machine for n in trainer.nodes] or [trainer.machine]):
            continue
        python = python_of(trainer.command[0])
        if python is not None:
            found.setdefault(python, []).append(trainer.name)
    return found


def _needs_torch(trainer: Trainer) -> bool:
    """A recipe that certainly imports torch: on GPUs, under torchrun, or cetlab's own trainer."""
    runs = " ".join(trainer.command)
    return bool(trainer.gpus) or trainer.launcher == "torchrun" or "cetlab-train" in runs or "agents.train" in runs


def check_trainers(lab: Lab, machine: str) -> list[Check]:
    """Each Python this machine's recipes run: it starts, and has a torch (its kernels per GPU: `gpu N trainer torch`)."""
    if isinstance(lab.machine(machine).gpus, SimGpus):
        return []  # simulated GPUs: the recipes' torch is the simulation's (`stack trainer torch`)
    from agents.runtime.torch_probe import TorchReader

    reader = TorchReader()
    checks = []
    for python, recipes in trainer_pythons(lab, machine).items():
        name = f"trainer python {python}"
        said = f"{noun(len(recipes), 'recipe')} {', '.join(recipes)}"
        if shutil.which(python) is None and not Path(python).is_file():
            checks.append(Check(name, FAIL, f"{said}: {python} not found", f"python3 -m venv {Path(python).parent.parent}"))
            continue
        found = reader.probe(python)
        if found.error is not None:
            # a recipe on GPUs, under torchrun or cetlab's own trainer imports torch; a plain script may not need it
            needs_torch = any(_needs_torch(t) for t in lab.trainers if t.name in recipes)
            level = WARN if found.timed_out or not needs_torch else FAIL
            unless = "" if needs_torch else " (fine if the recipe does not import torch)"
            checks.append(Check(name, level, f"{said}: {found.error}{unless}", f"{python} -m pip install torch"))
        else:
            build = f"CUDA {found.cuda}" if found.cuda else "a CPU build"
            checks.append(Check(name, OK, f"{said}: torch {found.version}, {build}"))
    return checks


def run_machine_checks(lab_path: Path, machine: str, state_dir: Path | None, names: list[str] | None = None) -> list[Check]:
    """Before lab.yaml exists (or names this machine, ``names`` being its machines): what this machine can do on its own
    (NVML, torch and its CUDA kernels per GPU, disk, clock)."""
    needs = "engines, keys and what lab.yaml places on each GPU need it"
    lab_line = (
        Check("lab.yaml", WARN, f"{lab_path} not found: this machine's own checks only ({needs})")
        if names is None
        else Check(
            "lab.yaml",
            WARN,
            f"{lab_path} names no machine like this host ({machine!r}): this machine's own checks only ({needs}); "
            f"its machines: {', '.join(names)}",
            f"cetlab-agent doctor --lab {lab_path} --machine {names[0] if names else 'NAME'}",
        )
    )
    return [
        lab_line,
        check_gpus(None, machine),
        check_torch(None, machine),
        *check_precision(),
        *check_gpu_support(None, machine),
        *(check_state_dir(state_dir, machine=machine) if state_dir is not None else []),
        check_disk(None, state_dir or Path.cwd()),
        check_clock(),
    ]


def check_gpu_support(lab: Lab | None, machine: str) -> list[Check]:
    """Per GPU: which stacks (trainer torch, vLLM, llama-server) run there; FAIL where lab.yaml places one that cannot."""
    from agents.gpusupport.matrix import matrix
    from agents.gpusupport.stacks import real_stacks, sim_stacks
    from agents.orchestra.engines import ENGINES, installed_stacks
    from agents.runtime.torch_probe import TorchReader
    from agents.wire.sections.gpu_support import StackKind

    spec = lab.machine(machine).gpus if lab is not None else "nvml"
    if spec == "none":
        return []
    if isinstance(spec, SimGpus):
        from agents.telemetry.sim import SimSampler

        gpus, stacks = SimSampler(spec.sim, seed=spec.seed, background=False).sample(), sim_stacks(spec.stacks)
    else:
        from agents.telemetry.nvml import NvmlSampler

        sampler = NvmlSampler()
        try:
            gpus = sampler.sample()
        finally:
            sampler.close()
        if not gpus:
            return []
        reader = TorchReader()
        pythons = list(trainer_pythons(lab, machine)) if lab is not None else []
        stacks = real_stacks(reader, installed_stacks(reader), pythons[0] if pythons else None)
    placed: dict[tuple[int, StackKind], str] = {}  # (GPU, stack) -> what lab.yaml puts there
    for model in models_on(lab, machine) if lab is not None else []:
        engine = ENGINES.get(model.engine)
        kind = engine.spec.gpu_stack if engine is not None else None
        if kind is None:
            continue
        for index in model.gpus:
            placed.setdefault((index, kind), f"model {model.name}")
    for trainer in lab.trainers if lab is not None else []:
        nodes = [(n.machine, n.gpus) for n in trainer.nodes] or [(trainer.machine, trainer.gpus)]
        for index in next((g for m, g in nodes if m == machine), []):
            placed.setdefault((index, StackKind.TORCH), f"trainer {trainer.name}")
    absent = {s.name for s in stacks.values() if s.problem is not None and s.problem.startswith("not installed")}
    verdicts = matrix(machine, gpus, list(stacks.values()))
    checks = []
    for gpu in gpus:
        rows = [v for v in verdicts if v.gpu == gpu.index]
        if not rows:
            continue
        summary = ", ".join(
            f"{v.stack} {'yes' if v.runs else 'no' if v.runs is False else '?'}" for v in rows if v.stack not in absent
        )
        sim = ", SIM" if gpu.simulated else ""
        cc = gpu.compute_capability
        checks.append(Check(f"gpu {gpu.index} support", OK, f"{gpu.name} ({cc.sm if cc else 'capability N/A'}{sim}): {summary}"))
        for v in rows:
            if v.runs is False:
                where = placed.get((gpu.index, v.kind))
                if where is None and lab is not None and v.kind != StackKind.TORCH:
                    continue  # nothing lab.yaml places here needs this engine: the summary's "no" says it
                checks.append(
                    Check(f"gpu {gpu.index} {v.stack}", FAIL if where else WARN, (f"{where}: " if where else "") + v.message)
                )
            elif v.runs is None and v.kind == StackKind.TORCH:
                checks.append(Check(f"gpu {gpu.index} {v.stack}", WARN, v.reason))
    stack_lines = [
        Check(
            f"stack {s.name}",
            WARN if s.problem is not None and s.kind == StackKind.TORCH else OK,
            (
                s.problem
                or (f"{s.version}, " if s.version else "")
                + ("CPU build" if s.cpu_build else f"CUDA {s.cuda or '?'}, kernels " + (" ".join(s.archs) or "not said"))
            )
            + f" ({s.source})",
        )
        for s in stacks.values()
    ]
    return stack_lines + checks
