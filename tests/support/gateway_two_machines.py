"""What tests/e2e/gateway/test_gateway.py, tests/fast/gateway/test_gateway.py share: model, LAB."""

from __future__ import annotations

from tests.support.gateway import P4, sim_model


def model(name: str, machine: str, gpu: int, **sim) -> dict:
    return sim_model(name, machine, gpu, **{"load_s": 0.2, "wake_s": 0.3, **sim})  # a little slower than SIM


LAB = {
    "lab": "gw-test",
    "costs": {"electricity_per_kwh": 0.30},
    "machines": [{"name": "hub", "gpus": {"sim": [P4]}}, {"name": "node", "gpus": {"sim": [P4, P4]}}],
    "models": [
        model("fast-a", "hub", 0),
        model("fast-b", "node", 0),
        model("meter-me", "node", 0),
        model("sleepy", "node", 1),
        model("coldie", "node", 1),
        model("slowpoke", "hub", 0, load_s=60),
        model("far-away", "hub", 0, load_s=60),
        model("broken", "node", 1, fail_after_s=0),
        model("crawler", "hub", 0, tokens_per_s=2),
        model("streamer", "hub", 0, tokens_per_s=200),
    ],
    "orchestra": {
        "warm": ["fast-a", "fast-b", "meter-me", "crawler", "streamer"],
        "sleeping": ["sleepy"],
        "groups": {"band": ["fast-a", "fast-b", "cloud-big", "crawler"]},
    },
    "gateway": {
        "machine": "hub",
        "policies": {"queue_size": 2, "queue_timeout_s": 60, "idle_ttl_s": 3600, "budget_exceeded": "refuse"},
        "models": {
            "fast-a": {"aliases": ["alpha"]},
            "sleepy": {"idle_ttl_s": 2},
            "far-away": {"fallback": "cloud/cloud-big"},
            "broken": {"fallback": "cloud-big"},
        },
    },
    "providers": [
        {
            "name": "cloud",
            "base_url": "http://127.0.0.1:1/v1",
            "simulated": True,
            "models": [{"name": "cloud-big", "prompt_per_million": 0.88, "completion_per_million": 0.88}],
        },
        {
            "name": "pricey",
            "base_url": "http://127.0.0.1:1/v1",
            "simulated": True,
            "monthly_budget": 0.015,
            "models": [{"name": "premium", "prompt_per_million": 75, "completion_per_million": 75}],
        },
    ],
}
