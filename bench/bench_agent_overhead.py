"""Agent overhead at 1 Hz with 8 simulated GPUs and one subscribed console, vs an idle Python.

Goals: under 1% of one core (issue 2); RSS at most 64 MB (issue 10). The baseline is a Python process
sleeping in an asyncio loop, measured in the same run, so the ratio shows what sampling,
serving and pushing cost on top of merely existing.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.lab import load_lab  # noqa: E402
from bench.common import CpuWindow  # noqa: E402
from console.client import FleetClient  # noqa: E402
from console.demo import SCALE_GPUS, DemoLab  # noqa: E402

WINDOW_S = 30.0


async def measure(pid: int) -> tuple[float, float]:
    window = CpuWindow(pid)
    await asyncio.sleep(WINDOW_S)
    return window.share_pct(), psutil.Process(pid).memory_info().rss / 2**20


async def main() -> None:
    idle = subprocess.Popen([sys.executable, "-c", "import asyncio; asyncio.run(asyncio.sleep(3600))"])
    directory = Path(tempfile.mkdtemp(prefix="cetlab-bench-agent-"))
    import yaml

    (directory / "src.yaml").write_text(yaml.safe_dump({"lab": "bench", "machines": [{"name": "box", "gpus": {"sim": SCALE_GPUS}}]}))
    with DemoLab(directory / "run", source=directory / "src.yaml") as demo:
        async with FleetClient(load_lab(demo.lab_path)) as client:
            await client.wait_connected(15)
            await asyncio.sleep(3)  # past start-up
            agent_pid = demo.processes[0].pid
            (agent_cpu, agent_rss), (idle_cpu, idle_rss) = await asyncio.gather(measure(agent_pid), measure(idle.pid))
            ticks = client.state.machines["box"].version
    idle.kill()
    print(f"window {WINDOW_S:.0f} s, 8 simulated GPUs at 1 Hz, one console subscribed ({ticks} updates received)")
    print(f"idle python   : {idle_cpu:5.2f}% of one core, RSS {idle_rss:5.1f} MB")
    print(f"cetlab-agent  : {agent_cpu:5.2f}% of one core, RSS {agent_rss:5.1f} MB")
    print(f"agent - idle  : {agent_cpu - idle_cpu:5.2f}% of one core (goal < 1%: {'OK' if agent_cpu < 1 else 'MISSED'}), "
          f"RSS {agent_rss:.1f} MB (goal <= 64 MB: {'OK' if agent_rss <= 64 else 'MISSED'})")


if __name__ == "__main__":
    asyncio.run(main())
