"""The CLI against replies a patched agent could send: alerts that do not validate are said (not "no alerts"), a
sim-override's numbers are checked before they go out, an agent's text never reaches the terminal as control codes, and
`costs --json` prints the agent's numbers as it sent them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agents.shell.demo.lab import DemoLab

REPO = Path(__file__).resolve().parents[3]


HOSTILE = "\x1b]0;pwned\x07\x1b[2J[bold red]EVIL[/]\x9b31m\x7f"


def cetlab(lab: Path, *argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "console.cli.main", "--lab", str(lab), *argv], capture_output=True, timeout=60, cwd=REPO
    )


@pytest.mark.timeout(120)
async def test_a_real_agents_log_override_and_costs(tmp_path, lab_file):
    lab = lab_file(
        {
            "lab": "hostile",
            "machines": [{"name": "box", "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}]}}],
            "trainers": [
                {
                    "name": "shout",
                    "machine": "box",
                    "gpus": [0],
                    "output_dir": str(tmp_path / "out" / "{job_id}"),
                    "command": [sys.executable, "-c", f"print({HOSTILE!r}, flush=True)"],
                }
            ],
        }
    )
    with DemoLab(tmp_path / "run", source=lab) as demo:
        run = await asyncio.to_thread(cetlab, demo.lab_path, "train", "shout", "--follow")
        assert run.returncode == 0, run.stderr
        for shown in (run.stdout, (await asyncio.to_thread(cetlab, demo.lab_path, "logs", "box-1")).stdout):
            text = shown.decode()
            assert "␛]0;pwned␇␛[2J[bold red]EVIL[/]" in text, text
            assert not any(c in text for c in "\x1b\x07\x9b\x7f"), repr(text)
        logs = json.loads((await asyncio.to_thread(cetlab, demo.lab_path, "--json", "logs", "box-1")).stdout)
        assert HOSTILE in logs["lines"]  # --json is the agent's text, JSON-escaped

        for bad in ("nan", "inf", "900"):
            out = await asyncio.to_thread(cetlab, demo.lab_path, "sim-override", "box", "--temp-c", bad)
            assert out.returncode == 1 and b"Traceback" not in out.stderr and b"temp_c" in out.stderr, out.stderr
            data = json.loads(
                (await asyncio.to_thread(cetlab, demo.lab_path, "--json", "sim-override", "box", "--temp-c", bad)).stdout
            )
            assert data["error"]["code"] == "invalid_params" and "temp_c" in data["error"]["message"]
        out = await asyncio.to_thread(cetlab, demo.lab_path, "sim-override", "box", "--temp-c", "95")
        assert out.returncode == 0 and out.stdout.decode().strip() == "box gpu0 (SIM): temp_c 95.0", out
        data = json.loads((await asyncio.to_thread(cetlab, demo.lab_path, "--json", "sim-override", "box", "--clear")).stdout)
        assert data["gpu"] == 0 and data["overrides"] == {} and data["simulated"] is True, data

        costs = json.loads((await asyncio.to_thread(cetlab, demo.lab_path, "--json", "costs")).stdout)
        (row,) = costs["by"]
        assert type(row["cloud_tokens"]) is int and row["cloud_tokens"] == 0, row  # the agent's empty sum, as it sent it
