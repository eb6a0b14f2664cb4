"""The trainer on the lab's real GPUs, by stand-ins: precision by compute capability, ranks that stop together."""

from __future__ import annotations

import pytest

from agents.train.config import ConfigError, load_config
from agents.train.precision import PrecisionRefused, compute_dtype, plan_precision
from tests.support.trainer import write_config

# (compute capability, GPU) of the lab's cards
RTX_3050, V100, P40, H100 = ((8, 6), "RTX 3050"), ((7, 0), "Tesla V100"), ((6, 1), "Tesla P40"), ((9, 0), "H100")


@pytest.mark.parametrize(
    ("gpu", "expected"), [(H100, "bf16"), (RTX_3050, "bf16"), (V100, "fp16"), (P40, "fp32"), ((None, "CPU"), "fp32")]
)
def test_auto_precision_follows_the_compute_capability(gpu, expected):
    plan = plan_precision("auto", gpu[0], tf32=False, torch_compile=False, device_name=gpu[1])
    assert plan.precision == expected
    assert plan.notes and expected in plan.notes[0] and gpu[1] in plan.notes[0]


def test_qlora_compute_dtype_follows_the_precision():
    import torch

    expected = {H100: torch.bfloat16, V100: torch.float16, P40: torch.float32}
    for gpu, dtype in expected.items():
        assert compute_dtype(plan_precision("auto", gpu[0], tf32=False, torch_compile=False).precision) == dtype


def test_explicit_bf16_below_ampere_is_refused_with_the_reason():
    for capability, name in (V100, P40):
        with pytest.raises(PrecisionRefused, match=rf"bf16 needs compute capability 8.0.*{name}"):
            plan_precision("bf16", capability, tf32=False, torch_compile=False, device_name=name)
    assert plan_precision("bf16", RTX_3050[0], tf32=False, torch_compile=False).precision == "bf16"
    with pytest.raises(PrecisionRefused, match="fp16 needs a CUDA GPU"):
        plan_precision("fp16", None, tf32=False, torch_compile=False)


def test_tf32_and_compile_only_where_they_work():
    p40 = plan_precision("auto", P40[0], tf32=True, torch_compile=True, device_name=P40[1])
    assert (p40.tf32, p40.torch_compile) == (False, False)
    assert any(n.startswith("tf32 off") for n in p40.notes) and any(n.startswith("torch_compile off: Triton") for n in p40.notes)
    v100 = plan_precision("fp16", V100[0], tf32=True, torch_compile=True)
    assert (v100.tf32, v100.torch_compile) == (False, True)
    ampere = plan_precision("auto", RTX_3050[0], tf32=True, torch_compile=True)
    assert (ampere.tf32, ampere.torch_compile) == (True, True) and len(ampere.notes) == 1


def test_the_old_bf16_key_says_what_replaced_it(tmp_path):
    config = write_config(tmp_path, tmp_path / "no-model", bf16=True)
    with pytest.raises(ConfigError, match="replaced by precision: auto"):
        load_config(config)
