"""A simulated llama.cpp rpc-server (SIMULATED), for a sim-llamacpp model spread over simulated machines: rpc-server's
contract as cetlab uses it (--host, --port, its start banner, a connection per client held open, the lines it prints
for each), no tensors. Like the real one it warns when bound to anything but 127.0.0.1; cetlab never does that.

    python -m agents.orchestra.engines.llamacpp.twin_rpc_server --host 127.0.0.1 --port 50052 --sim-parent-pid PID
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading

from agents.orchestra.twins.process import exit_with_parent


def say(line: str) -> None:
    print(line, flush=True)


def serve(client: socket.socket) -> None:
    """Hold one client's connection until it closes (the real one answers its RPC commands; this one reads them)."""
    with client:
        while client.recv(65536):
            pass
    say("Client connection closed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sim_rpc_server")
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=50052)
    parser.add_argument("-t", "--threads", type=int, default=1)
    parser.add_argument("--sim-parent-pid", type=int)
    args = parser.parse_args(argv)
    if args.sim_parent_pid:
        threading.Thread(target=exit_with_parent, args=(args.sim_parent_pid,), daemon=True).start()
    if args.host != "127.0.0.1":
        say(f"WARNING: Host ('{args.host}') is != '127.0.0.1'\n         Never expose the RPC server to an open network!")
    say("Starting RPC server v3.0.0 (SIMULATED)")
    say(f"  endpoint       : {args.host}:{args.port}")
    say("Devices:\n  SIM: simulated GPUs (no tensors are kept)")
    try:
        listener = socket.create_server((args.host, args.port))
    except OSError as exc:
        say(f"Failed to create server socket ({exc.strerror})")
        return 1
    while True:
        client, _ = listener.accept()
        say("Accepted client connection")
        threading.Thread(target=serve, args=(client,), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
