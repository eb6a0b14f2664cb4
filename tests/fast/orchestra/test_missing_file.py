"""A model whose file is missing is refused, saying so, where, and the fix."""

from __future__ import annotations

import aiohttp
import pytest

from agents.wire.protocol import ErrorCode, RemoteError


async def test_a_model_whose_file_is_missing_is_refused_saying_so_where_and_the_fix(gateway_lab):
    """Warmed, or asked through the gateway, a model whose path is missing answered `no_room` (the gateway) or a bare
    not_found: now its own code, the path, the machine and the doctor's fix."""
    lab, client, url = gateway_lab
    with pytest.raises(RemoteError) as refused:
        await client.call("box", "models.warm", {"model": "ghost"})
    path = lab.lab.resolve(next(m for m in lab.lab.models if m.name == "ghost").path)
    assert refused.value.code == ErrorCode.MODEL_FILE_MISSING
    assert f"model ghost on box: {path} does not exist: `mkdir -p {path}`" in refused.value.message
    key = (await client.call("box", "gateway.keys.add", {"name": "t"}))["key"]
    body = {"model": "ghost", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
            status, error = r.status, (await r.json(content_type=None))["error"]
            retry_after = r.headers.get("Retry-After")
    assert (status, error["code"], retry_after) == (503, "model_file_missing", None), error
    assert f"{path} does not exist: `mkdir -p {path}`" in error["message"]
