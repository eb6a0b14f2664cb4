"""A unit GPU services survive: private /tmp, writable caches, nvidia-modprobe, a watchdog that fits the sample interval."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agents.shell import systemd
from agents.shell.systemd import CACHE_ENV, render_unit
from agents.wire.lab.model import load_lab
from tests.support.agent_process import one_machine_lab
from tests.support.systemd_unit import unit_lines


def verify(path: Path, text: str) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    path.write_text(text)
    result = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and str(path) not in result.stderr, result.stderr


def test_system_unit_gives_gpu_services_a_private_tmp_writable_caches_and_file_descriptors(tmp_path, monkeypatch):
    modprobe = tmp_path / "bin" / "nvidia-modprobe"
    modprobe.parent.mkdir()
    modprobe.write_text("#!/bin/sh\n")
    modprobe.chmod(modprobe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(systemd, "nvidia_modprobe", lambda: str(modprobe))
    lab = load_lab(one_machine_lab(tmp_path / "lab.yaml"))
    state = Path("/var/lib/cetlab/box")
    text = render_unit(lab, tmp_path / "lab.yaml", "box", state, user_unit=False, run_as="cetlab")
    lines = unit_lines(text)
    assert lines["PrivateTmp"] == ["yes"] and lines["LimitNOFILE"] == ["65536"]
    assert lines["ExecStartPre"] == [f"+-{modprobe} -u -c=0"]
    assert "nvidia-persistenced.service" in lines["After"][0]
    env = dict(v.split("=", 1) for v in lines["Environment"])
    assert set(CACHE_ENV) <= set(env) and env["HF_HOME"] == str(state / "cache" / "huggingface")
    writable = lines["ReadWritePaths"][0].split()
    for name in CACHE_ENV:  # every cache is inside a writable path
        assert any(Path(env[name]).is_relative_to(p.lstrip("-")) for p in writable), name
    verify(tmp_path / "cetlab-agent.service", text)


def test_a_configured_cache_dir_is_made_writable_and_no_modprobe_where_there_is_none(tmp_path, monkeypatch):
    monkeypatch.setattr(systemd, "nvidia_modprobe", lambda: None)
    lab = load_lab(one_machine_lab(tmp_path / "lab.yaml"))
    text = render_unit(
        lab,
        tmp_path / "lab.yaml",
        "box",
        Path("/var/lib/cetlab/box"),
        user_unit=False,
        run_as="cetlab",
        cache_dir=Path("/srv/cache"),
    )
    lines = unit_lines(text)
    assert "ExecStartPre" not in lines
    assert "-/srv/cache" in lines["ReadWritePaths"][0].split() and "Environment=TRITON_CACHE_DIR=/srv/cache/triton" in text
    verify(tmp_path / "cetlab-agent.service", text)


def test_vllm_box_caches_and_no_usage_report_and_a_warning_for_paths_under_tmp(tmp_path):
    lab = load_lab(one_machine_lab(tmp_path / "lab.yaml"))
    state = Path("/var/lib/cetlab/box")
    lines = unit_lines(render_unit(lab, tmp_path / "lab.yaml", "box", state, user_unit=False, run_as="cetlab"))
    env = dict(v.split("=", 1) for v in lines["Environment"])
    assert env["VLLM_NO_USAGE_STATS"] == "1"
    for name in ("FLASHINFER_WORKSPACE_BASE", "VLLM_CONFIG_ROOT", "CUDA_CACHE_PATH"):  # JIT kernels, config, ~/.nv
        assert Path(env[name]).is_relative_to(state), name
    program = Path("/opt/cetlab/.venv/bin/cetlab-agent")
    warned = systemd.tmp_path_warnings(lab, Path("/srv/lab/lab.yaml"), "box", state, None, user_unit=False, program=program)
    assert warned == []
    warnings = systemd.tmp_path_warnings(
        lab, Path("/srv/lab/lab.yaml"), "box", Path("/tmp/cetlab-state"), Path("/var/tmp/c"), user_unit=False, program=program
    )
    assert len(warnings) == 2 and "the state dir /tmp/cetlab-state is under /tmp" in warnings[0] and "PrivateTmp" in warnings[0]
    # a virtualenv made under /tmp: systemd would start a program PrivateTmp hides (and boot deletes)
    in_tmp = Path("/tmp/venv/bin/cetlab-agent")
    warnings = systemd.tmp_path_warnings(lab, Path("/srv/lab/lab.yaml"), "box", state, None, user_unit=True, program=in_tmp)
    assert warnings == [
        f"ExecStart='s program {in_tmp} is under /tmp: /tmp is cleaned at boot; move it (e.g. under /var/lib or /srv)"
    ]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agents.shell.daemon",
            "install-unit",
            "--lab",
            str(tmp_path / "lab.yaml"),
            "--machine",
            "box",
            "--state-dir",
            "/tmp/cetlab-state",
            "--print",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and "warning: the state dir /tmp/cetlab-state is under /tmp" in result.stderr
