"""The demo lab's gateway: its peer key and known hosts, a demo API key, the simulated cloud provider."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agents.gateway.keys import KeyStore
from agents.orchestra import pagecache
from agents.runtime.demo import ANY_GATEWAY_PORT_ENV, GATEWAY_KEY_FILE
from agents.runtime.keys import ensure_key, write_private
from agents.runtime.peers import PEER_KEY_NAME, PEER_KNOWN_HOSTS_NAME
from agents.runtime.store import Store
from agents.wire.catalogue.gateway import KeyAddParams

STAND_IN_TOKENS_PER_S = 80.0  # the simulated provider's speed


def _state(directory: Path, data: dict[str, Any]) -> Path:
    machine: str = data["gateway"]["machine"]
    return directory / "agents" / machine


def peer_key_line(directory: Path, data: dict[str, Any]) -> str:
    """The authorized_keys line giving the gateway's agent the gateway role on a machine ('' without a gateway)."""
    if not data.get("gateway"):
        return ""
    key = ensure_key(_state(directory, data) / PEER_KEY_NAME, comment=f"cetlab-gateway@{data['gateway']['machine']}")
    kind, blob = key.export_public_key().decode().split()[:2]
    return f"gateway {kind} {blob} gateway@{data['gateway']['machine']}\n"


def _free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the gateway binds: a closed run's TIME_WAIT is no owner
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def prepare(directory: Path, data: dict[str, Any], known_hosts: str, free_ports: Callable[[int], list[int]]) -> None:
    """Rewrite `gateway:` and the simulated providers for ports `free_ports` finds; a demo key at console/gateway.key."""
    if not data.get("gateway"):
        return
    stand_ins = [p for p in data.get("providers") or [] if p.get("simulated")]
    ports = free_ports(1 + len(stand_ins))
    # the port lab.yaml names is kept when it is free, so clients keep their URL (tests, many demos at once: any port)
    named = None if os.environ.get(ANY_GATEWAY_PORT_ENV) else data["gateway"].get("port")
    data["gateway"].update(host="127.0.0.1", port=named if isinstance(named, int) and named and _free(named) else ports[0])
    for provider, port in zip(stand_ins, ports[1:]):
        provider["base_url"] = f"http://127.0.0.1:{port}/v1"
    state = _state(directory, data)
    write_private(state / PEER_KNOWN_HOSTS_NAME, known_hosts.encode())
    key_file = directory / GATEWAY_KEY_FILE
    if not key_file.exists():
        store = Store(state / "state.db")
        try:
            token = KeyStore(store, lambda: "").add(KeyAddParams(name="demo"))
        finally:
            store.close()
        write_private(key_file, (token + "\n").encode())


def stand_in_argvs(directory: Path, data: dict[str, Any]) -> list[list[str]]:
    """The simulated providers: the sim engine (any model name, no delays but its token rate), SIMULATED."""
    argvs = []
    for provider in data.get("providers") or []:
        if not provider.get("simulated"):
            continue
        path = directory / "providers" / provider["name"]
        if not path.exists():
            pagecache.write_placeholder(path, 1024 * 1024)
        argvs.append(
            [
                sys.executable,
                "-m",
                "agents.orchestra.engines.vllm.twin",
                "--port",
                str(urlsplit(provider["base_url"]).port),
                "--served-name",
                provider["name"],
                "--path",
                str(path),
                "--load-s",
                "0",
                "--warmup-s",
                "0",
                "--wake-s",
                "0",
                "--tokens-per-s",
                str(STAND_IN_TOKENS_PER_S),
            ]
        )
    return argvs
