"""Agent overhead: 8 GPUs sampled at 1 Hz, one console subscribed, beside an nvitop-style loop measured in the same run.

    python bench/bench_agent_overhead.py [--nvml] [--via-sshd] [--window-s S] [--rounds N]

Goals (issue 22): the agent's RSS <= 1.3x the loop's, and the agent's CPU <= 0.25% of one core.

- default (simulated GPUs, any machine): the agent serves one machine of 8 simulated GPUs; the
  baseline is a small Python process that polls the same 8 GPUs through the agent's own simulated
  sampler (`SimSampler.sample()`) at 1 Hz, as nvitop polls NVML: so the ratio does not depend on the
  machine it runs on.
- `--nvml` (a machine with NVIDIA GPUs; bench/gpu_check.sh --overhead-only runs it): the agent with
  `gpus: nvml`; the baseline is the nvitop-style loop over pynvml (utilisation, memory, power,
  temperature and processes of every device at 1 Hz). Without NVML it says so and stops (exit 0,
  no figures): nothing here needs a GPU.
- `--via-sshd`: the machine is `via: sshd` (consoles come through its sshd to the agent's unix socket): the
  agent serves no SSH port and never loads asyncssh; the console here is a plain client of that socket
  (hello, then subscribed to ticks), which is what sshd's direct-streamlocal channel hands the agent.

The CPU figures are CPU seconds over wall seconds of each process (its own work, which the load of a
shared machine barely changes), measured in ROUNDS windows side by side; the median is printed, and
the load average, since a busy machine still shifts them somewhat. RSS is read at the end of each round.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.lab import load_lab  # noqa: E402
from bench.common import CpuWindow, this_checkout_first  # noqa: E402
from console.client import FleetClient  # noqa: E402
from console.demo import SCALE_GPUS, DemoLab  # noqa: E402

RSS_GOAL = 1.3  # x the loop's RSS
CPU_GOAL = 0.25  # % of one core

# what nvitop does each refresh: every device's utilisation, memory, power, temperature and processes
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
# the same loop over the agent's simulated sampler: the same 8 GPUs, the same fields, at 1 Hz
SIM_LOOP = """
import sys, time
from agents.lab import load_lab
from agents.telemetry.sim import SimSampler
machine = load_lab(sys.argv[1]).machines[0]
sampler = SimSampler(machine.gpus.sim, seed=machine.gpus.seed)
while True:
    for g in sampler.sample():
        g.util_pct, g.mem_used_bytes, g.power_w, g.temp_c, g.processes
    time.sleep(1.0)
"""


def nvml_absent() -> str | None:
    """Why NVML cannot be used here, or None when it can."""
    try:
        import pynvml
    except ImportError:
        return "pynvml (nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...: all mean "no NVML"
        return f"NVML does not start ({exc})"
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    return None if count else "NVML lists no GPU"


def lab_source(directory: Path, nvml: bool, via_sshd: bool = False) -> Path:
    import yaml

    gpus: object = "nvml" if nvml else {"sim": SCALE_GPUS}
    source = directory / "src.yaml"
    machine: dict[str, object] = {"name": "box", "gpus": gpus, **({"via": "sshd"} if via_sshd else {})}
    source.write_text(yaml.safe_dump({"lab": "bench", "machines": [machine]}))
    return source


async def socket_console(path: Path, received: list[int]) -> None:
    """A console on the agent's unix socket: hello, subscribed to ticks, reading every line (counted in received[0])."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(b'{"id": 1, "method": "hello", "params": {}}\n{"id": 2, "method": "subscribe", "params": {"topics": ["tick"]}}\n')
    try:
        while await reader.readline():
            received[0] += 1
    finally:
        writer.close()


