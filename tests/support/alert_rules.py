"""What tests/e2e/alerts/test_rules.py, tests/fast/alerts/test_rules.py share: GIB, gpu, LAB."""

from __future__ import annotations

from agents.wire.protocol import GpuSample

GIB = 1024**3


def gpu(temp_c=60.0, util_pct=90.0, mem_gib=10.0, index=0) -> GpuSample:
    return GpuSample(
        index=index,
        name="Tesla V100",
        temp_c=temp_c,
        util_pct=util_pct,
        mem_used_bytes=int(mem_gib * GIB),
        mem_total_bytes=32 * GIB,
    )


# ---------------------------------------------------------------------------- real agents over SSH

LAB = {
    "lab": "alert-lab",
    "machines": [
        {"name": "box", "idle_watts": 50, "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}]}},
        {"name": "plain", "gpus": "none"},
    ],
    "alerts": {"temp_for_s": "2s", "clear_for_s": "1s"},
}
