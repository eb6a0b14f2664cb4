"""The first hour, what was left (issue 32): the words of a dry run, `cetlab status` on the gateway and the models, one
plural rule, a purge that leaves nothing, a missing model file said as such, a re-added gateway key from zero."""

from __future__ import annotations

import subprocess
from pathlib import Path

import aiohttp
import pytest

from agents.gateway.keys import KeyStore
from agents.gateway.metering import Meter, Record
from agents.runtime.store import Store
from agents.wire.catalogue.gateway import KeyAddParams
from agents.wire.protocol import ErrorCode, RemoteError
from console import machine_remote as remote
from tests.conftest import wait_for


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


# ---------------------------------------------------------------------------- a lab with a gateway and models


def _lab(with_gateway: bool = True) -> dict:
    data: dict = {
        "lab": "leftovers",
        "machines": [{"name": "box", "gpus": "none"}],
        "models": [
            {"name": "ghost", "path": "models/ghost", "engine": "sim", "machine": "box", "vram_gib": 1},
            {"name": "here", "path": "models/here", "engine": "sim", "machine": "box", "vram_gib": 1,
             "sim": {"placeholder_mib": 1, "load_s": 0.05, "warmup_s": 0.01}},
        ],  # fmt: skip
    }
    if with_gateway:
        data["gateway"] = {"machine": "box", "host": "127.0.0.1", "port": 0}
    return data


@pytest.fixture
async def gateway_lab(in_process):
    lab = await in_process(_lab())
    client = lab.client()
    await client.start()
    await client.wait_connected(10)
    url = await wait_for(lambda: _url(client), 20)
    yield lab, client, url
    await client.stop()


async def _url(client) -> str | None:
    status = await client.call("box", "gateway.status")
    return status and status["url"]


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
