"""What tests/e2e/orchestra/test_llamacpp_twin.py, tests/e2e/orchestra/test_pooling_twin.py share: post, start."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.lab import REPO
from tests.support.waits import wait_until


def post(base: str, route: str, body: Any) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(base + route, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def start(argv: list[str], port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)}
    )

    def healthy() -> bool:
        assert proc.poll() is None, f"{argv[0]} exited"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    wait_until(healthy, timeout=90, what=f"{Path(argv[0]).name} healthy")
    return proc
