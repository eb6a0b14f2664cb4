"""The gateway driven by the real openai SDK, as lab tools drive it: model listing and lookup, chat and completions
plain and streamed with and without usage, n and stop, errors as the SDK's own classes, a fallback, a wake, a served
checkpoint by name, and a model put to sleep in the middle of a stream. The models on `node` are reached over the
SSH tunnel; everything runs on loopback with real agents."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(240)


def test_upstream_errors_take_openais_shape():
    from agents.gateway.openai_api import upstream_error

    vllm_old = json.loads(
        upstream_error(b'{"object":"error","message":"bad n","type":"BadRequestError","param":"n","code":400}', 400, "m5")
    )
    # a numeric code is the status again, no OpenAI code (a string or null)
    assert vllm_old["error"] == {"message": "bad n", "type": "invalid_request_error", "param": "n", "code": None}
    # llama-server's own: a numeric code and no param; the param is the grammar-making field the request carried
    llama = b'{"error":{"code":400,"message":"Failed to initialize samplers: std::exception","type":"invalid_request_error"}}'
    body = {"messages": [], "response_format": {"type": "json_object"}}
    assert json.loads(upstream_error(llama, 400, "m5", body))["error"] == {
        "message": "Failed to initialize samplers: std::exception",
        "type": "invalid_request_error",
        "param": "response_format",
        "code": None,
    }
    choice = b'{"error":{"code":400,"message":"Invalid tool_choice: bogus","type":"invalid_request_error"}}'
    assert json.loads(upstream_error(choice, 400, "m5", {}))["error"]["param"] == "tool_choice"
    page = json.loads(upstream_error(b"<html>Bad Gateway</html>", 502, "cloud"))
    assert page["error"]["type"] == "server_error" and page["error"]["message"].startswith("cloud answered 502: <html>")
    openai_shaped = b'{"error":{"message":"x","type":"invalid_request_error","param":null,"code":null}}'
    assert upstream_error(openai_shaped, 400, "cloud") == openai_shaped


async def test_the_connection_cap_is_bounded_whatever_the_fd_limit_and_holds_for_ssh_forwards_too(tmp_path):
    import resource
    from types import SimpleNamespace

    from agents.gateway.limits import FD_SHARE, MAX_CONNECTIONS, connection_cap
    from agents.gateway.server import GatewayHttp
    from agents.wire.lab.gateway import GatewayPolicies

    assert connection_cap(None, 1024) == 1024 // FD_SHARE
    assert connection_cap(None, 1_048_576) == MAX_CONNECTIONS == connection_cap(None, resource.RLIM_INFINITY)
    assert connection_cap(7, 1_048_576) == 7  # lab.yaml's figure wins
    policies = GatewayPolicies(max_connections=40)
    http = GatewayHttp(SimpleNamespace(keys=None, meter=None, policies=policies))
    session = http.session_for(SimpleNamespace(unix_socket=str(tmp_path / "forward.sock")))
    try:
        assert session.connector.limit == 40  # the forward's upstream connections: the same cap, not unbounded
    finally:
        await session.close()
