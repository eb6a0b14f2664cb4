"""The first hour, what was left (issue 32): the words of a dry run, `cetlab status` on the gateway and the models, one
plural rule, a purge that leaves nothing, a missing model file said as such, a re-added gateway key from zero."""

from __future__ import annotations

import subprocess
from pathlib import Path

from agents.gateway.keys import KeyStore
from agents.gateway.metering import Meter, Record
from agents.runtime.store import Store
from agents.wire.catalogue.gateway import KeyAddParams
from console import machine_remote as remote


def test_a_purge_leaves_no_empty_cetlab_folder_behind_and_spares_what_else_is_there(tmp_path):
    """--purge took the agent's state folder but left ~/.local/state/cetlab (and ~/.cache/cetlab) empty behind; the
    folders go when nothing else is in them, and a folder with something else in it stays with it."""
    home = tmp_path / "home"
    layout = remote.Layout(
        home=str(home),
        base=f"{home}/.local/share/cetlab",
        venvs=f"{home}/.local/share/cetlab/venvs",
        venv=f"{home}/.local/share/cetlab/venv",
        wheelhouse=f"{home}/.cache/cetlab/wheelhouse",
        lab=f"{home}/.local/share/cetlab/lab.yaml",
        state=f"{home}/.local/state/cetlab/agent-box",
    )
    for folder in (layout.state + "/runs", layout.venvs + "/k1", layout.wheelhouse + "/k1"):
        Path(folder).mkdir(parents=True)
        (Path(folder) / "file").write_text("x")
    mine = home / ".local" / "state" / "other-tool"
    mine.mkdir(parents=True)
    subprocess.run(["sh", "-c", remote.purge(layout, uid=1000)], check=True)
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == [".cache", ".local", ".local/share", ".local/state", ".local/state/other-tool"]

    # a second agent's state beside it (another name on the same machine): its folder is kept, with it
    Path(layout.state).mkdir(parents=True)
    (home / ".local" / "state" / "cetlab" / "agent-b").mkdir()
    subprocess.run(["sh", "-c", remote.purge(layout, uid=1000)], check=True)
    assert [p.name for p in (home / ".local" / "state" / "cetlab").iterdir()] == ["agent-b"]


def _used(keys: KeyStore, meter: Meter, token: str, tokens: int) -> None:
    key = keys.lookup(token)
    assert key is not None
    keys.admit(key)
    keys.charge(key, tokens)
    keys.spend(key, 0.5)
    meter.record(Record(key=key.name, model="m", tier="provider", target="p", status=200, stream=False,
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
