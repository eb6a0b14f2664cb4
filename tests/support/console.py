"""A deterministic LabState for snapshot tests: the demo lab as the simulator draws it, frozen."""

from __future__ import annotations

from agents.telemetry.sim import SimSampler
from agents.wire.lab.model import load_lab
from agents.wire.protocol import PROTOCOL_VERSION, Hello, HostSample, Role, Telemetry
from console.lab.demo import bundled_lab
from console.lab.state import LabState

FROZEN_NOW = 1_790_000_000.0  # a fixed wall clock for headers and "last seen"


def frozen_state(offline: tuple[str, ...] = ("pharaoh",), ticks: int = 40) -> LabState:
    lab = load_lab(bundled_lab())
    state = LabState(lab)
    for machine in lab.machines:
        sampler = SimSampler(machine.gpus.sim, seed=machine.gpus.seed)
        host = HostSample(
            cpu_pct=23.0,
            cpu_count=28,
            load_1=3.1,
            ram_used_bytes=96 * 1024**3,
            ram_total_bytes=256 * 1024**3,
            disk_used_bytes=1200 * 1024**3,
            disk_total_bytes=4000 * 1024**3,
        )
        for tick in range(ticks):
            t = FROZEN_NOW - (ticks - tick)
            telemetry = Telemetry(machine=machine.name, t=t, gpus=sampler.sample(), host=host, gpu_backend="sim", simulated=True)
            state.apply_tick(
                machine.name,
                {
                    "t": t,
                    "full": tick == 0,
                    "changed": {
                        "host": host.model_dump(mode="json"),
                        "gpus": [g.model_dump(mode="json") for g in telemetry.gpus],
                    },
                },
            )
        state.set_hello(
            machine.name,
            Hello(
                protocol=PROTOCOL_VERSION,
                agent_version="test",
                machine=machine.name,
                lab=lab.lab,
                role=Role.OPERATOR,
                capabilities=[],
                simulated=True,
                sample_interval_s=1.0,
                started_at=0.0,
            ),
        )
        state.machines[machine.name].last_seen = FROZEN_NOW - 1
        if machine.name in offline:
            state.set_link(machine.name, "offline", "connection refused (is the agent running?)")
            state.machines[machine.name].last_seen = FROZEN_NOW - 75
        else:
            state.set_link(machine.name, "online")
    return state


def frozen_jobs() -> list[dict]:
    """The jobs section of m5: a running run with its loss falling, a GPU-starved one, a crash and a finished run."""

    def job(n: int, recipe: str, gpus: list[int], state: str, **more) -> dict:
        return {
            "id": f"m5-{n}",
            "recipe": recipe,
            "machine": "m5",
            "gpus": gpus,
            "state": state,
            "exit_code": None,
            "step": None,
            "max_steps": None,
            "loss": None,
            "loss_history": [],
            "samples_per_s": None,
            "tokens_per_s": None,
            "learning_rate": None,
            "eta_s": None,
            "checkpoints": [],
            "started_at": FROZEN_NOW - 1000 + n,
            "elapsed_s": 0.0,
            "params": {},
            "log_path": f"/var/lib/cetlab/logs/job-m5-{n}.log",
            "output_dir": f"/runs/m5-{n}",
            "starved": False,
            "adopted": False,
            "error": None,
            "last_lines": [],
            "simulated": True,
            **more,
        }

    losses = [round(6.4 * 0.97**i + 0.3 * (i % 3) / 10, 4) for i in range(60)]
    return [
        job(
            4,
            "demo-lora",
            [0],
            "running",
            step=240,
            max_steps=400,
            loss=losses[-1],
            loss_history=losses,
            samples_per_s=123.4,
            tokens_per_s=1008.0,
            learning_rate=0.0021,
            eta_s=95.0,
            elapsed_s=148.0,
            params={"max_steps": 400},
            checkpoints=[{"step": s, "path": f"/runs/m5-4/checkpoint-{s}", "save_s": 0.05} for s in (80, 160, 240)],
        ),
        job(
            3,
            "p40-ddp",
            [1, 2, 3, 4],
            "running",
            starved=True,
            step=12,
            max_steps=1000,
            loss=5.9,
            loss_history=[6.3, 6.1, 5.9],
            samples_per_s=3.1,
            eta_s=3800.0,
            elapsed_s=640.0,
            adopted=True,
        ),
        job(
            2,
            "demo-lora",
            [0],
            "failed",
            exit_code=1,
            elapsed_s=7.0,
            error="exited with code 1",
            last_lines=["Traceback (most recent call last):", "  ...", "RuntimeError: CUDA out of memory"],
        ),
        job(
            1,
            "demo-lora",
            [0],
            "exited",
            exit_code=0,
            step=100,
            max_steps=100,
            loss=2.31,
            loss_history=losses[:40],
            samples_per_s=140.2,
            eta_s=0.0,
            elapsed_s=61.0,
        ),
    ]


def frozen_models() -> dict[str, dict]:
    """The models sections of m5, irina and the workstation: warm, loading, sleeping, cached and cold models on sim and transformers."""

    def model(name: str, machine: str, gpus: list[int], state: str, vram_gib: float, engine: str = "sim", **more) -> dict:
        return {
            "name": name,
            "machine": machine,
            "engine": engine,
            "state": state,
            "since": FROZEN_NOW - 600,
            "gpus": gpus,
            "vram_bytes": int(vram_gib * 1024**3),
            "cached_fraction": 1.0,
            "size_bytes": int(vram_gib * 1024**3),
            "load_s": 4.1,
            "warmup_s": 6.2,
            "wake_s": 0.8,
            "simulated": engine == "sim",
            **more,
        }

    warm = {"requests_running": 2, "requests_waiting": 1, "tokens_per_s": 80.0, "kv_cache_pct": 12.0}
    rotation = {
        "plan": [["codellama-7b", "phi-3-mini"], ["llama-3.1-8b"]],
        "every_s": 14400,
        "index": 0,
        "next_set": ["llama-3.1-8b"],
        "next_at": FROZEN_NOW + 5400,
        "wall_s": 3600,
        "overhead_pct": 0.587,
        "target_pct": 1,
    }
    return {
        "m5": {
            "models": [
                model("llama-3.1-8b", "m5", [1], "warm", 18, pinned=True, **warm),
                model(
                    "qwen2.5-coder-7b",
                    "m5",
                    [2],
                    "loading",
                    17,
                    progress={"phase": "loading", "done_bytes": 45, "total_bytes": 100},
                ),
                model("codellama-7b", "m5", [2], "cached", 16, load_s=None, warmup_s=None, wake_s=None),
            ],
            "rotation": rotation,
        },
        "irina": {
            "models": [
                model("mistral-7b-awq", "irina", [0], "warm", 4.5, **warm),
                model("phi-3-mini", "irina", [1], "sleeping", 4.5),
            ]
        },
        "workstation": {
            "models": [
                model(
                    "tiny-llama",
                    "workstation",
                    [],
                    "warm",
                    0,
                    engine="transformers",
                    cached_fraction=None,
                    wake_s=None,
                    requests_running=0,
                    requests_waiting=0,
                    tokens_per_s=0.0,
                ),
            ]
        },
    }
