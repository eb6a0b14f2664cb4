"""What tests/e2e/cli/test_lab_doctor.py, tests/fast/cli/test_lab_doctor.py share: P40, TWO, connected."""

from __future__ import annotations

from agents.wire.protocol import Role

P40 = {"name": "Tesla P40", "memory_gib": 24, "tdp_w": 250}


TWO = {
    "lab": "test-lab",
    "machines": [
        {"name": "box", "gpus": {"sim": [P40]}},
        {"name": "ghost", "host": "127.0.0.1", "port": 9, "gpus": "none"},
    ],
    "gateway": {"machine": "box", "port": 0},
}


async def connected(lab, role: Role = Role.OPERATOR):
    client = lab.client(role)
    await client.start()
    await client.wait_connected(10)
    return client