async def via_sshd_run(tmp: Path, nvml: bool, window_s: float, count: int) -> tuple[dict[str, tuple[list[float], list[float]]], int]:
    """The agent of a via: sshd machine (no SSH port of its own) beside the loop, one console on its socket; lines received."""
    lab = lab_source(tmp, nvml, via_sshd=True)
    sock = tmp / "agent.sock"
    repo = Path(__file__).resolve().parent.parent
    with open(tmp / "agent.log", "wb") as log:
        agent = subprocess.Popen([sys.executable, "-m", "agents.daemon", "--log-level", "warning", "serve", "--lab", str(lab), "--machine", "box",
                                  "--state-dir", str(tmp / "state"), "--unix-socket", str(sock)], cwd=repo, stdout=log, stderr=log)
    loop = subprocess.Popen([sys.executable, "-c", NVML_LOOP] if nvml else [sys.executable, "-c", SIM_LOOP, str(lab)], cwd=repo)
    try:
        for _ in range(600):
            if sock.exists() or agent.poll() is not None:
                break
            await asyncio.sleep(0.1)
        if not sock.exists():
            raise RuntimeError(f"the agent did not open its socket: {(tmp / 'agent.log').read_text()[-2000:]}")
        received = [0]
        console = asyncio.create_task(socket_console(sock, received))
        await asyncio.sleep(5)  # past start-up: the first full tick, the console's first requests
        figures = await rounds({"agent": agent.pid, "loop": loop.pid}, window_s, count)
        console.cancel()
        return figures, received[0]
    finally:
        for proc in (loop, agent):
            proc.kill()
            proc.wait()


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def rounds(pids: dict[str, int], window_s: float, count: int) -> dict[str, tuple[list[float], list[float]]]:
    """Per process: CPU % of one core and RSS MB, one of each per round."""
    figures: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in pids}
    for _ in range(count):
        windows = {name: CpuWindow(pid) for name, pid in pids.items()}
        await asyncio.sleep(window_s)
        for name, window in windows.items():
            figures[name][0].append(window.share_pct())
            figures[name][1].append(psutil.Process(pids[name]).memory_info().rss / 2**20)
    return figures


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nvml", action="store_true", help="the agent on real NVML beside a pynvml loop (a GPU machine)")
    parser.add_argument("--via-sshd", action="store_true",
                        help="the machine is via: sshd: the agent serves its unix socket only (no asyncssh), a console on that socket")
    parser.add_argument("--window-s", type=float, default=20.0, help="seconds per round (default 20)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the medians are printed (default 3)")
    args = parser.parse_args()
    this_checkout_first()
    if args.nvml and (why := nvml_absent()):
        print(f"bench_agent_overhead --nvml: skipped, no NVML here: {why}. Run it on a machine with NVIDIA GPUs "
              "(bench/gpu_check.sh --overhead-only); without --nvml it measures simulated GPUs.")
        return 0
    load_before = load_average()
    if args.via_sshd:
        with tempfile.TemporaryDirectory(prefix="cetlab-bench-agent-") as tmp:  # short: a socket path has at most 107 bytes
            figures, ticks = await via_sshd_run(Path(tmp), args.nvml, args.window_s, args.rounds)
        return report(args, figures, ticks, "all" if args.nvml else str(len(SCALE_GPUS)), load_before)
    with tempfile.TemporaryDirectory(prefix="cetlab-bench-agent-") as tmp, \
            DemoLab(Path(tmp) / "run", source=lab_source(Path(tmp), args.nvml)) as demo:
        loop_argv = [sys.executable, "-c", NVML_LOOP] if args.nvml else [sys.executable, "-c", SIM_LOOP, str(demo.lab_path)]
        loop = subprocess.Popen(loop_argv, cwd=Path(__file__).resolve().parent.parent)
        try:
            async with FleetClient(load_lab(demo.lab_path)) as client:
                await client.wait_connected(30)
                await asyncio.sleep(5)  # past start-up: the first full tick, the console's first requests
                figures = await rounds({"agent": demo.processes[0].pid, "loop": loop.pid}, args.window_s, args.rounds)
                ticks = client.state.machines["box"].version
                n_gpus = len(client.state.machines["box"].gpus)
        finally:
            loop.kill()
            loop.wait()
    return report(args, figures, ticks, str(n_gpus), load_before)


def report(args: argparse.Namespace, figures: dict[str, tuple[list[float], list[float]]], ticks: int, n_gpus: str, load_before: str) -> int:
    cpu = {name: statistics.median(f[0]) for name, f in figures.items()}
    rss = {name: statistics.median(f[1]) for name, f in figures.items()}
    kind = "NVML" if args.nvml else "simulated"
    loop_name = "nvitop-style pynvml loop" if args.nvml else "nvitop-style loop over SimSampler"
    where = " (via: sshd, the console on the agent's unix socket)" if args.via_sshd else ""
    print(f"{n_gpus} {kind} GPUs at 1 Hz, one console subscribed{where} ({ticks} updates received); "
          f"{args.rounds} rounds of {args.window_s:.0f} s, medians; load average {load_before} -> {load_average()} (2 cores shared)")
    for name, label in (("loop", loop_name), ("agent", "cetlab-agent")):
        print(f"  {label:34s}: CPU {cpu[name]:5.2f}% of one core (rounds {', '.join(f'{x:.2f}' for x in figures[name][0])}), "
              f"RSS {rss[name]:5.1f} MB")
    rss_ratio = rss["agent"] / rss["loop"]
    cpu_ratio = cpu["agent"] / cpu["loop"] if cpu["loop"] > 0 else float("inf")
    print(f"agent RSS {rss['agent']:.1f} MB / loop {rss['loop']:.1f} MB = {rss_ratio:.2f}x "
          f"(goal <= {RSS_GOAL}x: {'OK' if rss_ratio <= RSS_GOAL else 'MISSED'})")
    print(f"agent CPU {cpu['agent']:.2f}% of one core, {cpu_ratio:.1f}x the loop's {cpu['loop']:.2f}% "
          f"(goal <= {CPU_GOAL}%: {'OK' if cpu['agent'] <= CPU_GOAL else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
