"""The method catalogue against a real agent: every method it registers is catalogued (and back), every reply
validates against its result model and round-trips to the JSON the agent sent, a bad reply is a typed error."""

from __future__ import annotations

from typing import Any

import pytest

from agents.runtime.rpc import Peer, Registry
from agents.wire.catalogue.agent import HELLO, PING, Ping
from agents.wire.catalogue.index import CATALOGUE, parse_result
from agents.wire.catalogue.method import Method, NoParams, ReplyInvalid, request
from agents.wire.protocol import ErrorCode, RemoteError, Role

pytestmark = pytest.mark.timeout(240)


# ---------------------------------------------------------------------------- bad replies, bad registrations


class _Canned:
    """A Caller that answers one canned reply."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply

    async def call(self, machine: str, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        return self.reply


async def test_a_reply_that_does_not_validate_is_reply_invalid_naming_method_and_field():
    model = {"name": "a", "machine": "box", "engine": "sim", "state": "warm", "since": 1.0}
    listing = await request(_Canned({"machine": "box", "models": [model]}), "box", CATALOGUE["models.list"])
    assert listing.models[0].name == "a"
    with pytest.raises(ReplyInvalid) as caught:
        await request(_Canned({"machine": "box", "models": [{**model, "state": "toasted"}]}), "box", CATALOGUE["models.list"])
    error = caught.value
    assert isinstance(error, RemoteError) and error.code is ErrorCode.INVALID_REPLY
    assert error.method == "models.list" and error.field == "models.0.state"
    assert "models.list" in str(error) and "models.0.state" in str(error) and "toasted" in str(error)
    with pytest.raises(ReplyInvalid, match=r"jobs\.list .* at 0\.started_at"):
        parse_result(
            "jobs.list",
            [{"id": "box-1", "recipe": "r", "machine": "box", "state": "running", "output_dir": "o", "log_path": "l"}],
        )
    with pytest.raises(ReplyInvalid, match=r"ping .* at \(the reply\)"):
        parse_result("ping", None)


def test_the_registry_refuses_a_method_the_catalogue_does_not_know_or_registered_twice():
    registry = Registry()

    async def handler(peer: Peer, params: NoParams) -> Ping:
        return Ping(t=0.0)

    with pytest.raises(ValueError, match="'models.frobnicate' is not in the catalogue"):
        registry.implements(Method("models.frobnicate", NoParams, Ping))(handler)
    with pytest.raises(ValueError, match="'ping' is not in the catalogue .*as this entry"):  # a copy of the entry is not it
        registry.implements(Method("ping", NoParams, Ping))(handler)
    registry.implements(PING)(handler)
    assert registry.specs["ping"] is CATALOGUE["ping"]
    with pytest.raises(ValueError, match="ping registered twice"):
        registry.implements(PING)(handler)


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # the wrong value this test builds on purpose
async def test_the_agent_answers_internal_rather_than_send_a_result_its_model_refuses():
    registry = Registry()
    peer = Peer(role=Role.VIEWER, who="test", send=lambda line: None)

    @registry.implements(PING)
    async def ping(peer: Peer, params: NoParams) -> Ping:
        return Ping.model_construct(t="noon")  # built unchecked: the registry's own check refuses it

    answer = await registry.dispatch(peer, {"id": 1, "method": "ping"})
    assert answer["error"]["code"] == "internal" and "ping" in answer["error"]["message"] and "at t" in answer["error"]["message"]

    @registry.implements(HELLO)
    async def hello(peer: Peer, params: NoParams) -> Any:  # typed Any, the type check cannot see it: the run-time one does
        return Ping(t=1.0)

    answer = await registry.dispatch(peer, {"id": 2, "method": "hello"})
    assert answer["error"]["code"] == "internal" and "is not a Hello" in answer["error"]["message"]
