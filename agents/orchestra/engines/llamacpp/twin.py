"""A simulated llama-server (SIMULATED): llama.cpp's HTTP contract with configured delays, for the demo's P40 models.

Run as ``python -m agents.orchestra.engines.llamacpp.twin -m MODEL.gguf --port P --alias NAME --metrics ... --sim-load-s S ...``.
It holds the pinned llama-server's contract (tools/server/ of llama-cpp-python 0.3.36's vendor/llama.cpp):
- /health answers 503 {"error": {"message": "Loading model"}} while loading, then {"status": "ok"};
- /metrics exists only with --metrics (else 501, "Start it with `--metrics`") and carries llamacpp:* series,
  counters with the _total name and gauges, no TTFT histogram, no KV-cache gauge;
- /lora-adapters lists the --lora files with their ids; POST takes [{"id", "scale"}]; there is no route to load
  a new adapter (/v1/load_lora_adapter is 404, as are vLLM's /sleep and /wake_up);
- --sleep-idle-seconds N: idle that long, the model is unloaded (/props says is_sleeping); the next task reloads it;
- chat answers a tool call (message.tool_calls; streamed as delta.tool_calls with index, id, name, then the arguments
  in pieces; finish_reason "tool_calls") for tool_choice "required" or a named function, and valid JSON of the
  schema for response_format json_object / json_schema, as llama-server's grammars make any model write them;
- completions honour `n` (at most --parallel), `stop`, `seed`, `max_completion_tokens` and logprobs, and refuse bad
  parameters with llama-server's errors (agents.orchestra.engines.llamacpp.twin_request; tests/e2e/orchestra/test_llamacpp_twin.py asks
  the real server and this one the same questions);
- it listens with a backlog of 2048 (socketserver's 5 refused bursts of clients).
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from agents.orchestra import pagecache
from agents.orchestra.engines.llamacpp.twin_answer import Choice, delta_of, logprobs_of, message_of, usage_of
from agents.orchestra.engines.llamacpp.twin_request import (
    LlamaRequest,
    LlamaRequestError,
    Token,
    parse_request,
)
from agents.orchestra.twins import pooling as sim_pooling
from agents.orchestra.twins.process import exit_with_parent, fail_later, follow_agent, http_server
from agents.orchestra.twins.state import WORDS

N_SLOTS = 4  # llama-server's default --parallel: more requests are deferred
LISTEN_BACKLOG = 2048  # a burst of clients queues instead of being refused (socketserver's default is 5)
OnToken = Callable[["Choice", Token, str], None]


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
        self.slots = threading.Semaphore(args.parallel)
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

    def generate(self, prompt: str, max_tokens: int) -> None:
        """A request from the simulated traffic: its tokens count, nobody reads them."""
        self.generate_choices(LlamaRequest(chat=False, prompt=prompt, n_predict=max_tokens))

    def generate_choices(self, request: LlamaRequest, on_token: OnToken | None = None) -> tuple[list[Choice], int]:
        """The request's n choices, written in lockstep in one slot (a token of each per step); and its prompt tokens."""
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
                prompt_tokens = max(1, round(len(request.prompt.split()) * 1.3))
                per_token_s = 1.0 / self.args.sim_tokens_per_s if self.args.sim_tokens_per_s else 0.0
                choices = [Choice(request, index) for index in range(request.n)]
                with self.lock:
                    self.prompt_tokens += prompt_tokens
                    self.prompt_s += per_token_s
                while live := [c for c in choices if c.finish_reason is None]:
                    if per_token_s:
                        time.sleep(per_token_s)
                    for choice in live:
                        token, piece = choice.step()
                        with self.lock:
                            self.predicted += 1
                            self.predicted_s += per_token_s
                        if on_token is not None:
                            on_token(choice, token, piece)
                return choices, prompt_tokens
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


