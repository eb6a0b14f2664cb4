"""The simulated engine's model (SIMULATED): what it generates, how sampling is validated, sleep and wake, its counters.

agents.orchestra.engines.vllm.twin serves it over vLLM's HTTP routes; this module holds no HTTP.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from agents.orchestra.twins.structured import Structured, VllmNamed, VllmResponseFormat, VllmTool, constraint

GARBAGE = "!"  # what a model with uninitialised weights tends to repeat
MAX_LOGPROBS = 20  # vLLM's --max-logprobs default
MAX_NUM_SEQS = 8  # concurrent sequences; more requests wait, as in vLLM's scheduler
WORDS = (
    "the model answers briefly and the lab keeps serving while weights stay warm in memory "
    "a context window holds the prompt so each token follows from what came before"
).split()


def log(message: str) -> None:
    print(f"{time.strftime('%m-%d %H:%M:%S')} INFO [sim] {message}", flush=True)


class Sampling(BaseModel):
    """The sampling parameters of a completion request, checked as vLLM's SamplingParams checks them."""

    model_config = ConfigDict(extra="ignore")

    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logprobs: bool | int | None = None  # chat: a bool; completions: how many alternatives
    top_logprobs: int | None = None
    tools: list[VllmTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | VllmNamed | None = None
    response_format: VllmResponseFormat | None = None

    def structured(self, chat: bool) -> Structured | None:
        """The constraint on a chat answer (agents.orchestra.twins.structured), or None."""
        return constraint(self.tools, self.tool_choice, self.response_format) if chat else None

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, value: bool | int | None) -> bool | int | None:
        if isinstance(value, int) and not isinstance(value, bool) and value < -1:
            raise ValueError("`logprobs` must be a positive value or -1.")
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_LOGPROBS:
            raise ValueError(f"Requested sample logprobs of {value}, which is greater than max allowed: {MAX_LOGPROBS}")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        """vLLM's check_logprobs: -1 or a positive count, and only with logprobs."""
        if value is None:
            return value
        if value < -1:
            raise ValueError("`top_logprobs` must be a positive value or -1.")
        if (value == -1 or value > 0) and not info.data.get("logprobs"):
            raise ValueError("when using `top_logprobs`, `logprobs` must be set to true.")
        if value > MAX_LOGPROBS:
            raise ValueError(f"Requested sample logprobs of {value}, which is greater than max allowed: {MAX_LOGPROBS}")
        return value

    @field_validator("max_tokens", "max_completion_tokens")
    @classmethod
    def _at_least_one(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"max_tokens must be at least 1, got {value}.")
        return value

    @field_validator("temperature")
    @classmethod
    def _non_negative(cls, value: float | None) -> float | None:
        if value is not None and value < 0:
            raise ValueError(f"temperature must be non-negative, got {value}.")
        return value

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, value: float | None) -> float | None:
        if value is not None and not 0 < value <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {value}.")
        return value

    @field_validator("n")
    @classmethod
    def _n(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"n must be at least 1, got {value}.")
        return value

    @property
    def tokens(self) -> int:
        return min(self.max_completion_tokens or self.max_tokens or 16, 4096)  # vLLM's chat: max_completion_tokens first

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop or [] if s]

    def alternatives(self, chat: bool) -> int | None:
        """How many alternatives each token's logprobs entry lists; None: no logprobs asked."""
        if chat:
            return (self.top_logprobs or 0) if self.logprobs is True else None
        if self.logprobs is None or self.logprobs is False:
            return None
        return MAX_LOGPROBS if self.logprobs == -1 else int(self.logprobs)

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class Choice:
    """One sequence of a request: its words, cut at the first stop string."""

    def __init__(self, words: list[str], stops: list[str], sep: str = " "):
        self.finish_reason = "length"
        text = ""
        kept: list[str] = []
        for word in words:
            piece = sep + word
            candidate = text + piece
            hit = min((i for i in (candidate.find(stop) for stop in stops) if i >= 0), default=-1)
            if hit >= 0:
                if hit > len(text):
                    kept.append(candidate[len(text) : hit])
                self.finish_reason = "stop"
                break
            kept.append(piece)
            text = candidate
        self.pieces = kept

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def _logprob(piece: str, rank: int = 0) -> float:
    return -0.05 - (hashlib.sha256(piece.encode()).digest()[0] / 64) - rank * 0.5


