"""The engine interface and the llama.cpp engine: specs instead of names, llama-server's flags and metrics,
the simulated llama-server's contract, and the real pinned llama-server through the pool and the gateway."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from agents.orchestra.engines import ENGINES, engine_spec
from agents.orchestra.engines.llamacpp.engine import parse_llamacpp_metrics
from agents.orchestra.spec import GpuBuild
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.schema import EngineName
from tests.support.llamacpp_engine import engine_for

ROOT = Path(__file__).resolve().parents[3]


# ---------------------------------------------------------------------------- the interface


def test_every_engine_lab_yaml_names_has_one_spec_and_back():
    """The registry is the one list: lab.yaml's and the wire's engine is a constrained name every entry satisfies."""
    for name, cls in ENGINES.items():
        assert TypeAdapter(EngineName).validate_python(name) == name
        assert cls.spec.name == name and cls.kind == name
        assert cls.can_sleep == cls.spec.can_sleep and cls.simulated == cls.spec.simulated


def test_no_hand_written_list_of_engine_names_remains():
    """Three engine names quoted on one line outside the registry's package is a copy of the list that would go stale."""
    quoted = re.compile("|".join(rf"[\"']{re.escape(name)}[\"']" for name in ENGINES))
    offenders = []
    for folder in ("agents", "console", "widgets"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.parent == ROOT / "agents" / "orchestra" / "engines":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if len(quoted.findall(line)) >= 3:
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_no_code_outside_the_engine_modules_asks_an_engine_by_its_name():
    """`model.engine == "sim"`, `engine in ("vllm", "sim")`: every such question goes to the engine's spec."""
    by_name = re.compile(r"""engine\s*(==|!=|in|not in)\s*[(\[{]?\s*["'](vllm|sim|transformers|llamacpp|sim-llamacpp)["']""")
    offenders = []
    for folder in ("agents", "console", "widgets"):
        for path in (ROOT / folder).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if by_name.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_what_each_engine_declares():
    vllm, llama, sim_llama = engine_spec("vllm"), engine_spec("llamacpp"), engine_spec("sim-llamacpp")
    assert vllm.can_sleep and vllm.hot_adapters and vllm.min_compute_capability == 7.0 and vllm.multi_gpu == "tensor-parallel"
    assert not llama.can_sleep and llama.free_mode == "stop" and llama.adapters == "at-start" and llama.adapter_format == "gguf"
    assert llama.model_formats == ("gguf",) and llama.multi_gpu == "layer-split" and llama.min_compute_capability == 5.0
    assert llama.metric_names["generation_tokens_total"] == "llamacpp:tokens_predicted_total"
    assert sim_llama.simulated and not llama.simulated and sim_llama.adapters == llama.adapters
    assert llama.accepts("/m/llama-70b.Q4_K_M.gguf") == "gguf" and llama.accepts("/m/llama-70b") is None
    with pytest.raises(KeyError, match="no engine named 'tgi'"):
        engine_spec("tgi")


def test_gpu_build_answers_which_gpus_a_build_runs_on():
    p40, v100, old = 6.1, 7.0, 3.5
    cuda = GpuBuild("cuda", ("61", "70"), 5.0)
    assert cuda.runs_on(p40) and cuda.runs_on(v100) and not cuda.runs_on(8.6) and not cuda.runs_on(old)
    assert GpuBuild("cuda", ("75", "80"), 7.0).runs_on(p40) is False  # below the engine's floor
    assert GpuBuild("cuda", (), 7.0).runs_on(8.0) is None  # archs not known
    assert GpuBuild("cpu").runs_on(p40) is False and GpuBuild("absent").runs_on(p40) is False


def test_llamacpp_metrics_become_the_console_figures():
    text = (
        "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n# TYPE llamacpp:prompt_tokens_total counter\n"
        "llamacpp:prompt_tokens_total 12\n# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 40\n"
        "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n"
        "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 1\n"
    )
    figures = parse_llamacpp_metrics(text)
    assert figures["prompt_tokens_total"] == 12 and figures["generation_tokens_total"] == 40
    assert figures["requests_running"] == 2 and figures["requests_waiting"] == 1
    assert figures["kv_cache_pct"] is None and figures["ttft_count"] is None  # llama-server has neither series


def test_a_hugging_face_folder_on_llamacpp_is_refused_with_the_way_out(tmp_path):
    engine = engine_for({"name": "hf", "path": str(tmp_path)}, [])
    with pytest.raises(RemoteError) as exc:
        engine.check()
    assert exc.value.code == ErrorCode.UNAVAILABLE
    assert "one .gguf file" in exc.value.message or "llama-server is not" in exc.value.message
