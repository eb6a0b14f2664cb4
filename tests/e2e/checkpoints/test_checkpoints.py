"""Checkpoints end to end: real checkpoints of the tiny trainer, real agents over SSH, real deletes, resumes and serving."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agents.checkpoints.parsing import Checkpoint, history_points, mark_best
from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from agents.wire.protocol import ErrorCode, RemoteError
from console.lab.client import FleetClient
from tests.support.lab import HOUR_S, age
from tests.support.pool import engine_http
from tests.support.waits import wait_for

PY = sys.executable


V100 = {"name": "Tesla V100", "memory_gib": 32, "tdp_w": 250}


SPEC_KEYS = {
    "run",
    "step",
    "epoch",
    "path",
    "written_at",
    "size_bytes",
    "loss",
    "eval_loss",
    "save_s",
    "is_best",
    "kept",
    "kind",
    "complete",
    "problem",
}


pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def lab(checkpoints_lab):
    """The checkpoints lab of tests/conftest.py (real checkpoints, one agent), for this module."""
    return checkpoints_lab


@pytest.fixture
async def client(lab):
    client = FleetClient(load_lab(lab.lab_path))
    await client.start()
    await client.wait_connected(15)
    assert client.state.machines["box"].online, client.state.machines["box"].error
    yield client
    await client.stop()


async def error_of(client: FleetClient, method: str, params: dict) -> RemoteError:
    with pytest.raises(RemoteError) as info:
        await client.call("box", method, params)
    return info.value


async def wait_job(client: FleetClient, job_id: str, timeout: float = 120) -> dict:
    async def ended() -> dict | None:
        job = await client.call("box", "jobs.get", {"id": job_id})
        return job if job["state"] in ("exited", "failed", "lost") else None

    return await wait_for(ended, timeout=timeout, interval=0.3)


def cli(lab: DemoLab, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "console.cli.main", "--lab", str(lab.lab_path), *args], capture_output=True, text=True, timeout=60
    )


# ---------------------------------------------------------------------------- parsing


def test_log_history_keys_vary_between_versions():
    history = [
        {"global_step": 1, "train_loss": 2.0},  # an old version's key names
        {"step": 2, "loss": 1.5, "epoch": 0.1},
        {"step": 2, "eval_loss": 1.7},
        {"step": 3, "loss": float("nan")},  # not a number JSON can carry: skipped
        {"step": 4, "loss": 1.2},
        {"step": 4, "train_loss": 1.6, "train_runtime": 9.0},  # the end-of-run average does not replace step 4's loss
        "garbage",
        {"loss": 1.0},
    ]
    loss, evals = history_points(history)
    assert loss == [[1, 2.0], [2, 1.5], [4, 1.2]] and evals == [[2, 1.7]]


def test_best_is_named_then_lowest_eval_then_lowest_loss():
    def ckpts(*rows):
        return [Checkpoint(run="r", step=s, path=f"/r/checkpoint-{s}", loss=loss, eval_loss=e) for s, loss, e in rows]

    plain = ckpts((1, 3.0, None), (2, 1.0, None), (3, 2.0, None))
    mark_best(plain)
    assert [c.is_best for c in plain] == [False, True, False] and plain[-1].newest
    evals = ckpts((1, 0.5, 2.0), (2, 1.0, 1.5), (3, 0.1, None))
    mark_best(evals)
    assert [c.step for c in evals if c.is_best] == [2]
    named = ckpts((1, 3.0, 1.0), (2, 1.0, 2.0))
    named[-1].best_path = "/elsewhere/checkpoint-2"
    mark_best(named)
    assert [c.step for c in named if c.is_best] == [2]


# ---------------------------------------------------------------------------- through the agent


async def test_discovers_a_hand_started_run_with_its_details(client, lab, hand_runs):
    runs = {r["run"]: r for r in await client.call("box", "checkpoints.runs")}
    assert {"exp1", "exp2", "exp3"} <= set(runs)
    exp1 = runs["exp1"]
    assert exp1["count"] == 8 and exp1["incomplete"] == 3 and exp1["newest_step"] == 8 and exp1["job"] is None
    listing = await client.call("box", "checkpoints.list", {"run": "exp1"})
    items = {c["step"]: c for c in listing["checkpoints"]}
    assert sorted(items) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    state = json.loads((hand_runs / "exp1" / "checkpoint-8" / "trainer_state.json").read_text())
    logged = {row["step"]: row["loss"] for row in state["log_history"] if "loss" in row}
    progress = json.loads((hand_runs / "exp1" / "progress.json").read_text())
    reported = {c["step"]: c["save_s"] for c in progress["checkpoints"]}
    for step in range(1, 9):
        c = items[step]
        assert SPEC_KEYS <= set(c)
        assert c["complete"] and c["problem"] is None and c["kind"] == "adapter" and c["has_optimizer"]
        assert c["loss"] == logged[step] and c["eval_loss"] is None and c["epoch"] > 0
        assert c["save_s"] == round(reported[step], 3) and c["save_s_from"] == "trainer"
        folder = hand_runs / "exp1" / f"checkpoint-{step}"
        assert c["path"] == str(folder) and c["size_bytes"] == sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    best = min(range(1, 9), key=lambda s: (logged[s], s))
    assert [s for s, c in items.items() if c["is_best"]] == [best] and exp1["best_step"] == best
    assert [s for s, c in items.items() if c["newest"]] == [8]
    assert not items[9]["complete"] and "trainer_state.json is unreadable" in items[9]["problem"]
    assert not items[10]["complete"] and "save in progress" in items[10]["problem"]
    assert not items[11]["complete"] and "temporary folder" in items[11]["problem"]
    assert listing["disk_bytes"] == sum(c["size_bytes"] for c in items.values())
    assert listing["save_s_total"] == pytest.approx(sum(round(v, 3) for v in reported.values()), abs=1e-3)
    assert 0 < listing["save_share_pct"] < 100 and listing["wall_s"] == progress["elapsed_s"]
    assert listing["curves"]["loss"] == [[s, logged[s]] for s in sorted(logged)]
    # the section pushed to consoles carries the same summary
    await wait_for(lambda: any(r.run == "exp1" for r in client.state.machines["box"].checkpoints))
    # nothing was deleted on the way, and bad input is a typed error that leaves the agent serving
    assert (hand_runs / "exp1" / "checkpoint-9").is_dir() and (hand_runs / "exp1" / "tmp-checkpoint-11").is_dir()
    assert (await error_of(client, "checkpoints.list", {"run": "nope"})).code == ErrorCode.NOT_FOUND
    missing = await error_of(client, "checkpoints.keep", {"run": "exp1", "step": 99})
    assert missing.code == ErrorCode.NOT_FOUND and "steps: 1, 2" in missing.message
    assert (await error_of(client, "checkpoints.prune", {"run": "exp1", "keep_last": -1})).code == ErrorCode.INVALID_PARAMS
    assert (await error_of(client, "checkpoints.resume", {"run": "exp1", "step": 8})).code == ErrorCode.UNAVAILABLE
    assert "t" in await client.call("box", "ping")


async def test_cli_lists_runs_and_checkpoints_as_json(lab):
    runs = cli(lab, "--json", "checkpoints")
    assert runs.returncode == 0, runs.stderr
    assert any(r["run"] == "exp1" and r["machine"] == "box" for r in json.loads(runs.stdout)["runs"])
    one = cli(lab, "--json", "checkpoints", "exp1")
    assert one.returncode == 0, one.stderr
    data = json.loads(one.stdout)
    assert data["run"] == "exp1" and all(SPEC_KEYS <= set(c) for c in data["checkpoints"])
    human = cli(lab, "checkpoints", "exp1")
    assert "BEST" in human.stdout and "INCOMPLETE" in human.stdout
    missing = cli(lab, "checkpoints", "no-such-run")
    assert missing.returncode == 1 and "no run 'no-such-run'" in missing.stderr


async def test_prune_keeps_best_last_n_and_kept_only(client, lab, hand_runs):
    listing = await client.call("box", "checkpoints.list", {"run": "exp2"})
    best = next(c["step"] for c in listing["checkpoints"] if c["is_best"])
    kept_step = next(s for s in (1, 2, 3) if s != best)
    kept = await client.call("box", "checkpoints.keep", {"run": "exp2", "step": kept_step})
    assert kept["kept"] is True
    pruned = cli(lab, "--json", "prune", "exp2", "--keep-last", "2")
    assert pruned.returncode == 0, pruned.stderr
    result = json.loads(pruned.stdout)
    survivors = {best, kept_step, 7, 8}
    assert sorted(c["step"] for c in result["deleted"]) == sorted(set(range(1, 9)) - survivors)
    assert sorted(c["step"] for c in result["kept"]) == sorted(survivors)
    assert sorted(c["step"] for c in result["skipped"]) == [9, 10, 11]  # incomplete ones are never pruned
    on_disk = sorted(p.name for p in (hand_runs / "exp2").iterdir() if p.is_dir())
    assert on_disk == sorted([f"checkpoint-{s}" for s in survivors] + ["checkpoint-9", "checkpoint-10", "tmp-checkpoint-11"])
    assert result["freed_bytes"] == sum(c["size_bytes"] for c in result["deleted"])
    # kept survives a second prune; un-keeping lets the next prune take it
    again = await client.call("box", "checkpoints.prune", {"run": "exp2", "keep_last": 2})
    assert again["deleted"] == []
    await client.call("box", "checkpoints.keep", {"run": "exp2", "step": kept_step, "kept": False})
    third = await client.call("box", "checkpoints.prune", {"run": "exp2", "keep_last": 2})
    assert [c["step"] for c in third["deleted"]] == ([kept_step] if kept_step not in (best, 7, 8) else [])


async def test_delete_asks_twice_for_the_best_and_the_newest(client, hand_runs):
    listing = await client.call("box", "checkpoints.list", {"run": "exp3"})
    best = next(c["step"] for c in listing["checkpoints"] if c["is_best"])
    ordinary = next(s for s in range(1, 8) if s != best)
    done = await client.call("box", "checkpoints.delete", {"run": "exp3", "step": ordinary})
    assert done["deleted"][0]["step"] == ordinary and not (hand_runs / "exp3" / f"checkpoint-{ordinary}").exists()
    for special in {best, 8}:
        refused = await error_of(client, "checkpoints.delete", {"run": "exp3", "step": special})
        assert refused.code == ErrorCode.CONFLICT and ("the best" in refused.message or "the newest" in refused.message)
        assert (hand_runs / "exp3" / f"checkpoint-{special}").is_dir()
    await client.call("box", "checkpoints.delete", {"run": "exp3", "step": 8, "confirm_special": True})
    assert not (hand_runs / "exp3" / "checkpoint-8").exists()
    after = await client.call("box", "checkpoints.list", {"run": "exp3"})
    assert [c["step"] for c in after["checkpoints"] if c["newest"]] == [7]
    # an incomplete checkpoint can be deleted by hand
    await client.call("box", "checkpoints.delete", {"run": "exp3", "step": 9})
    assert not (hand_runs / "exp3" / "checkpoint-9").exists()


async def test_resume_from_a_checkpoint_continues_the_step_count(client, lab):
    first = await client.call("box", "jobs.start", {"recipe": "tiny", "params": {"max_steps": 4, "save_steps": 2}})
    done = await wait_job(client, first["id"])
    assert done["exit_code"] == 0, done["last_lines"]
    run = await client.call("box", "checkpoints.list", {"run": first["id"]})
    assert run["job"] == first["id"] and run["recipe"] == "tiny" and run["job_state"] == "exited"
    assert [c["step"] for c in run["checkpoints"]] == [2, 4] and run["save_share_pct"] is not None
    step2 = run["checkpoints"][0]
    resumed = await client.call("box", "checkpoints.resume", {"run": first["id"], "step": 2, "params": {"max_steps": 6}})
    assert resumed["resumed_from"]["step"] == 2
    assert resumed["argv"][-2:] == ["--resume-from-checkpoint", step2["path"]]
    assert resumed["params"]["max_steps"] == 6 and resumed["params"]["save_steps"] == 2
    second = await wait_job(client, resumed["id"])
    assert second["exit_code"] == 0 and second["step"] == 6, second["last_lines"]
    # the finished job no longer holds step 2: the listing (the CLI's answer) and the pushed summary (the console's) agree
    assert next(c for c in (await client.call("box", "checkpoints.list", {"run": first["id"]}))["checkpoints"])["in_use"] is None
    await wait_for(lambda: any(r.run == first["id"] and not r.in_use for r in client.state.machines["box"].checkpoints), 30)
    run2 = await client.call("box", "checkpoints.list", {"run": resumed["id"]})
    assert [c["step"] for c in run2["checkpoints"]] == [4, 6]  # the count went on from 2, not from 0
    state = json.loads(Path(run2["checkpoints"][-1]["path"], "trainer_state.json").read_text())
    assert state["global_step"] == 6
    assert run2["curves"]["loss"][0][0] == 1  # the history came along with the resumed state
    bad = await error_of(client, "checkpoints.resume", {"run": first["id"], "step": 2, "params": {"nope": 1}})
    assert bad.code == ErrorCode.INVALID_PARAMS and "no param nope" in bad.message


async def test_serve_an_adapter_into_a_warm_model_and_merged_on_transformers(client, lab, hand_runs):
    await wait_for(
        lambda: any(m.name == "tiny-sim" and m.state == "warm" for m in client.state.machines["box"].model_list), timeout=60
    )
    # 1. the warm sim model of the same base loads the adapter at run time (vLLM's /v1/load_lora_adapter)
    served = await client.call("box", "checkpoints.serve", {"run": "exp1", "step": 4})
    assert served["mode"] == "adapter" and served["model"] == "tiny-sim" and served["base_matches"] and served["simulated"]
    ids = [m["id"] for m in json.loads(engine_http(served["endpoint"].removesuffix("/v1") + "/v1/models")[1])["data"]]
    assert served["served_name"] in ids
    in_use = await error_of(client, "checkpoints.delete", {"run": "exp1", "step": 4})
    assert in_use.code == ErrorCode.CONFLICT and "served by model tiny-sim" in in_use.message
    # 2. transformers serve cannot load adapters: merged into a copy of the base, served as a new model
    merged = await client.call("box", "checkpoints.serve", {"run": "exp1", "step": 8, "model": "tiny-hf"})
    assert merged["mode"] == "merged" and merged["engine"] == "transformers" and merged["state"] in ("merging", "loading")
    name = merged["model"]

    async def state() -> dict:
        listing = await client.call("box", "checkpoints.list", {"run": "exp1"})
        return next(c for c in listing["checkpoints"] if c["step"] == 8)["serving"]

    async def settled() -> dict | None:
        serving = await state()
        return serving if serving["state"] in ("warm", "failed") else None

    serving = await wait_for(settled, timeout=200, interval=0.5)
    assert serving["state"] == "warm", serving
    model = await client.call("box", "models.get", {"model": name})
    body = {"model": model["served_name"], "messages": [{"role": "user", "content": "Capital of France:"}], "max_tokens": 4}
    status, raw = await asyncio.to_thread(engine_http, model["endpoint"].removesuffix("/v1") + "/v1/chat/completions", body)
    answer = json.loads(raw)
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"] is not None and answer["usage"]["completion_tokens"] >= 1
    in_use = await error_of(client, "checkpoints.delete", {"run": "exp1", "step": 8, "confirm_special": True})
    assert in_use.code == ErrorCode.CONFLICT and f"served by model {name}" in in_use.message
    await client.call("box", "models.cold", {"model": name}, timeout=30)


async def test_an_adapter_vllm_refuses_is_merged_on_the_warm_models_engine(client, lab, hand_runs, tiny_model):
    """modules_to_save (the demo recipe trains embed_tokens and lm_head): vLLM cannot hot-load it, so serve merges it."""
    from safetensors.torch import load_file, save_file

    await wait_for(
        lambda: any(m.name == "tiny-sim" and m.state == "warm" for m in client.state.machines["box"].model_list), timeout=60
    )
    run = hand_runs / "exp-mts"
    run.mkdir()
    shutil.copytree(hand_runs / "exp1" / "checkpoint-4", run / "checkpoint-4")
    config_file = run / "checkpoint-4" / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "modules_to_save": ["embed_tokens", "lm_head"]}))
    # the whole modules such an adapter carries (PEFT's key names), here the base's own weights
    base = load_file(tiny_model / "model.safetensors")
    weights = load_file(run / "checkpoint-4" / "adapter_model.safetensors")
    embed = base["model.embed_tokens.weight"]
    weights["base_model.model.model.embed_tokens.weight"] = embed.clone()
    weights["base_model.model.lm_head.weight"] = base.get("lm_head.weight", embed).clone()
    save_file(weights, run / "checkpoint-4" / "adapter_model.safetensors")
    age(run / "checkpoint-4", HOUR_S)

    async def discovered() -> bool:
        return any(r["run"] == "exp-mts" for r in await client.call("box", "checkpoints.runs"))

    await wait_for(discovered, timeout=30, interval=0.3)
    served = await client.call("box", "checkpoints.serve", {"run": "exp-mts", "step": 4})
    assert served["mode"] == "merged" and served["engine"] == "sim", served
    assert "modules_to_save" in served["why_merged"] and "embed_tokens" in served["why_merged"]

    async def serving() -> dict:
        listing = await client.call("box", "checkpoints.list", {"run": "exp-mts"})
        return next(c for c in listing["checkpoints"] if c["step"] == 4)["serving"]

    async def settled() -> dict | None:
        state = await serving()
        return state if state["state"] in ("warm", "failed") else None

    state = await wait_for(settled, timeout=200, interval=0.5)
    assert state["state"] == "warm", state
    await client.call("box", "models.cold", {"model": served["model"]}, timeout=30)


async def test_delete_and_prune_refuse_a_run_that_is_a_symlink_out_of_the_watched_folder(client, hand_runs, tmp_path):
    outside = tmp_path / "elsewhere"
    shutil.copytree(hand_runs / "exp1", outside, symlinks=True)
    (hand_runs / "exp-link").symlink_to(outside, target_is_directory=True)

    async def linked() -> bool:
        return any(r["run"] == "exp-link" for r in await client.call("box", "checkpoints.runs"))

    await wait_for(linked, timeout=30, interval=0.3)
    refused = await error_of(client, "checkpoints.delete", {"run": "exp-link", "step": 1})
    assert refused.code == ErrorCode.CONFLICT and "symlink" in refused.message
    refused = await error_of(client, "checkpoints.prune", {"run": "exp-link", "keep_last": 1})
    assert refused.code == ErrorCode.CONFLICT and "symlink" in refused.message
    assert sorted(p.name for p in outside.glob("checkpoint-*")) == sorted(
        p.name for p in (hand_runs / "exp1").glob("checkpoint-*")
    )
    (hand_runs / "exp-link").unlink()
