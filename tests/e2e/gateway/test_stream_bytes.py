"""A stream's events passed on as bytes where the gateway need not rewrite them: the same events, ids, names, roles,
usage and token counts as parsing each one gives, for llama-server's own chunks and for every shape that must be
parsed (usage, several choices, tool calls, keys and names inside content, whitespace, several lines)."""

from __future__ import annotations

import pytest

from tests.support.stream_bytes import CONTENTS, both, llama_chat_stream, sse


@pytest.mark.parametrize("wants_usage", [False, True])
@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("upstream_model", ["tiny", "tiny.gguf", None])
def test_llama_server_chunks_come_out_as_parsing_them_gives(wants_usage: bool, chat: bool, upstream_model: str | None):
    events = llama_chat_stream(CONTENTS)
    if upstream_model not in ("tiny", None):
        events = [{**e, "model": upstream_model} if isinstance(e, dict) else e for e in events]
    fast, slow = both(sse(*events), wants_usage=wants_usage, chat=chat, upstream_model=upstream_model)
    assert fast == slow
    decoded, tokens, usage = fast
    assert tokens == 1 + len(CONTENTS)  # the role chunk too: it is still generating
    assert usage == {"completion_tokens": 4, "prompt_tokens": 9, "total_tokens": 13}
    assert all(e["model"] == "tiny" for e in decoded if isinstance(e, dict))
    assert all(e["id"] == ("chatcmpl-Xy12" if chat else "cmpl-Xy12") for e in decoded if isinstance(e, dict))
    assert decoded[-1] == b"[DONE]"
    assert any("usage" in e for e in decoded if isinstance(e, dict)) is wants_usage
