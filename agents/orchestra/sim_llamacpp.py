"""A simulated llama-server (SIMULATED): llama.cpp's HTTP contract with configured delays, for the demo's P40 models.

Run as ``python -m agents.orchestra.sim_llamacpp -m MODEL.gguf --port P --alias NAME --metrics ... --sim-load-s S ...``.
It holds the pinned llama-server's contract (tools/server/ of llama-cpp-python 0.3.36's vendor/llama.cpp):
- /health answers 503 {"error": {"message": "Loading model"}} while loading, then {"status": "ok"};
- /metrics exists only with --metrics (else 501, "Start it with `--metrics`") and carries llamacpp:* series,
  counters with the _total name and gauges, no TTFT histogram, no KV-cache gauge;
- /lora-adapters lists the --lora files with their ids; POST takes [{"id", "scale"}]; there is no route to load
  a new adapter (/v1/load_lora_adapter is 404, as are vLLM's /sleep and /wake_up);
- --sleep-idle-seconds N: idle that long, the model is unloaded (/props says is_sleeping); the next task reloads it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from agents.orchestra import pagecache
from agents.orchestra.sim_process import exit_with_parent, fail_later, follow_agent, http_server
from agents.orchestra.sim_state import WORDS

N_SLOTS = 4  # llama-server's default --parallel: more requests are deferred


def log(message: str) -> None:
    t = time.monotonic() - STARTED
    print(f"{int(t // 60)}.{int(t % 60):02d}.{int(t * 1000) % 1000:03d}.{int(t * 1e6) % 1000:03d} I srv  {message}", flush=True)


STARTED = time.monotonic()


class State:
    def __init__(self, args: argparse.Namespace, loras: list[str]):
        self.args = args
        self.loaded = False
        self.sleeping = False
        self.warmed_up = False
        self.lock = threading.Lock()
        self.slots = threading.Semaphore(N_SLOTS)
        self.processing = self.deferred = 0
        self.prompt_tokens = self.predicted = 0
        self.prompt_s = self.predicted_s = 0.0
        self.last_task = time.monotonic()
        # scale 1 even with --lora-init-without-apply: the pinned server's per-request list keeps the listed scale
        self.loras = [{"id": i, "path": p, "scale": 1.0} for i, p in enumerate(loras)]

    def load(self) -> None:
        started = time.monotonic()
        files = pagecache.model_files(Path(self.args.model))
        cached = pagecache.residency(files).fraction
        load_s = self.args.sim_load_s if cached >= 0.5 else self.args.sim_load_s * self.args.sim_cold_factor
        pagecache.warm(files)
        time.sleep(max(0.0, load_s - (time.monotonic() - started)))
        self.loaded = True

    def wait_awake(self) -> None:
        with self.lock:
            self.last_task = time.monotonic()
            if not self.sleeping:
                return
            log("server is exiting sleeping state")
            self.load()  # the model comes back from the page cache, as llama-server reloads it
            self.sleeping = False

    def generate(self, prompt: str, max_tokens: int, on_token: Callable[[str], None] | None = None) -> tuple[str, int, int]:
        self.wait_awake()
        with self.lock:
            self.deferred += 1
        with self.slots:
            with self.lock:
                self.deferred -= 1
                self.processing += 1
            try:
                if not self.warmed_up:
                    time.sleep(self.args.sim_warmup_s)
                    self.warmed_up = True
                prompt_tokens = max(1, round(len(prompt.split()) * 1.3))
                per_token_s = 1.0 / self.args.sim_tokens_per_s if self.args.sim_tokens_per_s else 0.0
                rng = random.Random(hashlib.sha256(prompt.encode()).digest())
                words = [rng.choice(WORDS) for _ in range(max_tokens)]
                with self.lock:
                    self.prompt_tokens += prompt_tokens
                    self.prompt_s += per_token_s
                for word in words:
                    if per_token_s:
                        time.sleep(per_token_s)
                    with self.lock:
                        self.predicted += 1
                        self.predicted_s += per_token_s
                    if on_token is not None:
                        on_token(" " + word)
                return " " + " ".join(words), prompt_tokens, max_tokens
            finally:
                with self.lock:
                    self.processing -= 1
                    self.last_task = time.monotonic()

    def metrics(self) -> str:
        counters = {
            "prompt_tokens_total": self.prompt_tokens,
            "prompt_seconds_total": self.prompt_s,
            "tokens_predicted_total": self.predicted,
            "tokens_predicted_seconds_total": self.predicted_s,
        }
        gauges = {
            "requests_processing": self.processing,
            "requests_deferred": self.deferred,
            "predicted_tokens_seconds": self.args.sim_tokens_per_s if self.processing else 0.0,
        }
        lines = []
        for kind, items in (("counter", counters), ("gauge", gauges)):
            for name, value in items.items():
                lines += [
                    f"# HELP llamacpp:{name} {name} (SIMULATED)",
                    f"# TYPE llamacpp:{name} {kind}",
                    f"llamacpp:{name} {value}",
                ]
        return "\n".join(lines) + "\n"


def idle_sleeper(state: State, seconds: float) -> None:
    while True:
        time.sleep(min(1.0, seconds / 4))
        with state.lock:
            if state.loaded and not state.sleeping and not state.processing and time.monotonic() - state.last_task >= seconds:
                state.sleeping = True
                log("server is entering sleeping state")


class Handler(BaseHTTPRequestHandler):
    server_version = "cetlab-sim-llama-server"
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    state: State

    def log_message(self, fmt: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: object, content_type: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str) -> None:
        self._send(status, {"error": {"code": status, "message": message, "type": kind}})

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            return json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return None

    def do_GET(self) -> None:
        state, path = self.state, self.path.split("?")[0]
        if path == "/health":
            if not state.loaded:
                self._error(503, "Loading model", "unavailable_error")
            else:
                self._send(200, {"status": "ok"})
        elif path == "/metrics":
            if not state.args.metrics:
                self._error(
                    501, "This server does not support metrics endpoint. Start it with `--metrics`", "not_supported_error"
                )
            else:
                self._send(200, state.metrics(), "text/plain; version=0.0.4")
        elif path in ("/v1/models", "/models"):
            self._send(200, {"object": "list", "data": [{"id": state.args.alias, "object": "model", "owned_by": "llamacpp"}]})
        elif path == "/props":
            self._send(
                200, {"model_path": state.args.model, "is_sleeping": state.sleeping, "total_slots": N_SLOTS, "simulated": True}
            )
        elif path == "/lora-adapters":
            self._send(200, state.loras)
        else:
            self._error(404, "File Not Found", "not_found_error")

    def do_POST(self) -> None:
        state, path = self.state, self.path.split("?")[0]
        body = self._body()
        if path == "/lora-adapters":
            if not isinstance(body, list):
                self._error(400, "Request body must be an array", "invalid_request_error")
                return
            scales = {e.get("id"): float(e.get("scale", 0.0)) for e in body if isinstance(e, dict)}
            for adapter in state.loras:
                adapter["scale"] = scales.get(adapter["id"], 0.0)
            self._send(200, {"success": True})
            return
        if path not in ("/v1/completions", "/v1/chat/completions", "/completion", "/completions", "/chat/completions"):
            self._error(404, "File Not Found", "not_found_error")
            return
        if not state.loaded:
            self._error(503, "Loading model", "unavailable_error")
            return
        if not isinstance(body, dict):
            self._error(400, "Invalid JSON", "invalid_request_error")
            return
        chat = "chat" in path
        prompt = (
            " ".join(str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict))
            if chat
            else str(body.get("prompt", ""))
        )
        max_tokens = int(body.get("max_tokens") or body.get("n_predict") or 16)
        if body.get("stream"):
            self._stream(chat, prompt, max_tokens)
            return
        text, prompt_tokens, completion_tokens = state.generate(prompt, max_tokens)
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
            if chat
            else {"index": 0, "text": text, "finish_reason": "length"}
        )
        self._send(
            200,
            {
                "id": f"chatcmpl-sim{time.time_ns()}",
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": state.args.alias,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            },
        )

    def _stream(self, chat: bool, prompt: str, max_tokens: int) -> None:
        stamp = {
            "id": f"chatcmpl-sim{time.time_ns()}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.state.args.alias,
        }
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        def event(data: object) -> None:
            self.wfile.write(b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n")
            self.wfile.flush()

        def on_token(word: str) -> None:
            event(
                {
                    **stamp,
                    "choices": [
                        {"index": 0, "delta": {"content": word}, "finish_reason": None}
                        if chat
                        else {"index": 0, "text": word, "finish_reason": None}
                    ],
                }
            )

        _, prompt_tokens, completion_tokens = self.state.generate(prompt, max_tokens, on_token)
        # llama-server sends the usage with the last chunk (and timings), then [DONE]
        event(
            {
                **stamp,
                "choices": [
                    {"index": 0, "delta": {}, "finish_reason": "length"}
                    if chat
                    else {"index": 0, "text": "", "finish_reason": "length"}
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )
        event(b"[DONE]")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sim_llamacpp")
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--host", default="127.0.0.1", help="an address, or a unix socket path ending in .sock")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("-a", "--alias")
    parser.add_argument("--metrics", action="store_true")
    parser.add_argument("--lora", action="append", default=[])
    parser.add_argument("--lora-init-without-apply", action="store_true")
    parser.add_argument("--sleep-idle-seconds", type=float, default=-1)
    for name, default in (
        ("load-s", 15.0),
        ("cold-factor", 14.0),
        ("warmup-s", 1.0),
        ("tokens-per-s", 40.0),
        ("traffic-rps", 0.0),
    ):
        parser.add_argument(f"--sim-{name}", type=float, default=default)
    parser.add_argument("--sim-fail-after-s", type=float)
    parser.add_argument("--sim-parent-pid", type=int)
    parser.add_argument("--sim-agent-pid-file", type=Path)
    args, ignored = parser.parse_known_args(argv)  # llama-server flags not simulated (-ngl, --split-mode, ...) are accepted
    args.alias = args.alias or Path(args.model).stem
    if args.sim_parent_pid:
        threading.Thread(target=exit_with_parent, args=(args.sim_parent_pid,), daemon=True).start()
    if args.sim_agent_pid_file:
        threading.Thread(target=follow_agent, args=(args.sim_agent_pid_file,), daemon=True).start()
    if args.sim_fail_after_s is not None:
        threading.Thread(target=fail_later, args=(args.sim_fail_after_s,), daemon=True).start()
    log(
        f"llama_server: SIMULATED llama-server for {args.model}"
        + (f"; flags not simulated: {' '.join(ignored)}" if ignored else "")
    )
    state = State(args, [f for group in args.lora for f in group.split(",") if f])
    Handler.state = state
    uds = args.host if args.host.endswith(".sock") else None  # as llama-server (cpp-httplib) reads its --host
    server = http_server(Handler, args.host, args.port, uds)
    threading.Thread(target=server.serve_forever, daemon=True).start()  # listening while loading: /health answers 503
    log(f"load_model: loading model '{args.model}'")
    state.load()
    log("llama_server: model loaded")
    log(f"llama_server: listening on {f'unix://{uds}' if uds else f'http://{args.host}:{args.port}'}")
    if args.sleep_idle_seconds > 0:
        threading.Thread(target=idle_sleeper, args=(state, args.sleep_idle_seconds), daemon=True).start()
    if args.sim_traffic_rps > 0:
        rng = random.Random(0)
        while True:
            time.sleep(rng.expovariate(args.sim_traffic_rps))
            prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 200)))
            threading.Thread(target=state.generate, args=(prompt, rng.randint(16, 128)), daemon=True).start()
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
