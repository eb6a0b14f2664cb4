"""A gateway key revoked and added again starts from zero, also after a restart."""

from __future__ import annotations

from agents.gateway.keys import KeyStore
from agents.gateway.metering import Meter
from agents.gateway.metering import Record as Request
from agents.runtime.store import Store
from agents.wire.catalogue.gateway import KeyAddParams


def _used(keys: KeyStore, meter: Meter, token: str, tokens: int) -> None:
    key = keys.lookup(token)
    assert key is not None
    keys.admit(key)
    keys.charge(key, tokens)
    keys.spend(key, 0.5)
    meter.record(Request(key=key.name, model="m", tier="provider", target="p", status=200, stream=False,
                        prompt_tokens=tokens, completion_tokens=0, cost=0.5))  # fmt: skip
    meter.flush()


def test_a_gateway_key_revoked_and_added_again_starts_from_zero_also_after_a_restart(tmp_path):
    """A revoked key's name can be given again (before: refused, "revoke it or pick another name" though it was), and
    the new key does not inherit the old one's requests, tokens today or spend, not even from the request log that a
    restart reads them back from (it is kept by name)."""
    store = Store(tmp_path / "a.db")
    meter = Meter(store, None)
    keys = KeyStore(store, meter.today, meter.month)
    params = KeyAddParams.model_validate({"name": "team", "budget": "5/day"})
    old = keys.add(params)
    _used(keys, meter, old, 100)
    keys.revoke("team")
    new = keys.add(params)
    assert keys.lookup(old) is None  # the old token stays refused
    (row,) = keys.listing()
    assert (row.name, row.revoked_at, row.requests, row.tokens_today, row.spent) == ("team", None, 0, 0, 0.0)
    _used(keys, meter, new, 7)

    again = KeyStore(Store(tmp_path / "a.db"), meter.today, meter.month)  # the agent restarted
    again.seed_usage(meter.key_tokens_today)
    again.seed_money(meter.key_cost)
    (row,) = again.listing()
    assert (row.tokens_today, row.spent) == (7, 0.5)  # its own use only, read back from the log
    live = again.lookup(new)
    assert live is not None and again.lookup(old) is None
