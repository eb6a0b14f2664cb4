"""The sim engine holds vLLM's contract: sleep modes, requests queued while asleep, sampling checks, n/stop/seed,
adapter rules and reloads, uvicorn's listen backlog. Each check runs against a real sim server process."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agents.orchestra.engine import free_port
from agents.orchestra.engines.vllm.engine import adapter_problem
from agents.wire.lab.model import Model
from tests.support.lab import REPO
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(120)


class Sim:
    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}"

    def post(self, path: str, body: dict | None = None, timeout: float = 30) -> tuple[int, object]:
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body or {}).encode(), method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
                status = response.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
        if raw.startswith(b"data:"):
            return status, [
                json.loads(line[5:]) for line in raw.split(b"\n\n") if line.startswith(b"data:") and not line.endswith(b"[DONE]")
            ]
        try:
            return status, json.loads(raw or b"{}")
        except ValueError:
            return status, raw.decode()

    def gauge(self, name: str) -> float:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as response:
            text = response.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(f"vllm:num_requests_{name}{{"))


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    model = tmp_path_factory.mktemp("simmodel")
    (model / "weights.bin").write_bytes(b"x" * 1024)
    port = free_port()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agents.orchestra.engines.vllm.twin",
            str(model),
            "--port",
            str(port),
            "--served-model-name",
            "sim",
            "--enable-sleep-mode",
            "--enable-lora",
            "--max-lora-rank",
            "16",
            "--load-s",
            "0",
            "--warmup-s",
            "0",
            "--wake-s",
            "0",
            "--tokens-per-s",
            "20",
            "--parent-pid",
            str(os.getpid()),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def listening() -> bool:
        assert proc.poll() is None, "the sim server did not start"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False

    wait_until(listening, timeout=30)
    yield Sim(port)
    proc.terminate()
    proc.wait(10)


def chat(max_tokens: int = 4, **extra) -> dict:
    return {"model": "sim", "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens, **extra}


def in_thread(fn, *args) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    thread.start()
    return thread, out


@pytest.mark.parametrize(
    "body, message",
    [
        (chat(max_tokens=-1), "max_tokens must be at least 1, got -1."),
        (chat(max_tokens=0), "max_tokens must be at least 1, got 0."),
        (chat(temperature=-0.5), "temperature must be non-negative"),
        (chat(top_p=1.5), "top_p must be in (0, 1]"),
        (chat(n=0), "n must be at least 1"),
    ],
)
def test_sampling_parameters_are_checked_as_vllm_does(sim, body, message):
    status, answer = sim.post("/v1/chat/completions", body)
    assert status == 400 and message in answer["error"]["message"] and answer["error"]["type"] == "BadRequestError"


def test_ids_have_vllms_prefix_for_each_route(sim):
    assert sim.post("/v1/chat/completions", chat())[1]["id"].startswith("chatcmpl-")
    assert sim.post("/v1/completions", {"model": "sim", "prompt": "hi", "max_tokens": 2})[1]["id"].startswith("cmpl-")
    status, chunks = sim.post("/v1/completions", {"model": "sim", "prompt": "hi", "max_tokens": 2, "stream": True})
    assert status == 200 and chunks and all(c["id"].startswith("cmpl-") for c in chunks)
    status, chunks = sim.post("/v1/chat/completions", chat(stream=True))
    assert status == 200 and chunks and all(c["id"].startswith("chatcmpl-") for c in chunks)


def test_n_stop_and_seed_are_honoured(sim):
    status, answer = sim.post("/v1/chat/completions", chat(max_tokens=6, n=2, seed=7))
    assert status == 200 and [c["index"] for c in answer["choices"]] == [0, 1]
    assert answer["usage"]["completion_tokens"] == 12
    again = sim.post("/v1/chat/completions", chat(max_tokens=6, n=2, seed=7))[1]
    other = sim.post("/v1/chat/completions", chat(max_tokens=6, n=2, seed=8))[1]
    texts = [c["message"]["content"] for c in answer["choices"]]
    assert texts == [c["message"]["content"] for c in again["choices"]] != [c["message"]["content"] for c in other["choices"]]
    word = texts[0].split()[2]
    stopped = sim.post("/v1/chat/completions", chat(max_tokens=6, seed=7, stop=[word]))[1]["choices"][0]
    assert stopped["finish_reason"] == "stop" and word not in stopped["message"]["content"]
    status, chunks = sim.post("/v1/chat/completions", chat(max_tokens=3, n=2, stream=True))
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert {c["choices"][0]["index"] for c in chunks} == {0, 1}


def test_sleep_aborts_by_default_waits_with_mode_wait_and_queues_new_requests(sim):
    slow = chat(max_tokens=40)  # 2 s at 20 tokens/s
    thread, out = in_thread(sim.post, "/v1/chat/completions", slow)
    wait_until(lambda: sim.gauge("running") == 1)
    assert sim.post("/sleep?level=1")[0] == 200  # vLLM 0.33's default mode: abort
    thread.join(30)
    assert out[0][1]["choices"][0]["finish_reason"] == "abort"

    queued, answer = in_thread(sim.post, "/v1/chat/completions", chat(max_tokens=2))
    wait_until(lambda: sim.gauge("waiting") == 1)  # queued at the sleeping engine, not refused
    assert queued.is_alive()
    assert sim.post("/wake_up")[0] == 200
    queued.join(30)
    assert answer[0][0] == 200 and answer[0][1]["choices"][0]["finish_reason"] == "length"

    thread, out = in_thread(sim.post, "/v1/chat/completions", slow)
    wait_until(lambda: sim.gauge("running") == 1)
    assert sim.post("/sleep?level=1&mode=wait")[0] == 200  # returns once the in-flight request has finished
    thread.join(30)
    assert out[0][1]["choices"][0]["finish_reason"] == "length" and out[0][1]["usage"]["completion_tokens"] == 40
    assert sim.post("/sleep?mode=bogus")[0] == 400
    assert sim.post("/wake_up")[0] == 200


def test_adapters_reload_only_in_place_and_refused_as_vllm_refuses_them(sim, tmp_path):
    adapter = tmp_path / "ok"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8}))
    load = {"lora_name": "ok", "lora_path": str(adapter)}
    assert sim.post("/v1/load_lora_adapter", load)[0] == 200
    status, answer = sim.post("/v1/load_lora_adapter", load)
    assert status == 400 and "load_inplace" in answer["error"]["message"]
    assert sim.post("/v1/load_lora_adapter", {**load, "load_inplace": True})[0] == 200

    model = Model(name="base", path="models/base", engine="sim", machine="box", max_lora_rank=16)
    for config, word in (
        ({"use_dora": True}, "DoRA"),
        ({"bias": "lora_only"}, "bias"),
        ({"r": 8, "rank_pattern": {"q_proj": 32}}, "rank_pattern"),
        ({"init_lora_weights": "pissa_niter_4"}, "pissa"),
        ({"init_lora_weights": "olora"}, "olora"),
        ({"init_lora_weights": "corda"}, "corda"),
        ({"init_lora_weights": "loftq"}, "loftq"),
    ):
        folder = tmp_path / word
        folder.mkdir(exist_ok=True)
        (folder / "adapter_config.json").write_text(json.dumps(config))
        problem = adapter_problem(folder, model)
        assert problem is not None and word.lower() in problem.lower() and "merged" in problem, config
        status, answer = sim.post("/v1/load_lora_adapter", {"lora_name": word, "lora_path": str(folder)})
        assert status == 400, (config, answer)


def test_a_burst_of_connections_is_queued_not_refused(sim):
    """uvicorn's backlog (2048), not socketserver's 5: the listening socket says so, and 300 connections at once
    all get an answer."""
    host, port = sim.url.removeprefix("http://").split(":")
    if shutil.which("ss"):  # a listening socket's Send-Q is its backlog (capped by net.core.somaxconn)
        line = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, timeout=10).stdout.split()
        somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
        assert int(line[2]) == min(2048, somaxconn), line
    sockets = [socket.create_connection((host, int(port)), timeout=10) for _ in range(300)]
    try:
        for s in sockets:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answered = sum(1 for s in sockets if s.recv(64).startswith(b"HTTP/1.1 200"))
    finally:
        for s in sockets:
            s.close()
    assert answered == 300
