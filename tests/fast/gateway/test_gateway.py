"""The lab gateway end to end: real HTTP through a real agent, to sim engines on two machines over real SSH, and a stand-in provider."""

from __future__ import annotations

import pytest
import yaml

from agents.wire.lab.model import LabError, parse_lab
from tests.support.gateway_two_machines import LAB

pytestmark = pytest.mark.timeout(240)


def test_config_cross_references_are_checked():
    bad = {**LAB, "gateway": {**LAB["gateway"], "machine": "nowhere", "models": {"fast-a": {"fallback": "nobody/x"}}}}
    with pytest.raises(LabError) as err:
        parse_lab(yaml.safe_dump(bad))
    text = str(err.value)
    assert "gateway.machine: no machine named 'nowhere'" in text and "is no provider's model" in text


def test_cli_gateway_columns_fit_their_longest_cell():
    """`cetlab gateway` ran "workstation SIM" into the state column; the table is aligned whatever the names."""
    from agents.wire.sections.gateway import GatewaySection
    from console.cli.gateway import gateway_human

    def model(name, where, state):
        return {
            "name": name,
            "tier": "local",
            "where": where,
            "simulated": True,
            "state": state,
            "rps": 0.0,
            "in_flight": 0,
            "queued": 0,
            "p50_latency_s": None,
            "p95_latency_s": None,
            "p50_ttft_s": None,
            "wakes": 0,
            "errors": 0,
        }

    data = {
        "currency": "USD",
        "url": "http://127.0.0.1:8400/v1",
        "machine": "hub",
        "peers": {},
        "providers": [],
        "keys": [],
        "models": [model("phi-3-mini", "workstation", "warm"), model("a-checkpoint-of-a-long-run-step12000", "m5", "cold")],
    }
    lines = gateway_human(GatewaySection.model_validate(data)).splitlines()[1:4]
    starts = {line.index(word) for line, word in zip(lines, ("state", "warm", "cold"))}
    assert len(starts) == 1, lines
