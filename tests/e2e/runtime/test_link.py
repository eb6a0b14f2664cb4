"""The one client core (agents/runtime/link.py): its state machine, pending table, read loop and typed views.

The agent's side here is a scripted JSON-lines peer over a real socket pair: the core does not care how the
bytes travel (SSH, a machine's sshd or OpenSSH are the openers', tested with real agents elsewhere), and a
script can answer as no healthy agent would (silence, a dropped connection, another machine's name).
"""

from __future__ import annotations

import yaml

from agents.runtime.link import LinkCore
from agents.runtime.peers import PeerClient
from agents.wire.lab.model import parse_lab
from agents.wire.protocol import LinkStatus
from console.lab.client import FleetClient

LAB = parse_lab(yaml.safe_dump({"lab": "link-test", "machines": [{"name": "box", "gpus": {"sim": []}}]}))


def test_the_console_and_the_peers_are_built_on_the_same_core(tmp_path):
    fleet = FleetClient(LAB, key_path=tmp_path / "key", known_hosts=tmp_path / "known_hosts")
    peers = PeerClient(LAB, tmp_path)
    assert isinstance(fleet.core, LinkCore) and isinstance(peers.core, LinkCore)
    assert fleet.links["box"].status is peers.links["box"].status is LinkStatus.CONNECTING
    assert peers.view("box") is peers.views.machines["box"] and fleet.state.machines["box"].link is LinkStatus.CONNECTING
