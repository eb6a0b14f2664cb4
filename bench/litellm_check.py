"""LiteLLM against a running gateway: chat, a stream's first role, and its error classes (a hand check).

LiteLLM cannot share the test venv (it pins huggingface-hub < 2 and openai < 3, which transformers and the
tests' SDK are past), so it runs from its own:
    python3 -m venv /tmp/litellm && /tmp/litellm/bin/pip install litellm
    LITELLM_LOCAL_MODEL_COST_MAP=True /tmp/litellm/bin/python bench/litellm_check.py DIR/console/gateway.key http://127.0.0.1:8400/v1
with `cetlab demo --dir DIR` running. Prints OK or BAD per check."""

import sys

import litellm

HI = [{"role": "user", "content": "hi"}]


def check(what: str, passed: bool) -> bool:
    print(("OK  " if passed else "BAD ") + what)
    return passed


def main(key_file: str, url: str, model: str = "phi-3-mini") -> int:
    key = open(key_file).read().strip()
    base = {"model": f"openai/{model}", "api_base": url, "api_key": key, "messages": HI, "max_tokens": 5, "num_retries": 0}
    answer = litellm.completion(**base)
    results = [
        check(
            f"chat: model={answer.model} completion_tokens={answer.usage.completion_tokens}", answer.usage.completion_tokens > 0
        )
    ]
    chunks = list(litellm.completion(**base, stream=True))
    role = chunks[0].choices[0].delta.role if chunks else None
    results.append(check(f"stream: {len(chunks)} chunks, the first with role {role}", role == "assistant"))
    changes: list[tuple[str, dict[str, object], type[Exception]]] = [
        ("a wrong key", {"api_key": "nope"}, litellm.AuthenticationError),
        ("an unknown model", {"model": "openai/no-such-model"}, litellm.NotFoundError),
        ("temperature 5", {"temperature": 5}, litellm.BadRequestError),
    ]
    for what, change, expected in changes:
        try:
            litellm.completion(**{**base, **change})
            results.append(check(f"{what}: no error", False))
        except Exception as exc:  # which class LiteLLM raised is the check
            results.append(check(f"{what}: {type(exc).__name__}", isinstance(exc, expected)))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
