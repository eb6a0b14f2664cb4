"""A model without vram_gib in a running lab: the agent estimates its need from its GGUF, placement refuses a GPU too
small for it saying where the figure comes from, `cetlab models` gives the need, its source and where it fits, and
the doctor warns of a typed vram_gib far from its files' estimate."""

from __future__ import annotations

import json

import pytest

from agents.orchestra.engines.llamacpp.tiny_gguf import write_tiny_gguf
from agents.orchestra.weights.vram import estimate_files
from agents.shell.doctor import WARN, check_models
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.vram_fit import GIB, gib
from tests.support.vram import fake_vocab
from tests.support.waits import wait_for
from widgets.format import fmt_gib

SMALL = {"name": "Tiny GPU", "memory_gib": 0.25, "tdp_w": 30}  # SIM: smaller than any GPU, and than the model's need


P40 = {"name": "Tesla P40", "memory_gib": 24, "tdp_w": 250}


def model(name: str, path: str, gpus: list[int], **extra) -> dict:
    return {"name": name, "path": path, "engine": "sim", "machine": "box", "gpus": gpus, **extra}


@pytest.fixture
async def lab(in_process, tmp_path):
    write_tiny_gguf(tmp_path / "models" / "tiny.gguf", fake_vocab(tmp_path), context=2048)
    data = {
        "lab": "vram-lab",
        "machines": [{"name": "box", "gpus": {"sim": [SMALL, P40]}}],
        "models": [
            model("est", "models/tiny.gguf", [0]),
            model("typed", "models/tiny.gguf", [1], vram_gib=4),
            model("gone", "models/gone.gguf", [1]),
        ],
    }
    return await in_process(data)


async def test_the_agent_estimates_a_left_out_need_from_the_gguf_and_placement_goes_by_it(lab, tmp_path):
    client = lab.client()
    await client.start()
    await client.wait_connected(10)
    expected = estimate_files(tmp_path / "models" / "tiny.gguf", [], 1)
    assert expected.bytes is not None and 0.25 * GIB < expected.bytes < 24 * GIB

    est = await client.call("box", "models.get", {"model": "est"})
    assert (est["vram_need_bytes"], est["vram_source"]) == (expected.bytes, "estimated from GGUF header")
    assert "2048 tokens of f16 cache" in est["vram_detail"]
    typed = await client.call("box", "models.get", {"model": "typed"})
    assert (typed["vram_need_bytes"], typed["vram_source"]) == (4 * GIB, "lab.yaml")
    gone = await client.call("box", "models.get", {"model": "gone"})
    assert gone["vram_need_bytes"] is None and gone["vram_source"] == "unknown" and "missing" in gone["vram_detail"]

    await wait_for(lambda: client.state.machines["box"].gpus)  # placement needs one sample
    with pytest.raises(RemoteError) as refused:
        await client.call("box", "models.warm", {"model": "est"})
    assert refused.value.code == ErrorCode.CONFLICT
    assert "est needs" in refused.value.message and "on GPU 0 of box" in refused.value.message
    assert "estimated from GGUF header: vram_gib in lab.yaml overrides it" in refused.value.message


async def test_cetlab_models_says_each_need_its_source_and_where_it_fits(lab, tmp_path, capsys):
    from console.cli.main import Context, build_parser

    client = lab.client()
    await client.start()
    await client.wait_connected(10)
    await wait_for(lambda: len(client.state.machines["box"].gpus) == 2)

    async def run(*argv: str) -> str:
        args = build_parser().parse_args(list(argv))
        assert await args.func(Context(args, lab.lab, client)) == 0
        return capsys.readouterr().out

    listed = {m["name"]: m for m in json.loads(await run("--json", "models"))["models"]}
    need = estimate_files(tmp_path / "models" / "tiny.gguf", [], 1).bytes
    assert need is not None
    assert listed["est"]["vram_gib"] == round(need / GIB, 2) and listed["est"]["vram_source"] == "estimated from GGUF header"
    assert listed["est"]["fits"] == "fits on box GPU 1"  # GPU 0 (0.25 GiB) is too small for it
    assert (listed["typed"]["vram_gib"], listed["typed"]["vram_source"]) == (4.0, "lab.yaml")
    assert (listed["gone"]["vram_gib"], listed["gone"]["vram_source"], listed["gone"]["fits"]) == (None, "unknown", "")

    text = await run("models")
    assert "VRAM needed:" in text
    assert f"  est: {fmt_gib(need)} estimated from GGUF header; fits on box GPU 1" in text, text
    assert "  typed: 4.0G lab.yaml; fits on box GPU 1" in text
    assert "  gone: unknown (the model's files are missing: " in text


def test_the_doctor_warns_of_a_typed_vram_gib_far_from_the_files_estimate(lab, tmp_path):
    checks = {c.name: c for c in check_models(lab.lab, "box")}
    warned = checks["model typed vram"]
    need = estimate_files(tmp_path / "models" / "tiny.gguf", [], 1).bytes
    assert warned.level == WARN and need is not None and need < 4 * GIB / 1.5
    assert f"lab.yaml says vram_gib: 4, its files say {gib(need)} (estimated from GGUF header" in warned.message
    assert "model est vram" not in checks  # estimated and nothing typed: nothing to compare
    assert "model gone vram" not in checks  # missing: the engine's own check says so


async def test_a_model_file_replaced_at_rest_is_estimated_again(lab, tmp_path):
    client = lab.client()
    await client.start()
    await client.wait_connected(10)
    path = tmp_path / "models" / "tiny.gguf"
    before = (await client.call("box", "models.get", {"model": "est"}))["vram_need_bytes"]
    smaller = write_tiny_gguf(tmp_path / "q8.gguf", fake_vocab(tmp_path), context=2048, weight_type="q8_0")
    smaller.replace(path)
    after = estimate_files(path, [], 1).bytes
    assert after is not None and after < before

    async def estimated_again() -> bool:
        return (await client.call("box", "models.get", {"model": "est"}))["vram_need_bytes"] == after

    await wait_for(estimated_again, 30)
