"""`cetlab machine`'s workstation side: USER@HOST[:PORT] checked where it enters, lab.yaml edited with its comments and
order kept (and never left unloadable), the agent's host key pinned as one line per [host]:port."""

from __future__ import annotations


def test_the_next_step_for_the_machines_gpus_follows_the_older_gpus_matrix():
    """The advice script as machine add runs it with the machine's new venv: a P40 (6.1) needs the CUDA 12.6 torch and
    llama-server built for 61; an unknown capability is read from the GPU's name."""
    import json
    import subprocess
    import sys

    from console.machine.remote import ADVICE

    gpus = [
        {"index": 0, "name": "Tesla P40", "compute_capability": "6.1"},
        {"index": 1, "name": "NVIDIA GeForce RTX 3050", "compute_capability": None},
    ]
    done = subprocess.run(
        [sys.executable, "-", json.dumps(gpus), "/opt/venv/bin/python"], input=ADVICE, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    p40, rtx, llama = done.stdout.strip().splitlines()
    assert "Tesla P40 (6.1)" in p40 and "/opt/venv/bin/python -m pip install 'torch==2.14.*'" in p40 and "cu126" in p40
    assert "(8.6)" in rtx and "-U torch" in rtx
    assert 'make llama-server LLAMA_CUDA_ARCHS="61;86"' in llama