def _alternatives(count: int) -> list[str]:
    vocab = sorted(set(WORDS))
    return [" " + vocab[i % len(vocab)] + ("" if i < len(vocab) else str(i)) for i in range(count)]


def logprobs_for(pieces: list[str], count: int | None, chat: bool, offset: int = 0) -> dict[str, Any] | None:
    """vLLM's logprobs for these tokens: chat's {"content": [...]} entries, or completions' four parallel lists."""
    if count is None:
        return None
    alternatives = _alternatives(count)
    if chat:
        return {
            "content": [
                {
                    "token": piece,
                    "logprob": _logprob(piece),
                    "bytes": list(piece.encode()),
                    "top_logprobs": [
                        {"token": alt, "logprob": _logprob(alt, rank), "bytes": list(alt.encode())}
                        for rank, alt in enumerate(alternatives)
                    ],
                }
                for piece in pieces
            ]
        }
    offsets = []
    for piece in pieces:
        offsets.append(offset)
        offset += len(piece)
    return {
        "text_offset": offsets,
        "token_logprobs": [_logprob(piece) for piece in pieces],
        "tokens": list(pieces),
        "top_logprobs": [{alt: _logprob(alt, rank) for rank, alt in enumerate(alternatives)} for _ in pieces],
    }


class Aborted(Exception):
    """The engine went to sleep with mode=abort while this request ran."""


class ClientGone(Exception):
    """The client disconnected before its answer: the request was aborted."""


