"""The simulated engine: a real HTTP server speaking the vLLM subset the agent uses (SIMULATED).

Run as ``python -m agents.orchestra.engines.vllm.twin MODEL --port P --served-model-name NAME ...``:
vLLM's own flags (others are accepted and ignored) plus the simulated delays.
Loading reads the model's files for real (page cache), then waits out the configured
delays; the first request pays the warm-up; counters count the tokens really served.

It holds vLLM's contract, so a regression in how the agent drives vLLM shows in tests:
the sleep endpoints exist only with VLLM_SERVER_DEV_MODE=1 (and sleep needs
--enable-sleep-mode); /v1/load_lora_adapter only with VLLM_ALLOW_RUNTIME_LORA_UPDATING,
and it loads only with --enable-lora, an adapter rank <= --max-lora-rank and no
modules_to_save (agents.orchestra.engines.vllm.lora_rules); a name already loaded reloads only with
``load_inplace``; after a level-2 sleep the weights are gone, and a wake without
``collective_rpc reload_weights`` answers garbage, as vLLM does.

Sleep is vLLM 0.33's: ``/sleep?mode=abort`` (the default) ends in-flight requests with
finish_reason "abort", ``mode=wait`` lets them finish first, ``mode=keep`` freezes them until the
wake; requests that arrive while the engine sleeps queue until a wake (never 503). Sampling
parameters are validated as vLLM's SamplingParams and request models do (400 with its messages, naming the
``param``); ``n``, ``stop``, ``seed``, ``max_completion_tokens`` and logprobs are honoured.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from prometheus_client import generate_latest
from pydantic import ValidationError

from agents.orchestra import pagecache
from agents.orchestra.engines.vllm.lora_rules import lora_config_problem
from agents.orchestra.twins import pooling as sim_pooling
from agents.orchestra.twins.process import exit_with_parent, fail_later, follow_agent, http_server
from agents.orchestra.twins.script import Script
from agents.orchestra.twins.state import WORDS, Aborted, ClientGone, Sampling, SimEngineState, log, logprobs_for

SLEEP_TAGS = ("weights", "kv_cache")
DEV_ROUTES = ("/sleep", "/wake_up", "/is_sleeping", "/collective_rpc")
LISTEN_BACKLOG = 2048  # uvicorn's default backlog, which vLLM's server keeps
SLEEP_MODES = ("abort", "wait", "keep")


class Handler(BaseHTTPRequestHandler):
    server_version = "cetlab-sim-engine"
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn serves vLLM: clients and the gateway reuse connections
    disable_nagle_algorithm = True  # headers and body go out as separate writes: without this a kept-alive reply waits ~40 ms
    state: SimEngineState

    def log_message(self, fmt: str, *args: Any) -> None:
        # an access line per request, as uvicorn writes, unless vLLM's --disable-uvicorn-access-log
        if not self.state.args.disable_uvicorn_access_log:
            log(f'{self.address_string()} - "{self.requestline}" {args[1] if len(args) > 1 else ""}')

    def _dev_route(self, path: str) -> bool:
        """vLLM registers the sleep and RPC routes only in dev mode; elsewhere they are 404."""
        if path in DEV_ROUTES and os.environ.get("VLLM_SERVER_DEV_MODE") != "1":
            self._send(404, {"detail": "Not Found"})
            return False
        return True

    def _send(self, status: int, body: object, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, param: str | None = None) -> None:
        """vLLM's error body (ErrorResponse): OpenAI's shape with vLLM's type names."""
        self._send(
            status,
            {
                "error": {
                    "message": message,
                    "type": "BadRequestError" if status == 400 else "NotFoundError",
                    "param": param,
                    "code": status,
                }
            },
        )

    def _body(self) -> dict[str, Any] | None:
        """The JSON object sent; None when the body is not one (vLLM's request models refuse it with a 400)."""
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = None
        return body if isinstance(body, dict) else None

    def do_GET(self) -> None:
        state, path = self.state, urlparse(self.path).path
        if not self._dev_route(path):
            return
        if path == "/health":
            self._send(200, b"", "text/plain")
        elif path == "/is_sleeping":
            self._send(200, {"is_sleeping": state.sleeping})
        elif path == "/v1/models":
            ids = [state.name, *state.adapters]
            self._send(
                200,
                {
                    "object": "list",
                    "data": [{"id": i, "object": "model", "owned_by": "cetlab-sim", "root": state.args.model} for i in ids],
                },
            )
        elif path == "/metrics":
            self._send(200, generate_latest(state.registry), "text/plain; version=0.0.4")
        else:
            self._send(404, {"error": f"no route {path}"})

    def do_POST(self) -> None:
        url = urlparse(self.path)
        sent = self._body()
        if not self._dev_route(url.path):
            return
        if sent is None and url.path in ("/v1/completions", "/v1/chat/completions"):
            self._error(400, "Input should be a valid dictionary or object to extract fields from", "body")
            return
        body = sent or {}
        query = parse_qs(url.query)
        if url.path == "/sleep":
            self._sleep(query)
        elif url.path == "/wake_up":
            self._wake_up(query)
        elif url.path == "/collective_rpc":
            self._collective_rpc(body)
        elif url.path == "/v1/load_lora_adapter":
            self._load_adapter(self.state, body)
        elif url.path in ("/v1/embeddings", "/v1/rerank", "/rerank", "/v2/rerank"):
            self._pooling(url.path, sent)
        elif url.path in ("/v1/completions", "/v1/chat/completions"):
            self._completion(url.path, body)
        else:
            self._send(404, {"error": f"no route {url.path}"})

    def _sleep(self, query: dict[str, list[str]]) -> None:
        state = self.state
        if not state.args.enable_sleep_mode:
            self._send(500, {"error": {"message": "Sleep mode is not enabled: start the server with --enable-sleep-mode"}})
            return
        level = query.get("level", ["1"])[0]
        mode = query.get("mode", ["abort"])[0]  # vLLM 0.33's default
        if mode not in SLEEP_MODES:
            self._error(400, f"mode must be one of {', '.join(SLEEP_MODES)}, got {mode!r}", "mode")
            return
        state.put_to_sleep(mode)
        time.sleep(state.args.wake_s)
        state.asleep = set(SLEEP_TAGS)
        state.weights_lost = state.weights_lost or level == "2"
        log(f"engine put to sleep (level {level}); GPU memory freed" + ("; weights discarded" if level == "2" else ""))
        self._send(200, b"", "text/plain")

    def _wake_up(self, query: dict[str, list[str]]) -> None:
        state = self.state
        tags = query.get("tags") or list(SLEEP_TAGS)
        time.sleep(state.args.wake_s)
        state.wake_up(tags)
        log(f"engine woke up ({', '.join(tags)}) in {state.args.wake_s:.2f} seconds")
        self._send(200, b"", "text/plain")

    def _collective_rpc(self, body: dict[str, Any]) -> None:
        state = self.state
        if body.get("method") != "reload_weights":
            self._send(500, {"error": {"message": f"the simulated workers have no method {body.get('method')!r}"}})
            return
        if "weights" in state.asleep:
            self._send(500, {"error": {"message": "reload_weights: the weights are asleep; wake_up?tags=weights first"}})
            return
        state.weights_lost = False
        log("weights reloaded from the model files")
        self._send(200, {"results": [None]})

    def _completion(self, path: str, body: dict[str, Any]) -> None:
        """/v1/completions and /v1/chat/completions: validated as vLLM does, then answered whole or streamed."""
        state = self.state
        if state.args.runner == "pooling":
            self._error(400, f"The model does not support {'Chat ' if 'chat' in path else ''}Completions API")
            return
        try:
            sampling = Sampling.model_validate(body)
        except ValidationError as exc:
            error = exc.errors()[0]
            self._error(400, str(error["msg"]).removeprefix("Value error, "), ".".join(map(str, error["loc"])))
            return
        chat = path.endswith("chat/completions")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list):
                self._error(400, "Field required" if messages is None else "Input should be a valid list", "messages")
                return
            prompt = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        else:
            asked = body.get("prompt")
            if asked is None:
                self._error(400, "Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
                return
            if not isinstance(asked, (str, list)):
                self._error(400, "Input should be a valid string", "prompt")
                return
            prompt = asked if isinstance(asked, str) else " ".join(map(str, asked))
        if chat and sampling.tools and sampling.tool_choice in (None, "auto") and not state.args.enable_auto_tool_choice:
            self._error(
                400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set', "tool_choice"
            )
            return
        script = Script.of(sampling.structured(chat), sampling)
        if script is not None:  # the grammar's answer is as long as its JSON (or the limit, if that comes first)
            sampling = sampling.model_copy(update={"max_tokens": script.tokens, "max_completion_tokens": None, "stop": None})
        if sampling.stream:
            self._stream(chat, prompt, sampling, script)
            return
        try:
            choices, prompt_tokens = state.generate_choices(prompt, sampling, client_gone=self._client_gone)
        except ClientGone:
            log(f"{self.address_string()} disconnected: request aborted")
            self.close_connection = True
            return
        except Aborted as exc:
            choices, prompt_tokens = exc.args
        out = []
        count = sampling.alternatives(chat)
        for index, choice in enumerate(choices):
            entry: dict[str, Any] = {"index": index, "finish_reason": choice.finish_reason}
            entry.update({"message": {"role": "assistant", "content": choice.text}} if chat else {"text": choice.text})
            if script is not None:
                entry.update(script.answer(index, len(choice.pieces)))
            entry["logprobs"] = logprobs_for(choice.pieces, count, chat)
            out.append(entry)
        completion_tokens = sum(len(c.pieces) for c in choices)
        self._send(
            200,
            {
                "id": f"{'chatcmpl' if chat else 'cmpl'}-sim-{time.time_ns()}",  # vLLM's (and OpenAI's) prefixes
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": state.name,
                "choices": out,
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
                "simulated": True,
            },
        )

    def _pooling(self, path: str, body: dict[str, Any] | None) -> None:
        """vLLM serves embeddings and rerank from a pooling model (--runner pooling), and 404s them from a generating one."""
        state = self.state
        if body is None:
            self._error(400, "Input should be a valid dictionary or object to extract fields from", "body")
            return
        state.awake.wait()
        pooling, off = state.args.runner == "pooling", "The model does not support this API: start it with --runner pooling"
        try:
            if path == "/v1/embeddings":
                answer = sim_pooling.embeddings(body, state.name, pooling, off, reads_dimensions=True)
                answer["id"] = f"embd-sim-{time.time_ns()}"
            else:
                answer = sim_pooling.rerank(body, state.name, pooling, off, echoes_documents=True)
                answer["id"] = f"rerank-sim-{time.time_ns()}"
        except sim_pooling.PoolingError as exc:
            self._error(404 if exc.status == 501 else exc.status, exc.message, exc.param)
            return
        answer["created"] = int(time.time())
        self._send(200, answer)

    def _client_gone(self) -> bool:
        """The client closed its connection (it reads as end of file) while its answer was being made."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _load_adapter(self, state: SimEngineState, body: dict[str, Any]) -> None:
        """vLLM's rules: runtime updating allowed, --enable-lora, a readable PEFT adapter it can serve."""
        if os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() not in ("1", "true"):
            self._send(404, {"detail": "Not Found"})
            return
        name, path = body.get("lora_name"), body.get("lora_path")
        if not state.args.enable_lora:
            self._send(400, {"error": {"message": "LoRA is not enabled. Use --enable-lora to enable LoRA."}})
            return
        try:
            config = json.loads((Path(str(path)) / "adapter_config.json").read_text())
        except (OSError, ValueError):
            config = None
        if not isinstance(name, str) or not isinstance(config, dict):
            self._send(400, {"error": {"message": f"cannot load LoRA adapter from {path!r}: no adapter_config.json"}})
            return
        if name in state.adapters and body.get("load_inplace") is not True:
            self._error(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                "in place, set 'load_inplace' to True.",
                "lora_name",
            )
            return
        problem = lora_config_problem(config, state.args.max_lora_rank)
        if problem is not None:
            self._error(400, problem + ".")
            return
        state.adapters[name] = str(path)
        self._send(200, f"Success: LoRA adapter '{name}' added successfully.".encode(), "text/plain")

    def _stream(self, chat: bool, prompt: str, sampling: Sampling, script: Script | None = None) -> None:
        """Server-sent events as vLLM sends them: a first chat chunk with the role, one delta per token and
        choice, each choice's finish, usage last when asked, then [DONE]."""
        state = self.state
        stamp = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-sim-{time.time_ns()}",  # vLLM's (and OpenAI's) prefixes
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": state.name,
        }
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")  # no length known: the stream ends when the connection closes
        self.end_headers()
        self.close_connection = True

        def event(data: object) -> None:
            self.wfile.write(b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n")
            self.wfile.flush()

        if chat:
            for index in range(sampling.n):
                event(
                    {**stamp, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
                )

        count = sampling.alternatives(chat)
        offsets = [0] * sampling.n
        written = [0] * sampling.n

        def on_token(index: int, word: str) -> None:
            choice: dict[str, Any] = (
                {"index": index, "delta": {"content": word}, "finish_reason": None}
                if chat
                else {"index": index, "text": word, "finish_reason": None}
            )
            if script is not None:
                written[index] += 1
                delta = script.delta(index, written[index])
                if delta is None:
                    return
                word, choice["delta"] = "", delta
            if count is not None:
                choice["logprobs"] = logprobs_for([word], count, chat, offsets[index])
            offsets[index] += len(word)
            event({**stamp, "choices": [choice]})

        try:
            choices, prompt_tokens = state.generate_choices(prompt, sampling, on_token)
        except Aborted as exc:
            choices, prompt_tokens = exc.args
        for index, choice in enumerate(choices):
            finish = script.finish(index, len(choice.pieces)) if script is not None else choice.finish_reason
            last = (
                {"index": index, "delta": {}, "finish_reason": finish}
                if chat
                else {"index": index, "text": "", "finish_reason": choice.finish_reason}
            )
            event({**stamp, "choices": [last]})
        completion_tokens = sum(len(c.pieces) for c in choices)
        if sampling.include_usage:
            event(
                {
                    **stamp,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens,
                    },
                }
            )
        event(b"[DONE]")


def _traffic(state: SimEngineState, rps: float) -> None:
    """Simulated clients: Poisson arrivals of short requests once the model is warm and awake."""
    rng = random.Random(os.getpid())
    while True:
        time.sleep(rng.expovariate(rps))
        if state.warmed_up and not state.sleeping:
            prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 200)))
            threading.Thread(target=state.generate, args=(prompt, rng.randint(16, 128)), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="cetlab's simulated model server (vLLM subset; other vLLM flags are ignored).")
    parser.add_argument("model", help="the model folder, as `vllm serve MODEL`")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int)
    parser.add_argument("--uds", help="a unix socket path to listen on (as vLLM's: --host and --port are then unused)")
    parser.add_argument("--served-model-name")
    parser.add_argument("--enable-sleep-mode", action="store_true")
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--runner", choices=("auto", "generate", "pooling"), default="auto")
    parser.add_argument("--max-loras", type=int, default=1)
    parser.add_argument("--max-lora-rank", type=int, default=16)
    parser.add_argument("--disable-uvicorn-access-log", action="store_true")
    parser.add_argument("--enable-auto-tool-choice", action="store_true")
    parser.add_argument("--tool-call-parser")
    parser.add_argument("--load-s", type=float, default=15.0)
    parser.add_argument("--cold-factor", type=float, default=14.0)
    parser.add_argument("--warmup-s", type=float, default=40.0)
    parser.add_argument("--wake-s", type=float, default=1.0)
    parser.add_argument("--tokens-per-s", type=float, default=40.0)
    parser.add_argument("--fail-after-s", type=float)
    parser.add_argument("--traffic-rps", type=float, default=0.0)
    parser.add_argument("--parent-pid", type=int)
    parser.add_argument("--agent-pid-file", type=Path)
    args, ignored = parser.parse_known_args(argv)

    if args.parent_pid:
        threading.Thread(target=exit_with_parent, args=(args.parent_pid,), daemon=True).start()
    if args.agent_pid_file:
        threading.Thread(target=follow_agent, args=(args.agent_pid_file,), daemon=True).start()
    if args.fail_after_s is not None:
        threading.Thread(target=fail_later, args=(args.fail_after_s,), daemon=True).start()
    log(
        f"SIMULATED engine for {args.model} (served as {args.served_model_name or args.model})"
        + (f"; vLLM flags not simulated: {' '.join(ignored)}" if ignored else "")
    )
    started = time.monotonic()
    files = pagecache.model_files(Path(args.model))
    cached = pagecache.residency(files).fraction
    # from RAM the load takes load_s; from disk cold_factor times longer (field notes: ~14x)
    load_s = args.load_s if cached >= 0.5 else args.load_s * args.cold_factor
    size_bytes, _ = pagecache.warm(files)
    time.sleep(max(0.0, load_s - (time.monotonic() - started)))
    took = time.monotonic() - started
    log(f"Loading weights took {took:.2f} seconds ({cached:.0%} of the files were in the page cache)")
    log(f"Model loading took {size_bytes / 2**30:.4f} GiB and {took:.2f} seconds")
    state = SimEngineState(args)
    Handler.state = state
    server = http_server(Handler, args.host, args.port, args.uds, LISTEN_BACKLOG)
    if args.traffic_rps > 0:
        threading.Thread(target=_traffic, args=(state, args.traffic_rps), daemon=True).start()
    log(f"Starting vLLM API server on {f'unix:{args.uds}' if args.uds else f'http://{args.host}:{args.port}'}")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
