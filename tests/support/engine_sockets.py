"""Where the engines of a running demo lab listen (psutil), for the "no other user reaches an engine" checks."""

from __future__ import annotations

import psutil

from agents.shell.demo.lab import DemoLab

ENGINE_MODULES = (
    "agents.orchestra.engines.vllm.twin",
    "agents.orchestra.engines.llamacpp.twin",
    "vllm",
    "transformers",
    "llama-server",
)
TCP_ENGINES = ("transformers",)  # `transformers serve` has no unix-socket option: 127.0.0.1, with the doctor's warning


def engine_listeners(demo: DemoLab) -> list[tuple[int, str, str]]:
    """(pid, "inet" or "unix", its address) of every listening socket of every engine under the demo's agents."""
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
                cmdline = child.cmdline()
                if not any(module in part for part in cmdline for module in ENGINE_MODULES):
                    continue
                tcp_ok = any(module in part for part in cmdline for module in TCP_ENGINES)
                for conn in child.net_connections(kind="inet"):
                    if conn.status == psutil.CONN_LISTEN:
                        found.append((child.pid, "inet" if not tcp_ok else "inet-allowed", f"{conn.laddr.ip}:{conn.laddr.port}"))
                for conn in child.net_connections(kind="unix"):
                    if conn.laddr and str(conn.laddr).endswith(".sock") and not conn.raddr:
                        found.append((child.pid, "unix", str(conn.laddr)))
            except psutil.NoSuchProcess:
                continue
    return found


def assert_engines_on_sockets(demo: DemoLab) -> list[tuple[int, str, str]]:
    """Every engine listens on a unix socket of its agent's and on no TCP port (`transformers serve`, which has no
    socket option, on 127.0.0.1 only). Returns the listeners; at least one is expected."""
    listeners = engine_listeners(demo)
    assert listeners, "no engine is listening: the check would prove nothing"
    on_tcp = [
        entry
        for entry in listeners
        if entry[1] == "inet" or (entry[1] == "inet-allowed" and not entry[2].startswith("127.0.0.1:"))
    ]
    assert not on_tcp, f"engines listening on TCP: {on_tcp}"
    return listeners