class SimEngineState:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.started = time.monotonic()
        self.asleep: set[str] = set()  # the tags (weights, kv_cache) put to sleep and not woken yet
        self.weights_lost = False  # a level-2 sleep discarded them; only reload_weights brings them back
        self.warmed_up = False
        self.warmup_lock = threading.Lock()
        self.slots = threading.Semaphore(MAX_NUM_SEQS)
        self.lock = threading.Lock()
        self.running = self.waiting = 0
        self.parked = 0  # requests queued while the engine sleeps
        self.adapters: dict[str, str] = {}
        self.awake = threading.Event()  # cleared from a /sleep until the wake: new requests queue here
        self.awake.set()
        self.frozen = False  # mode=keep: running requests pause at their next token until the wake
        self.abort_epoch = 0  # mode=abort: requests started in an older epoch end as aborted
        self.drained = threading.Condition(self.lock)  # mode=wait: notified as running requests finish
        registry = self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.m_running = Gauge(
            "vllm:num_requests_running", "Requests running on the engine (SIMULATED).", labels, registry=registry
        )
        self.m_waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to run (SIMULATED).", labels, registry=registry)
        self.m_kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = 100% (SIMULATED).", labels, registry=registry)
        self.m_prompt = Counter("vllm:prompt_tokens", "Prompt tokens processed (SIMULATED).", labels, registry=registry)
        self.m_gen = Counter("vllm:generation_tokens", "Generation tokens produced (SIMULATED).", labels, registry=registry)
        self.m_ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token (SIMULATED).",
            labels,
            registry=registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0),
        )
        self.name = args.served_model_name or args.model

    @property
    def sleeping(self) -> bool:
        return bool(self.asleep)

    def _gauges(self) -> None:
        self.m_running.labels(self.name).set(self.running)
        self.m_waiting.labels(self.name).set(self.waiting + self.parked)
        self.m_kv.labels(self.name).set(round(0.9 * self.running / MAX_NUM_SEQS, 4))

    def generate(
        self,
        prompt: str,
        max_tokens: int,
        on_token: Callable[[str], None] | None = None,
        sampling: Sampling | None = None,
        client_gone: Callable[[], bool] | None = None,
    ) -> tuple[str, int, int]:
        """Serve one request (one sequence): the text, prompt and completion tokens (see generate_choices)."""
        choices, prompt_tokens = self.generate_choices(
            prompt,
            sampling or Sampling(max_tokens=max_tokens),
            None if on_token is None else (lambda _i, piece: on_token(piece)),
            client_gone,
        )
        return choices[0].text, prompt_tokens, len(choices[0].pieces)

    def generate_choices(
        self,
        prompt: str,
        sampling: Sampling,
        on_token: Callable[[int, str], None] | None = None,
        client_gone: Callable[[], bool] | None = None,
    ) -> tuple[list[Choice], int]:
        """Serve one request: queue while the engine sleeps, wait for a slot, pay the warm-up once, produce the
        ``n`` sequences' tokens at the configured rate (one step makes a token of each).

        ``on_token(index, piece)`` (streaming) is called as each token is produced; raises Aborted when the
        engine is put to sleep with mode=abort meanwhile (the choices so far are in the exception's args).
        ``client_gone()`` is asked at each step, and ClientGone raised when it says so (vLLM aborts a request whose client
        disconnected: its routes are wrapped in ``with_cancellation``), which frees the slot."""
        received = time.monotonic()
        if not self.awake.is_set():  # vLLM queues requests to a sleeping engine until it wakes (counted as waiting)
            with self.lock:
                self.parked += 1
                self._gauges()
            self.awake.wait()
            with self.lock:
                self.parked -= 1
        with self.lock:
            self.waiting += 1
            epoch = self.abort_epoch
            self._gauges()
        with self.slots:
            with self.lock:
                self.waiting -= 1
                self.running += 1
                self._gauges()
            try:
                with self.warmup_lock:  # the first forward pass compiles kernels; everyone else waits for it
                    if not self.warmed_up:
                        time.sleep(self.args.warmup_s)
                        self.warmed_up = True
                        log(f"warm-up (first forward pass) took {self.args.warmup_s:.2f} seconds")
                prompt_tokens = max(1, round(len(prompt.split()) * 1.3))
                per_token_s = 1.0 / self.args.tokens_per_s if self.args.tokens_per_s else 0.0
                choices = []
                for index in range(sampling.n):
                    seed = prompt if sampling.seed is None and index == 0 else f"{prompt}\0{sampling.seed}\0{index}"
                    rng = random.Random(hashlib.sha256(seed.encode()).digest())
                    words = [rng.choice(WORDS) for _ in range(sampling.tokens)]
                    if self.weights_lost:  # woken after a level-2 sleep but never reloaded: vLLM computes with garbage too
                        words = [GARBAGE] * sampling.tokens
                    choices.append(Choice(words, sampling.stops, sep="" if self.weights_lost else " "))
                time.sleep(per_token_s)
                self.m_ttft.labels(self.name).observe(time.monotonic() - received)
                # vLLM counts the prompt at prefill and each generated token at the step that makes it: the
                # counters rise while a request runs, not in one lump at its end (a rate read from them is steady)
                self.m_prompt.labels(self.name).inc(prompt_tokens)
                generated = self.m_gen.labels(self.name)
                for step in range(max(len(c.pieces) for c in choices)):
                    if step and per_token_s:
                        time.sleep(per_token_s)
                    if client_gone is not None and client_gone():
                        raise ClientGone()
                    if self.frozen:
                        self.awake.wait()
                    if self.abort_epoch != epoch:
                        for choice in choices:
                            choice.pieces, choice.finish_reason = choice.pieces[:step], "abort"
                        raise Aborted(choices, prompt_tokens)
                    for index, choice in enumerate(choices):
                        if step < len(choice.pieces):
                            generated.inc()
                            if on_token is not None:
                                on_token(index, choice.pieces[step])
                return choices, prompt_tokens
            finally:
                with self.lock:
                    self.running -= 1
                    self._gauges()
                    self.drained.notify_all()

    def put_to_sleep(self, mode: str) -> None:
        """vLLM's pause before the sleep: new requests queue; in-flight ones are aborted, drained or frozen."""
        self.awake.clear()
        with self.lock:
            if mode == "abort":
                self.abort_epoch += 1
            elif mode == "keep":
                self.frozen = True
            else:  # wait: until every running and queued-for-a-slot request has finished
                self.drained.wait_for(lambda: self.running == 0 and self.waiting == 0)

    def wake_up(self, tags: list[str]) -> None:
        self.asleep -= set(tags)
        if not self.asleep:
            self.frozen = False
            self.awake.set()
