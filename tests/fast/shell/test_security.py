"""Security: roles on every method, the audit trail, rate limits, refused key files and state dirs."""

from __future__ import annotations

import json

import pytest

from agents.wire.protocol import RemoteError
from tests.support.waits import wait_for


async def test_operator_actions_are_audited_with_params_and_outcome(in_process):
    """The audit component through the wire, the agent in this process: who is the channel's caller, as a key's comment
    is over SSH (the viewer's test above goes through the SSH door)."""
    client = (await in_process()).client(who="demo-console")
    await client.start()
    await client.wait_connected(10)
    try:
        before = (await client.call("box", "audit.list", {"limit": 1}))["total"]
        await client.call("box", "set_interval", {"interval_s": 1.0})
        with pytest.raises(RemoteError):
            await client.call("box", "set_interval", {"interval_s": 1000})
        with pytest.raises(RemoteError):
            await client.call("box", "jobs.start", {"recipe": "no-such-recipe", "params": {"lr": 0.1}})
        await client.call("box", "ping")  # viewer-level calls are not actions
        trail = await client.call("box", "audit.list", {"limit": 3})
        assert trail["total"] == before + 3
        newest, middle, oldest = trail["entries"]
        assert (oldest["method"], oldest["outcome"], json.loads(oldest["params"])) == ("set_interval", "ok", {"interval_s": 1.0})
        assert (middle["outcome"], middle["method"]) == ("invalid_params", "set_interval") and "interval_s" in middle["message"]
        assert newest["method"] == "jobs.start" and newest["outcome"] == "not_found"
        assert json.loads(newest["params"]) == {"params": {"lr": 0.1}, "recipe": "no-such-recipe"}
        assert newest["who"] == "demo-console" and newest["role"] == "operator"
        assert oldest["t"] <= middle["t"] <= newest["t"] and newest["duration_s"] >= 0
        view = client.state.machines["box"]
        await wait_for(lambda: view.audit.count == before + 3, timeout=10)
    finally:
        await client.stop()
