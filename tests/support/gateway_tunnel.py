"""What tests/e2e/gateway/test_tunnel.py, tests/fast/gateway/test_tunnel.py share: LAB."""

from __future__ import annotations

from tests.support.gateway import P4, sim_model

LAB = {
    "lab": "tunnel-test",
    "machines": [{"name": "hub", "gpus": {"sim": [P4]}}, {"name": "node", "gpus": {"sim": [P4, P4]}}],
    "models": [
        sim_model("near", "hub", 0),
        sim_model("far", "node", 0),
        sim_model("spare", "node", 1),
    ],
    "orchestra": {"warm": ["near", "far", "spare"]},
    "gateway": {"machine": "hub"},
}
