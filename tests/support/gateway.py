"""What the gateway tests share: a simulated GPU, a quick simulated engine, a model entry, a lab run as a demo, its key."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import yaml

from agents.shell.demo.lab import DemoLab
from tests.support.agent_process import P4

__all__ = ["P4", "SIM", "gateway_key", "running_lab", "sim_model"]

# a simulated engine that loads, warms and wakes in a fraction of a second and answers at once
SIM = {"load_s": 0.1, "cold_factor": 1, "warmup_s": 0.1, "wake_s": 0.2, "tokens_per_s": 0, "placeholder_mib": 1}


def sim_model(name: str, machine: str, gpu: int, **sim) -> dict:
    """A lab.yaml model entry: a simulated engine of 1 GiB on one GPU of the machine (`sim` overrides SIM's figures)."""
    return {
        "name": name,
        "path": f"models/{name}",
        "engine": "sim",
        "machine": machine,
        "gpus": [gpu],
        "vram_gib": 1,
        "sim": {**SIM, **sim},
    }


@contextmanager
def running_lab(tmp_path_factory, lab: dict, name: str) -> Iterator[DemoLab]:
    """The lab (lab.yaml's data) run as a demo lab of real agent processes, in folders named after `name`; for a
    module's fixture: `with running_lab(tmp_path_factory, LAB, "sdk") as demo: yield demo`."""
    source = tmp_path_factory.mktemp(f"{name}src") / "lab.yaml"
    source.write_text(yaml.safe_dump(lab, sort_keys=False))
    with DemoLab(tmp_path_factory.mktemp(name), source=source) as demo:
        yield demo


def gateway_key(demo: DemoLab) -> str:
    """The demo's own gateway key (the console's), as a client sends it."""
    return (demo.dir / "console" / "gateway.key").read_text().strip()
