"""A handler is bound to its catalogue entry by type: the type check refuses one whose result or params are not the
entry's (Registry.implements takes a Method[P, R] and a handler of (Peer, P) -> R), and passes one that fits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)


ROOT = Path(__file__).resolve().parents[3]


HEAD = """
from agents.runtime.rpc import Peer, Registry
from agents.wire.catalogue.method import NoParams
from agents.wire.catalogue.models import MODELS_LIST, ModelParams, ModelsList
from agents.wire.sections.models import ModelInfo
from agents.wire.states import ModelState

rpc = Registry()
"""


FITS = (
    HEAD
    + """

@rpc.implements(MODELS_LIST)
async def models_list(peer: Peer, params: NoParams) -> ModelsList:
    return ModelsList(machine="box")
"""
)


WRONG_RESULT = (
    HEAD
    + """

@rpc.implements(MODELS_LIST)
async def models_list(peer: Peer, params: NoParams) -> ModelInfo:
    return ModelInfo(name="a", machine="box", engine="sim", state=ModelState.WARM, since=1.0)
"""
)


WRONG_PARAMS = (
    HEAD
    + """

@rpc.implements(MODELS_LIST)
async def models_list(peer: Peer, params: ModelParams) -> ModelsList:
    return ModelsList(machine="box")
"""
)


def test_the_type_check_refuses_a_handler_that_drifts_from_its_entry_and_passes_one_that_fits(tmp_path: Path) -> None:
    for name, text in (("fits", FITS), ("wrong_result", WRONG_RESULT), ("wrong_params", WRONG_PARAMS)):
        (tmp_path / f"{name}.py").write_text(text)
    # one run for the three (the project's settings, strict on top), its cache kept apart from the project's
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--strict",
            "--cache-dir",
            str(tmp_path / "cache"),
            "fits.py",
            "wrong_result.py",
            "wrong_params.py",
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "MYPYPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=280,
    )
    out = done.stdout + done.stderr
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert done.returncode == 1, out
    assert not [e for e in errors if e.startswith("fits.py")], out
    assert len(errors) == 2, out  # one for each drifting handler, at its decorator
    result_errors = [e for e in errors if e.startswith("wrong_result.py")]
    assert result_errors and "ModelInfo" in result_errors[0] and "ModelsList" in result_errors[0], out
    params_errors = [e for e in errors if e.startswith("wrong_params.py")]
    assert params_errors and "ModelParams" in params_errors[0] and "NoParams" in params_errors[0], out