# llama-server's routes for pooling, and its 501s when started without the flag
POOLING_PATHS = {p: "embeddings" for p in ("/v1/embeddings", "/embeddings")} | {
    p: "rerank" for p in ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking")
}
EMBEDDINGS_OFF = "This server does not support embeddings. Start it with `--embeddings`"
RERANK_OFF = "This server does not support reranking. Start it with `--reranking`"


class Handler(BaseHTTPRequestHandler):
    server_version = "cetlab-sim-llama-server"
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    state: State

    def logmessage(self, fmt: str, *args: Any) -> None:
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

    def _body(self) -> object:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            return json.loads(self.rfile.read(length) or b"{}")
        except ValueError as exc:
            return exc

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
                200,
                {
                    "model_path": state.args.model,
                    "is_sleeping": state.sleeping,
                    "total_slots": state.args.parallel,
                    "simulated": True,
                },
            )
        elif path == "/lora-adapters":
            self._send(200, state.loras)
        else:
            self._error(404, "File Not Found", "not_found_error")

    def do_POST(self) -> None:
        state, path = self.state, self.path.split("?")[0]
        body = self._body()
        if isinstance(body, ValueError):  # llama-server answers a body that is not JSON with its parser's 500
            self._error(500, f"[json.exception.parse_error.101] parse error: {body}", "server_error")
            return
        if path == "/lora-adapters":
            if not isinstance(body, list):
                self._error(400, "Request body must be an array", "invalid_request_error")
                return
            scales = {e.get("id"): float(e.get("scale", 0.0)) for e in body if isinstance(e, dict)}
            for adapter in state.loras:
                adapter["scale"] = scales.get(adapter["id"], 0.0)
            self._send(200, {"success": True})
            return
        pooling = POOLING_PATHS.get(path)
        if (
            path not in ("/v1/completions", "/v1/chat/completions", "/completion", "/completions", "/chat/completions")
            and not pooling
        ):
            self._error(404, "File Not Found", "not_found_error")
            return
        if not state.loaded:
            self._error(503, "Loading model", "unavailable_error")
            return
        if pooling:
            self._pooling(pooling, body)
            return
        try:
            request = parse_request(body, "chat" in path, state.args.parallel)
        except LlamaRequestError as exc:
            self._error(exc.status, exc.message, exc.kind)
            return
        if request.stream:
            self._stream(request)
            return
        choices, prompt_tokens = state.generate_choices(request)
        out = []
        for choice in choices:
            entry: dict[str, Any] = {"index": choice.index, "finish_reason": choice.finish_reason}
            logprobs = logprobs_of(request, choice.rng, choice.tokens)
            if request.chat:
                entry["message"] = message_of(choice)
                if logprobs is not None:
                    entry["logprobs"] = logprobs
            else:
                entry.update(text=choice.text, logprobs=logprobs)
            out.append(entry)
        self._send(
            200,
            {
                "id": f"chatcmpl-sim{time.time_ns()}",
                "object": "chat.completion" if request.chat else "text_completion",
                "created": int(time.time()),
                "model": state.args.alias,
                "choices": out,
                # one choice's tokens, not the sum over n: the pinned llama-server counts so
                "usage": usage_of(prompt_tokens, len(choices[0].tokens)),
            },
        )

    def _pooling(self, route: str, body: object) -> None:
        state = self.state
        state.wait_awake()
        try:
            if not isinstance(body, dict):
                raise sim_pooling.PoolingError(400, "the body must be a JSON object")
            if route == "embeddings":
                # --reranking implies embeddings in llama-server (a ranking model's pooled vector)
                enabled = state.args.embedding or state.args.reranking
                answer = sim_pooling.embeddings(body, state.args.alias, enabled, EMBEDDINGS_OFF, reads_dimensions=False)
            else:
                answer = sim_pooling.rerank(body, state.args.alias, state.args.reranking, RERANK_OFF, echoes_documents=False)
        except sim_pooling.PoolingError as exc:
            self._error(exc.status, exc.message, "not_supported_error" if exc.status == 501 else "invalid_request_error")
            return
        self._send(200, answer)

    def _stream(self, request: LlamaRequest) -> None:
        """Server-sent events as the pinned llama-server sends them: per choice a role chunk (chat), a chunk per
        token, its finish; completions carry usage on each finish, chat (only with include_usage) in a chunk after each finish."""
        chat = request.chat
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
        prompt_tokens = max(1, round(len(request.prompt.split()) * 1.3))

        def event(data: object) -> None:
            self.wfile.write(b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n")
            self.wfile.flush()

        def on_token(choice: Choice, token: Token, piece: str) -> None:
            if chat and len(choice.tokens) == 1:
                event({**stamp, "choices": [{"index": choice.index, "delta": {"role": "assistant", "content": None}}]})
            logprobs = logprobs_of(request, choice.rng, [token])
            if piece or logprobs is not None:
                entry: dict[str, Any] = {"index": choice.index, "finish_reason": None}
                if chat:
                    entry["delta"] = delta_of(choice, piece)
                    if logprobs is not None:
                        entry["logprobs"] = logprobs
                else:
                    entry.update(text=piece, logprobs=logprobs)
                event({**stamp, "choices": [entry]})
            if choice.finish_reason is not None:
                last: dict[str, Any] = {"index": choice.index, "finish_reason": choice.finish_reason}
                final: dict[str, Any] = {**stamp, "choices": [last]}
                if chat:
                    last["delta"] = {}
                else:
                    last.update(text="", logprobs=None)
                    final["usage"] = usage_of(prompt_tokens, len(choice.tokens))
                event(final)
                if chat and request.include_usage:  # each choice's own usage chunk, after its finish
                    event({**stamp, "choices": [], "usage": usage_of(prompt_tokens, len(choice.tokens))})

        self.state.generate_choices(request, on_token)
        event(b"[DONE]")


def connect_rpc(endpoints: list[str]) -> list[socket.socket]:
    """llama-server's --rpc: a connection to each rpc-server before the model loads (one that cannot be reached fails
    the start, as llama-server's does), its device named as llama-server names it (SIMULATED: no tensors are sent)."""
    held = []
    for i, endpoint in enumerate(endpoints):
        host, _, port = endpoint.rpartition(":")
        try:
            held.append(socket.create_connection((host, int(port)), timeout=10))
        except (OSError, ValueError) as exc:
            log(f"common_init: failed to connect to RPC server {endpoint}: {exc}")
            sys.exit(1)
        log(f"llama_prepare_model_devices: using device RPC{i} ({endpoint}) (SIMULATED)")
        log(f"load_tensors: RPC{i}[{endpoint}] model buffer size = (SIMULATED)")
    return held


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sim_llamacpp")
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--host", default="127.0.0.1", help="an address, or a unix socket path ending in .sock")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("-a", "--alias")
    parser.add_argument("--metrics", action="store_true")
    parser.add_argument("-np", "--parallel", type=int, default=N_SLOTS)
    parser.add_argument("--lora", action="append", default=[])
    parser.add_argument("--lora-init-without-apply", action="store_true")
    parser.add_argument("--sleep-idle-seconds", type=float, default=-1)
    parser.add_argument("--embedding", "--embeddings", action="store_true")
    parser.add_argument("--reranking", "--rerank", action="store_true")
    parser.add_argument("--rpc", default="", help="host:port,... of rpc-servers: connected to at load, as llama-server")
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
    server = http_server(Handler, args.host, args.port, uds, LISTEN_BACKLOG)
    threading.Thread(target=server.serve_forever, daemon=True).start()  # listening while loading: /health answers 503
    log(f"load_model: loading model '{args.model}'")
    held = connect_rpc([e for e in args.rpc.split(",") if e])  # noqa: F841  # held open while it serves
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
