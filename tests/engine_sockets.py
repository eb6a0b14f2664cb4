"""Which addresses the engines of a running demo lab listen on (psutil), for the "never on the network" checks."""

from __future__ import annotations

import psutil

from agents.shell.demo.lab import DemoLab

ENGINE_MODULES = ("agents.orchestra.sim_server", "vllm", "transformers", "llama-server")


def engine_listeners(demo: DemoLab) -> list[tuple[int, str, int]]:
    """(pid, ip, port) of every listening socket of every engine under the demo's agents."""
    found = []
    for popen in demo.processes:
        try:
            agent = psutil.Process(popen.pid)
            if not any("agents.shell.daemon" in part for part in agent.cmdline()):
                continue  # the provider stand-in is no engine of the lab
            children = agent.children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for child in children:
            try:
                if not any(module in part for part in child.cmdline() for module in ENGINE_MODULES):
                    continue
                for conn in child.net_connections(kind="inet"):
                    if conn.status == psutil.CONN_LISTEN:
                        found.append((child.pid, conn.laddr.ip, conn.laddr.port))
            except psutil.NoSuchProcess:
                continue
    return found


def assert_engines_on_loopback(demo: DemoLab) -> list[tuple[int, str, int]]:
    """Every engine socket listens on 127.0.0.1 (returns them; at least one is expected)."""
    listeners = engine_listeners(demo)
    assert listeners, "no engine is listening: the check would prove nothing"
    beyond = [entry for entry in listeners if entry[1] != "127.0.0.1"]
    assert not beyond, f"engine sockets beyond loopback: {beyond}"
    return listeners
