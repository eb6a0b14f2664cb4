"""Agent overhead: 8 GPUs sampled at 1 Hz, one console subscribed, beside an nvitop-style loop measured in the same run.

    python bench/bench_agent_overhead.py [--nvml] [--via-sshd | --floor] [--window-s S] [--rounds N]

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
- `--floor`: in the agent's place, the least an agent that serves its own SSH port can be: the same loop plus an
  asyncssh server (ed25519 host key, one key login) streaming the 8 GPUs' fields to one client at 1 Hz.

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

from agents.shell.demo.lab import SCALE_GPUS, DemoLab
from agents.wire.agent_argv import agent_argv, python_agent
from agents.wire.lab.model import load_lab
from bench.common import CpuWindow, this_checkout_first
from console.lab.client import FleetClient

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
from agents.wire.lab.model import load_lab
from agents.telemetry.sim import SimSampler
machine = load_lab(sys.argv[1]).machines[0]
sampler = SimSampler(machine.gpus.sim, seed=machine.gpus.seed)
while True:
    for g in sampler.sample():
        g.util_pct, g.mem_used_bytes, g.power_w, g.temp_c, g.processes
    time.sleep(1.0)
"""

# the floor of an agent that serves its own SSH port: the loop above plus an asyncssh server (ed25519 host key, one
# public-key login) that streams the same 8 GPUs' fields to its one client at 1 Hz; nothing else of the agent
FLOOR = (
    SIM_LOOP.split("while True:")[0]
    + """
import asyncio, json
import asyncssh
host_key, client_key = asyncssh.generate_private_key("ssh-ed25519"), asyncssh.generate_private_key("ssh-ed25519")
client_key.write_private_key(sys.argv[2])

class Server(asyncssh.SSHServer):
    def begin_auth(self, username): return True
    def public_key_auth_supported(self): return True
    def validate_public_key(self, username, key): return key.public_data == client_key.public_data

async def stream(process):
    while True:
        process.stdout.write(json.dumps([[g.util_pct, g.mem_used_bytes, g.power_w, g.temp_c, len(g.processes)] for g in sampler.sample()]) + "\\n")
        await asyncio.sleep(1.0)

async def main():
    server = await asyncssh.create_server(Server, "127.0.0.1", 0, server_host_keys=[host_key], process_factory=stream, encoding="utf-8")
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""
)


def nvml_absent() -> str | None:
    """Why NVML cannot be used here, or None when it can."""
    try:
        import pynvml
    except ImportError:
        return "pynvml (nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
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
    writer.write(
        b'{"id": 1, "method": "hello", "params": {}}\n{"id": 2, "method": "subscribe", "params": {"topics": ["tick"]}}\n'
    )
    try:
        while await reader.readline():
            received[0] += 1
    finally:
        writer.close()


async def floor_run(tmp: Path, window_s: float, count: int) -> tuple[dict[str, tuple[list[float], list[float]]], int]:
    """The floor process (the loop plus an asyncssh server streaming its samples) beside the loop, its one client here."""
    import asyncssh

    lab = lab_source(tmp, nvml=False)
    repo = Path(__file__).resolve().parent.parent
    floor = subprocess.Popen(
        [sys.executable, "-c", FLOOR, str(lab), str(tmp / "client_key")], cwd=repo, stdout=subprocess.PIPE, text=True
    )
    loop = subprocess.Popen([sys.executable, "-c", SIM_LOOP, str(lab)], cwd=repo)
    try:
        assert floor.stdout is not None
        port = int(await asyncio.to_thread(floor.stdout.readline))
        async with asyncssh.connect(
            "127.0.0.1", port, username="bench", known_hosts=None, client_keys=[str(tmp / "client_key")]
        ) as conn:
            process = await conn.create_process("stream")
            received = [0]

            async def read() -> None:
                async for _line in process.stdout:
                    received[0] += 1

            reader = asyncio.create_task(read())
            await asyncio.sleep(5)
            figures = await rounds({"agent": floor.pid, "loop": loop.pid}, window_s, count)
            reader.cancel()
            return figures, received[0]
    finally:
        for proc in (loop, floor):
            proc.kill()
            proc.wait()


async def via_sshd_run(
    tmp: Path, nvml: bool, window_s: float, count: int
) -> tuple[dict[str, tuple[list[float], list[float]]], int]:
    """The agent of a via: sshd machine (no SSH port of its own) beside the loop, one console on its socket; lines received."""
    lab = lab_source(tmp, nvml, via_sshd=True)
    sock = tmp / "agent.sock"
    repo = Path(__file__).resolve().parent.parent
    with open(tmp / "agent.log", "wb") as log:
        agent = subprocess.Popen(
            agent_argv(python_agent(sys.executable), lab, "box", tmp / "state", log_level="warning", unix_socket=sock),
            cwd=repo,
            stdout=log,
            stderr=log,
        )
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
    parser.add_argument(
        "--via-sshd",
        action="store_true",
        help="the machine is via: sshd: the agent serves its unix socket only (no asyncssh), a console on that socket",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="in the agent's place, the floor of an SSH-serving agent: the same loop plus an asyncssh server streaming it",
    )
    parser.add_argument("--window-s", type=float, default=20.0, help="seconds per round (default 20)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the medians are printed (default 3)")
    args = parser.parse_args()
    this_checkout_first()
    if args.nvml and (why := nvml_absent()):
        print(
            f"bench_agent_overhead --nvml: skipped, no NVML here: {why}. Run it on a machine with NVIDIA GPUs "
            "(bench/gpu_check.sh --overhead-only); without --nvml it measures simulated GPUs."
        )
        return 0
    load_before = load_average()
    if args.floor:
        with tempfile.TemporaryDirectory(prefix="cetlab-bench-agent-") as tmp:
            figures, ticks = await floor_run(Path(tmp), args.window_s, args.rounds)
        return report(args, figures, ticks, str(len(SCALE_GPUS)), load_before)
    if args.via_sshd:
        with tempfile.TemporaryDirectory(prefix="cetlab-bench-agent-") as tmp:  # short: a socket path has at most 107 bytes
            figures, ticks = await via_sshd_run(Path(tmp), args.nvml, args.window_s, args.rounds)
        return report(args, figures, ticks, "all" if args.nvml else str(len(SCALE_GPUS)), load_before)
    with (
        tempfile.TemporaryDirectory(prefix="cetlab-bench-agent-") as tmp,
        DemoLab(Path(tmp) / "run", source=lab_source(Path(tmp), args.nvml)) as demo,
    ):
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


def report(
    args: argparse.Namespace, figures: dict[str, tuple[list[float], list[float]]], ticks: int, n_gpus: str, load_before: str
) -> int:
    cpu = {name: statistics.median(f[0]) for name, f in figures.items()}
    rss = {name: statistics.median(f[1]) for name, f in figures.items()}
    kind = "NVML" if args.nvml else "simulated"
    loop_name = "nvitop-style pynvml loop" if args.nvml else "nvitop-style loop over SimSampler"
    where = " (via: sshd, the console on the agent's unix socket)" if args.via_sshd else ""
    if args.floor:
        where = " (FLOOR: in the agent's place, the loop plus an asyncssh server streaming its samples to one client)"
    print(
        f"{n_gpus} {kind} GPUs at 1 Hz, one console subscribed{where} ({ticks} updates received); "
        f"{args.rounds} rounds of {args.window_s:.0f} s, medians; load average {load_before} -> {load_average()} (2 cores shared)"
    )
    for name, label in (("loop", loop_name), ("agent", "floor: loop + asyncssh server" if args.floor else "cetlab-agent")):
        print(
            f"  {label:34s}: CPU {cpu[name]:5.2f}% of one core (rounds {', '.join(f'{x:.2f}' for x in figures[name][0])}), "
            f"RSS {rss[name]:5.1f} MB"
        )
    rss_ratio = rss["agent"] / rss["loop"]
    cpu_ratio = cpu["agent"] / cpu["loop"] if cpu["loop"] > 0 else float("inf")
    who = "floor" if args.floor else "agent"
    print(
        f"{who} RSS {rss['agent']:.1f} MB / loop {rss['loop']:.1f} MB = {rss_ratio:.2f}x "
        f"(goal <= {RSS_GOAL}x: {'OK' if rss_ratio <= RSS_GOAL else 'MISSED'})"
    )
    print(
        f"{who} CPU {cpu['agent']:.2f}% of one core, {cpu_ratio:.1f}x the loop's {cpu['loop']:.2f}% "
        f"(goal <= {CPU_GOAL}%: {'OK' if cpu['agent'] <= CPU_GOAL else 'MISSED'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
