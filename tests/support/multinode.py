"""What tests/e2e/jobs/test_multinode.py, tests/e2e/jobs/test_node_start.py share: P4, with_torchrun."""

from __future__ import annotations

import os
import sys

import pytest

from agents.jobs import recipes

P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}


@pytest.fixture
def with_torchrun(tmp_path, monkeypatch):
    """torchrun on PATH, as the agents look for it."""
    if recipes.find_program("torchrun", tmp_path, recipes.search_path(dict(os.environ))) is None:
        # a venv without torch's console scripts: torchrun is `python -m torch.distributed.run` all the same
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "torchrun").write_text(f'#!/bin/sh\nexec {sys.executable} -m torch.distributed.run "$@"\n')
        (bin_dir / "torchrun").chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
