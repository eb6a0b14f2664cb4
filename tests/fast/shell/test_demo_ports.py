"""The demo's ports are never ones the kernel hands an outgoing connection: an agent restarted on its port found it
taken by some client's connection ("address already in use") when they were picked by bind(0)."""

from __future__ import annotations

import socket

from agents.runtime.ports import ephemeral_low
from agents.shell.demo.lab import free_ports


def test_demo_ports_are_free_and_below_the_ephemeral_range():
    low = ephemeral_low()
    ports = free_ports(50)
    assert all(port < low for port in ports) and len(set(ports)) == len(ports)
    for port in ports[:5]:  # free now: each binds
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_given():
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_ports(1)[0]))
        held.listen()
        taken = held.getsockname()[1]
        assert all(taken != port for _ in range(20) for port in free_ports(10))
