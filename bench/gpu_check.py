"""The GPU check's steps (run through bench/gpu_check.sh, which stops first where there is no NVIDIA GPU).

Each step prints what it measured; a step that fails says so and the run exits 1 at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import traceback
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agents.shell.demo.lab import DemoLab  # noqa: E402
from agents.wire.catalogue.agent import STATUS, StatusReply  # noqa: E402
from agents.wire.catalogue.costs import COSTS_GET, CostsParams  # noqa: E402
from agents.wire.catalogue.jobs import JOBS_GET, JOBS_START, JobParams, StartParams  # noqa: E402
from agents.wire.catalogue.method import Method, P, R, request  # noqa: E402
from agents.wire.catalogue.models import MODELS_COLD, MODELS_GET, MODELS_WARM, ModelParams  # noqa: E402
from agents.wire.lab.model import load_lab  # noqa: E402
from bench.common import CpuWindow  # noqa: E402
from console.lab.client import FleetClient  # noqa: E402

MACHINE = "gpu"
# ~150M parameters with the tiny tokenizer's small vocabulary: the layers carry the weight
LLAMA_150M = {
    "hidden_size": 1024,
    "intermediate_size": 2752,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "max_position_embeddings": 512,
}
MATMUL = """
import sys, time, torch
major, _ = torch.cuda.get_device_capability(0)
dtype = torch.bfloat16 if major >= 8 else torch.float16 if major >= 7 else torch.float32
a = torch.randn(8192, 8192, device="cuda", dtype=dtype); b = torch.randn(8192, 8192, device="cuda", dtype=dtype)
print(f"matmul load: {dtype} on {torch.cuda.get_device_name(0)}", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
"""
# what nvitop does each refresh: every device's utilisation, memory, power and processes
NVML_LOOP = """
import time, pynvml
pynvml.nvmlInit()
handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
while True:
    for h in handles:
        pynvml.nvmlDeviceGetUtilizationRates(h); pynvml.nvmlDeviceGetMemoryInfo(h); pynvml.nvmlDeviceGetPowerUsage(h)
        pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU); pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    time.sleep(1.0)
