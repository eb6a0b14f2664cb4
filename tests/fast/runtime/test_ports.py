"""Ports for servers: below the ephemeral range (outgoing connections take theirs from it), and claimed, so two
choosers of this user at once never hand out the same port (a test's gateway lost its port to another lab's)."""

from __future__ import annotations

import os

from agents.runtime import ports
from agents.shell.demo.lab import free_ports


def test_server_ports_come_from_below_the_ephemeral_range(tmp_path):
    low = ports.ephemeral_low()
    chosen = {ports.server_port() for _ in range(20)}
    assert all(ports.LOWEST <= port < low for port in chosen), chosen
    assert all(ports.is_free(port) for port in chosen)
    (tmp_path / "range").write_text("40000\t60999\n")
    assert (
        ports.ephemeral_low(tmp_path / "range") == 40000
        and ports.ephemeral_low(tmp_path / "missing") == ports.DEFAULT_EPHEMERAL_LOW
    )


def test_a_claimed_port_is_not_claimed_again_until_its_claim_is_stale(tmp_path):
    assert ports.claim(25001, tmp_path, now=1000.0)
    assert not ports.claim(25001, tmp_path, now=1000.0 + ports.CLAIM_S - 1)  # another chooser, soon after: refused
    assert ports.claim(25002, tmp_path, now=1001.0)  # another port: free to claim
    assert ports.claim(25001, tmp_path, now=1000.0 + ports.CLAIM_S + 1)  # stale: taken over, and fresh again
    assert not ports.claim(25001, tmp_path, now=1000.0 + ports.CLAIM_S + 2)


def test_every_port_chosen_is_claimed_and_none_twice():
    chosen = [ports.server_port("127.0.0.1") for _ in range(30)] + free_ports(30)
    assert len(set(chosen)) == len(chosen)
    folder = ports.claims_dir()
    assert all((folder / str(port)).exists() for port in chosen)
    assert oct(folder.stat().st_mode & 0o777) == oct(0o700) and folder.stat().st_uid == os.geteuid()
    assert not any(ports.claim(port) for port in chosen)  # what another chooser of this user would be told


def test_with_nowhere_to_claim_a_port_is_still_chosen(tmp_path):
    assert ports.claim(25003, tmp_path / "missing")  # the claim cannot be written: chosen as before, unclaimed
