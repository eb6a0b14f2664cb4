"""Hardening IV, R1 and R2: every length field and every choice count is held, whatever combination a client sends.
The reservation layer runs as the gateway runs it (read_lengths -> prompt_bound -> reserve_tokens -> reserve_money ->
with_lengths) in front of an upstream that generates the MOST any engine would read from the body it gets (the
largest length field, to the end of its context when there is none, every choice of n and best_of, min_tokens when
it is more) and a tokenizer at its worst (one token per byte), settled at that real count; random requests in turn
never take a tiny quota or a tiny budget past its figure."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.gateway.keys import ApiKey
from agents.gateway.lengths import LENGTH_FIELDS, prompt_bound, read_lengths, with_lengths
from agents.gateway.reservation import Reservations
from agents.gateway.target import NotServable, Target
from agents.wire.lab.gateway import GatewayPolicies, KeyLimits, Provider, ProviderModel
from agents.wire.lab.model import parse_lab

CONTEXT = 100_000  # an engine sent no length generates to the end of its context


CAP = 4096


LLAMA_LAB = """
lab: lengths
machines: [{name: box, gpus: {sim: [{name: P4, memory_gib: 8, tdp_w: 75}]}}]
models: [{name: m, path: /m.gguf, engine: llamacpp, machine: box, gpus: [0], vram_gib: 1}]
"""


PRICE = 20.0  # per million: the 0.01 budget buys 500 tokens


class Keys:
    """The key store's day count, in memory."""

    def tokens_today(self, key: ApiKey) -> int:
        return key.tokens_day

    def charge(self, key: ApiKey, tokens: int) -> None:
        key.tokens_day += tokens

    def limits(self, key: ApiKey) -> KeyLimits:
        return key.limits  # no money budget: the provider's budget bounds it

    def money_spent(self, key: ApiKey) -> float:
        return key.money_spent


class Meter:
    def __init__(self) -> None:
        self.spend_month: dict[str, float] = {}


def generated(body: dict[str, Any]) -> tuple[int, int]:
    """(prompt, completion) tokens the most generous engine makes of this body."""
    lengths = [v for f in LENGTH_FIELDS if isinstance(v := body.get(f), int) and not isinstance(v, bool) and v > 0]
    each = max(lengths) if lengths else CONTEXT
    if isinstance(body.get("min_tokens"), int):
        each = max(each, body["min_tokens"])
    choices = max(body.get("n") or 1, body.get("best_of") or 1)
    prompt = sum(len(str(m.get("content", "")).encode()) for m in body["messages"])
    return prompt, choices * each


BAD = st.sampled_from([0, -1, True, "9", 10**6])  # refused; the rest are read


length = st.one_of(st.none(), st.none(), st.integers(1, 300), st.integers(1, CAP), BAD)


count = st.one_of(st.none(), st.none(), st.integers(1, 4), st.integers(1, 200), BAD)


content = st.text(st.characters(codec="utf-8"), max_size=60) | st.text(alphabet="x", min_size=100, max_size=400)


request = st.fixed_dictionaries(
    {f: length for f in LENGTH_FIELDS}
    | {"min_tokens": length, "n": count, "best_of": count, "ignore_eos": st.one_of(st.none(), st.booleans(), st.just(1))},
).map(lambda d: {k: v for k, v in d.items() if v is not None})


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(request, content, st.booleans()), min_size=1, max_size=8))
def test_no_combination_of_length_fields_passes_a_tiny_quota_or_budget(requests):
    policies = GatewayPolicies(max_tokens=CAP)
    keys, meter = Keys(), Meter()
    holds = Reservations(keys, meter, policies)  # type: ignore[arg-type]  # the store-backed parts, in memory
    tiny = ApiKey(name="tiny", sha256="x", rpm=None, tokens_per_day=200)
    free = ApiKey(name="free", sha256="y", rpm=None, tokens_per_day=None)  # only the budget bounds it
    model = ProviderModel(name="big", prompt_per_million=PRICE, completion_per_million=PRICE)
    provider = Provider(name="cloud", base_url="http://127.0.0.1:9/v1", models=[model], monthly_budget=0.01)
    target = Target("big", "provider", provider.base_url, "big", "cloud", False, provider=provider, provider_model=model)
    for fields, text, on_tiny in requests:
        key = tiny if on_tiny else free
        body = {"model": "big", "messages": [{"role": "user", "content": text}], **fields}
        try:
            lengths = read_lengths(body, CAP)
            prompt = prompt_bound(body)
            hold = holds.reserve_tokens(key, prompt, lengths)
            holds.reserve_money(hold, target, prompt)
        except NotServable as exc:
            assert exc.status in (400, 429)
            continue
        sent = json.loads(json.dumps(with_lengths(body, hold.figure, target)))
        used_prompt, used_completion = generated(sent)
        keys.charge(key, used_prompt + used_completion)
        meter.spend_month["cloud"] = meter.spend_month.get("cloud", 0.0) + (used_prompt + used_completion) * PRICE / 1e6
        holds.release(hold)
        assert tiny.tokens_day <= 200, (body, sent)
        assert meter.spend_month["cloud"] <= 0.01 * 1.000001, (body, sent)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": 10, "min_tokens": 11}, "min_tokens"),
        ({"n": 129}, "n"),
        ({"n": 4, "best_of": 2}, "best_of"),
        ({"best_of": 1000}, "best_of"),
        ({"n_predict": -1}, "n_predict"),
        ({"max_new_tokens": 10**9}, "max_new_tokens"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
    ],
)
def test_what_an_engine_would_read_differently_is_refused_naming_the_param(fields, param):
    with pytest.raises(NotServable) as exc:
        read_lengths({"model": "m", **fields}, CAP)
    assert exc.value.status == 400 and exc.value.param == param


def test_one_figure_goes_upstream_under_the_names_each_engine_reads_and_the_others_are_removed():
    body = {"max_completion_tokens": 3001, "max_tokens": 50, "n_predict": 4000, "max_new_tokens": 7, "min_tokens": 5}
    lengths = read_lengths(body, CAP)
    assert (lengths.figure, lengths.choices) == (7, 1)
    provider = Target("big", "provider", "http://127.0.0.1:9/v1", "big", "cloud", False)
    assert with_lengths(body, lengths.figure, provider) == {"max_completion_tokens": 7, "max_tokens": 7, "min_tokens": 5}
    newer = with_lengths({"max_completion_tokens": 9}, 9, provider)
    assert newer == {"max_completion_tokens": 9}  # OpenAI's newer models refuse max_tokens
    assert with_lengths({"model": "m"}, read_lengths({"model": "m"}, CAP).figure, provider) == {"model": "m", "max_tokens": CAP}
    lab = parse_lab(LLAMA_LAB)
    local = Target("m", "local", "http://127.0.0.1:9/v1", "m", "box", False, engine_model=lab.models[0], length_param="n_predict")
    assert with_lengths({"max_completion_tokens": 9}, 9, local) == {"max_completion_tokens": 9, "max_tokens": 9, "n_predict": 9}


def test_a_prompt_without_spaces_is_held_at_its_bytes():
    assert prompt_bound({"prompt": "x" * 400_000}) >= 400_000  # before: 1 token
    assert prompt_bound({"messages": [{"role": "user", "content": "é" * 10}]}) >= 20