"""

failures: list[str] = []


def step(title: str) -> None:
    print(f"\n== {title}", flush=True)


def failed(what: str) -> None:
    failures.append(what)
    print(f"FAILED: {what}", flush=True)


def cetlab_json(lab: Path, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "console.cli.main", "--lab", str(lab), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode != 0:
        raise RuntimeError(f"cetlab {' '.join(args)} exited {out.returncode}: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout)


def gpu_lines(status: dict, gpu: int, agent_status: StatusReply | None = None) -> list[str]:
    """GPU ``gpu`` as `cetlab --json status` shows it; its processes from the agent's own `status` (the CLI's JSON has none)."""
    machine = next(m for m in status["machines"] if m["name"] == MACHINE) if "machines" in status else status
    sample = next(g for g in machine["gpus"] if g["index"] == gpu)
    lines = [
        f"GPU {gpu} {sample['name']}: util {sample['util_pct']}%, power {sample['power_w']} W, "
        f"{(sample['mem_used_bytes'] or 0) / 2**20:.0f} MiB used, {sample['temp_c']} C, simulated={sample.get('simulated')}"
    ]
    if agent_status is None:
        return lines + ["  processes: not asked (the agent's `status` lists them)"]
    held = next((g.processes for g in agent_status.gpus if g.index == gpu), None) or []
    lines += [f"  pid {p.pid} {p.user} {(p.mem_used_bytes or 0) / 2**20:.0f} MiB {str(p.command)[:80]}" for p in held] or [
        "  no process holds it"
    ]
    return lines


async def show_gpu(lab: Path, client: FleetClient, gpu: int) -> None:
    try:
        print("\n".join(gpu_lines(cetlab_json(lab, "status"), gpu, await request(client, MACHINE, STATUS))))
    except Exception:
        traceback.print_exc()
        failed("status step raised")


def write_lab(work: Path, model: Path, gpu: int) -> Path:
    train = work / "train.yaml"
    train.write_text(
        yaml.safe_dump(
            {
                "base_model": str(model),
                "dataset": str(REPO / "demo" / "train.jsonl"),
                "output_dir": str(work / "out"),
                "max_seq_len": 128,
                "precision": "auto",
                "tf32": True,
                "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"},
                "per_device_batch_size": 16,
                "max_steps": 150,
                "save_steps": 75,
                "logging_steps": 10,
                "learning_rate": 3e-4,
                "dataloader_workers": 2,
            }
        )
    )
    source = work / "src.yaml"
    source.write_text(
        yaml.safe_dump(
            {
                "lab": "gpu-check",
                "costs": {"currency": "USD", "electricity_per_kwh": 0.15},
                "machines": [{"name": MACHINE, "gpus": "nvml", "sample_interval_s": 1}],
                "trainers": [
                    {
                        "name": "lora",
                        "machine": MACHINE,
                        "gpus": [gpu],
                        "command": ["cetlab-train", "--config", str(train), "--output-dir", "{output_dir}"],
                        "output_dir": str(work / "runs" / "{job_id}"),
                    }
                ],
                "models": [
                    {
                        "name": "llama-150m",
                        "path": str(model),
                        "engine": "transformers",
                        "machine": MACHINE,
                        "gpus": [gpu],
                        "vram_gib": 1.0,
                        "load_timeout_s": 600,
                    }
                ],
            },
            sort_keys=False,
        )
    )
    return source


async def wait(client: FleetClient, method: Method[P, R], params: P, done: Callable[[R], bool], timeout_s: float) -> R:
    deadline = time.monotonic() + timeout_s
    while True:
        found = await request(client, MACHINE, method, params)
        if done(found) or time.monotonic() > deadline:
            return found
        await asyncio.sleep(1.0)


async def lora(client: FleetClient) -> None:
    step("a LoRA through the agent, precision: auto, on the ~150M random Llama")
    job = await request(client, MACHINE, JOBS_START, StartParams(recipe="lora", params={}))
    done = await wait(client, JOBS_GET, JobParams(id=job.id), lambda j: j.state in ("exited", "failed", "lost"), 1800)
    print(f"job {job.id}: {done.state} (exit {done.exit_code}), precision {done.precision}, notes {done.notes}")
    print(f"  step {done.step}/{done.max_steps}, loss {done.loss}, {done.samples_per_s} samples/s, {done.tokens_per_s} tokens/s")
    print(f"  checkpoints: {[(c.step, c.save_s) for c in done.checkpoints]} (step, save seconds)")
    if done.state != "exited" or done.exit_code != 0:
        failed(f"LoRA job {done.state}: {done.error}; last lines: {done.last_lines}")


async def transformers_model(client: FleetClient) -> None:
    step("a transformers model: warm -> completion -> cold")
    started = time.monotonic()
    await request(client, MACHINE, MODELS_WARM, ModelParams(model="llama-150m"))
    model = await wait(
        client, MODELS_GET, ModelParams(model="llama-150m"), lambda m: m.state in ("warm", "failed") and not m.op, 900
    )
    print(f"state {model.state} after {time.monotonic() - started:.1f} s (load {model.load_s} s, warm-up {model.warmup_s} s)")
    if model.state != "warm" or model.endpoint is None:
        failed(f"transformers model {model.state}: {model.error}")
        return
    body = json.dumps({"model": model.served_name, "prompt": "The capital of France is", "max_tokens": 16}).encode()
    completion = urllib.request.Request(model.endpoint + "/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    answer = await asyncio.to_thread(lambda: json.loads(urllib.request.urlopen(completion, timeout=120).read()))
    print(f"completion in {time.monotonic() - t0:.2f} s: {answer['choices'][0]['text']!r} ({answer['usage']})")
    status = await request(client, MACHINE, STATUS)
    held = [p for g in status.gpus for p in g.processes if "serve" in str(p.command) and "llama-150m" in str(p.command)]
    print(
        f"NVML: the engine's processes hold {[(p.pid, round((p.mem_used_bytes or 0) / 2**20)) for p in held]} (pid, MiB); "
        f"lab.yaml estimate {model.vram_bytes / 2**20:.0f} MiB"
    )
    await request(client, MACHINE, MODELS_COLD, ModelParams(model="llama-150m"), timeout=120)
    cold = await wait(
        client, MODELS_GET, ModelParams(model="llama-150m"), lambda m: m.state in ("cold", "cached") and not m.op, 120
    )
    print(f"then {cold.state}")


async def overhead(agent_pid: int, window_s: float) -> None:
    step(f"overhead over {window_s:.0f} s: the agent beside an nvitop-style NVML loop and `nvidia-smi -l 1`")
    loop = subprocess.Popen([sys.executable, "-c", NVML_LOOP])
    smi = subprocess.Popen(["nvidia-smi", "-l", "1"], stdout=subprocess.DEVNULL)
    try:
        await asyncio.sleep(3)  # past their start-up
        windows = {
            name: CpuWindow(pid)
            for name, pid in (("cetlab-agent", agent_pid), ("nvml loop", loop.pid), ("nvidia-smi -l 1", smi.pid))
        }
        await asyncio.sleep(window_s)
        cpu = {name: w.share_pct() for name, w in windows.items()}
        rss = {name: psutil.Process(w.proc.pid).memory_info().rss / 2**20 for name, w in windows.items()}
    finally:
        loop.kill()
        smi.kill()
    for name in cpu:
        print(f"{name:16}: {cpu[name]:5.2f}% of one core, RSS {rss[name]:6.1f} MB")
    for name in ("nvml loop", "nvidia-smi -l 1"):
        ratio = cpu["cetlab-agent"] / cpu[name] if cpu[name] > 0 else float("inf")
        print(f"agent / {name}: CPU x{ratio:.2f}, RSS x{rss['cetlab-agent'] / rss[name]:.2f}")


async def run(work: Path, gpu: int, window_s: float) -> None:
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device (a CPU-only torch build?); nothing was run", file=sys.stderr)
        sys.exit(3)
    from agents.train.tiny import make_tiny_model

    step("a ~150M-parameter random Llama, made here")
    model = make_tiny_model(work / "llama-150m", shape=LLAMA_150M)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    print(
        f"{model}: {sum(f.stat().st_size for f in model.glob('*.safetensors')) / 2**20:.0f} MiB of weights, "
        f"hidden {config.hidden_size} x {config.num_hidden_layers} layers"
    )
    source = write_lab(work, model, gpu)

    with DemoLab(work / "run", source=source) as demo:
        step("cetlab-agent doctor")
        doctor = subprocess.run(
            [
                sys.executable,
                "-m",
                "agents.shell.daemon",
                "doctor",
                "--lab",
                str(demo.lab_path),
                "--machine",
                MACHINE,
                "--state-dir",
                str(demo.dir / "agents" / MACHINE),
            ],
            capture_output=True,
            text=True,
        )
        print(doctor.stdout.rstrip())
        if doctor.returncode != 0:
            failed("doctor reported FAIL")
        async with FleetClient(load_lab(demo.lab_path)) as client:
            await client.wait_connected(30)
            step("cetlab status --json, idle")
            await asyncio.sleep(3)
            await show_gpu(demo.lab_path, client, gpu)
            step("cetlab status --json, under a matmul load")
            load = subprocess.Popen(
                [sys.executable, "-c", MATMUL, "25"],
                env={**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
            )
            await asyncio.sleep(12)
            await show_gpu(demo.lab_path, client, gpu)
            load.wait()
            for name, part in (("LoRA", lambda: lora(client)), ("transformers", lambda: transformers_model(client))):
                try:
                    await part()
                except Exception:
                    traceback.print_exc()
                    failed(f"{name} step raised")
            step("costs from the measured power")
            print((await request(client, MACHINE, COSTS_GET, CostsParams(by="job"))).model_dump_json(indent=1)[:3000])
            await overhead(demo.processes[0].pid, window_s)


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu_check.sh", description=__doc__)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--window-s", type=float, default=30.0)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(run(args.dir.resolve(), args.gpu, args.window_s))
    print(f"\ngpu_check: {'all steps passed' if not failures else f'{len(failures)} step(s) failed: ' + '; '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
