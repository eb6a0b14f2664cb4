"""RPC round trip through a real agent (ping over SSH) vs a bare asyncssh echo, same run.

Goal (issue 2): agent round trip <= 2x the bare asyncssh echo.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import asyncssh

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from bench.common import percentile
from console.lab.client import FleetClient

CALLS = 1000
PACE_S = 1 / 150  # one call per pace at most: under the agent's per-connection rate limit (200/s), same for both
LAB = """
lab: bench
machines:
  - name: box
    gpus: {sim: [{name: "Tesla V100", memory_gib: 32, tdp_w: 250}]}
"""


class _Echo(asyncssh.SSHServerSession):
    def connection_made(self, chan):
        self._chan = chan

    def subsystem_requested(self, subsystem):
        return True

    def data_received(self, data, datatype):
        self._chan.write(data)


async def serve_echo() -> None:
    """The baseline server, in its own process like the agent."""
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    server = await asyncssh.listen("127.0.0.1", 0, server_host_keys=[host_key], encoding=None, server_factory=_AnyKeyServer)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.sleep(3600)


async def bare_echo_rtts(key_path: Path) -> list[float]:
    proc = await asyncio.create_subprocess_exec(sys.executable, __file__, "--serve-echo", stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    port = int(await proc.stdout.readline())
    try:
        return await _echo_client(key_path, port)
    finally:
        proc.kill()
        await proc.wait()


async def _echo_client(key_path: Path, port: int) -> list[float]:
    async with asyncssh.connect(
        "127.0.0.1", port, username="bench", client_keys=[str(key_path)], known_hosts=None, agent_path=None, config=None
    ) as conn:
        writer, reader, _ = await conn.open_session(subsystem="echo", encoding=None)
        rtts = []
        for i in range(CALLS):
            t0 = time.perf_counter()
            writer.write(b'{"id": %d, "method": "ping"}\n' % i)
            await reader.readline()
            rtts.append(time.perf_counter() - t0)
            await asyncio.sleep(max(0.0, PACE_S - rtts[-1]))
    return rtts


class _AnyKeyServer(asyncssh.SSHServer):
    def begin_auth(self, username):
        return True

    def public_key_auth_supported(self):
        return True

    def validate_public_key(self, username, key):
        return True

    def session_requested(self):
        return _Echo()


async def agent_rtts(lab_path: Path) -> list[float]:
    async with FleetClient(load_lab(lab_path), subscribe=[]) as client:
        await client.wait_connected(15)
        rtts = []
        for _ in range(CALLS):
            t0 = time.perf_counter()
            await client.call("box", "ping")
            rtts.append(time.perf_counter() - t0)
            await asyncio.sleep(max(0.0, PACE_S - rtts[-1]))
    return rtts


async def main() -> None:
    directory = Path(tempfile.mkdtemp(prefix="cetlab-bench-rpc-"))
    (directory / "src.yaml").write_text(LAB)
    with DemoLab(directory / "run", source=directory / "src.yaml") as demo:
        lab = load_lab(demo.lab_path)
        key = lab.resolve(lab.console.key)
        assert key is not None, "the demo lab names the console's key"
        await bare_echo_rtts(key)  # warm both paths once
        await agent_rtts(demo.lab_path)
        bare = await bare_echo_rtts(key)
        agent = await agent_rtts(demo.lab_path)
    for name, values in (("bare asyncssh echo", bare), ("agent ping (FleetClient)", agent)):
        print(
            f"{name:<26} p50 {percentile(values, 50) * 1e3:6.3f} ms   p95 {percentile(values, 95) * 1e3:6.3f} ms   ({CALLS} calls)"
        )
    ratio = percentile(agent, 50) / percentile(bare, 50)
    print(f"ratio agent/bare (p50): {ratio:.2f}x   goal <= 2x   {'OK' if ratio <= 2 else 'MISSED'}")


if __name__ == "__main__":
    # The echo test server takes any key and the echo client skips host-key checks: benchmark only.
    asyncio.run(serve_echo() if "--serve-echo" in sys.argv else main())
