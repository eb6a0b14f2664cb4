"""What tests/e2e/gpusupport/test_gpu_support.py, tests/fast/gpusupport/test_gpu_support.py share: CC."""

from __future__ import annotations

from agents.wire.protocol import ComputeCapability

CC = {
    "P40": ComputeCapability(major=6, minor=1),
    "V100": ComputeCapability(major=7, minor=0),
    "3050": ComputeCapability(major=8, minor=6),
    "H100": ComputeCapability(major=9, minor=0),
}
