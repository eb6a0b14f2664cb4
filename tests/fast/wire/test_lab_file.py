"""lab.yaml: the demo lab loads; every error names file, line and key path, never a traceback."""

from __future__ import annotations

import pytest

from agents.wire.lab.model import LabError, load_lab, parse_lab
from agents.wire.schema import parse_duration
from console.lab.demo import bundled_lab
from tests.support.lab_file import GOOD_MACHINE


def problems(text: str) -> list[str]:
    with pytest.raises(LabError) as info:
        parse_lab(text, source="lab.yaml")
    return info.value.problems


def test_demo_lab_is_the_field_notes_lab():
    lab = load_lab(bundled_lab())
    assert [m.name for m in lab.machines] == ["m5", "irina", "workstation", "pharaoh"]
    gpus = [g for m in lab.machines for g in m.gpus.sim]
    assert len(gpus) == 9
    assert sum(g.memory_gib for g in gpus) == 156
    assert [g.name for g in lab.machine("m5").gpus.sim] == ["Tesla V100"] + ["Tesla P40"] * 4
    assert all(m.simulated for m in lab.machines)


def test_wrong_type_names_line_and_key_path():
    text = GOOD_MACHINE.replace("memory_gib: 8", "memory_gib: lots")
    (problem,) = problems(text)
    assert problem.startswith("lab.yaml:7: machines[0].gpus.sim[0].memory_gib: ")
    assert "number" in problem and "'lots'" in problem


def test_unknown_key_is_named_with_its_line():
    text = GOOD_MACHINE.replace("    gpus:", "    gpuz: 3\n    gpus:")
    (problem,) = problems(text)
    assert problem.startswith("lab.yaml:5: machines[0].gpuz: unknown key")


def test_missing_required_key():
    (problem,) = problems("machines:\n  - name: box\n")
    assert problem.startswith("lab.yaml:") and "lab: required key is missing" in problem


def test_negative_rate_is_refused_with_its_line():
    text = GOOD_MACHINE.replace("lab: t", "lab: t\ncosts: {electricity_per_kwh: -0.15}")
    (problem,) = problems(text)
    assert problem.startswith("lab.yaml:3: costs.electricity_per_kwh: ")
    assert "greater than or equal to 0" in problem


@pytest.mark.parametrize(
    "where, text",
    [
        ("machines[0].idle_watts", GOOD_MACHINE.replace("    gpus:", "    idle_watts: 1e300\n    gpus:")),
        ("machines[0].hourly_rate", GOOD_MACHINE.replace("    gpus:", "    hourly_rate: 1e300\n    gpus:")),
        ("machines[0].gpus.sim[0].tdp_w", GOOD_MACHINE.replace("tdp_w: 75", "tdp_w: 1e300")),
        ("machines[0].gpus.sim[0].idle_w", GOOD_MACHINE.replace("tdp_w: 75", "tdp_w: 75, idle_w: 1e300")),
        ("costs.electricity_per_kwh", GOOD_MACHINE.replace("lab: t", "lab: t\ncosts: {electricity_per_kwh: 1e300}")),
        ("cloud_prices.gpu_hour.H100", GOOD_MACHINE.replace("lab: t", "lab: t\ncloud_prices: {gpu_hour: {H100: 1e300}}")),
    ],
)
def test_watts_and_prices_past_any_real_one_are_refused(where, text):
    """Issue 30: 1e300 W passed `>= 0` and made every cost it entered inf; a watt or price figure has a sane maximum."""
    (problem,) = problems(text)
    assert f": {where}: " in problem and "less than or equal to" in problem, problem


def test_non_numeric_rate():
    text = GOOD_MACHINE.replace("    gpus:", "    hourly_rate: cheap\n    gpus:")
    (problem,) = problems(text)
    assert problem.startswith("lab.yaml:5: machines[0].hourly_rate: ")


def test_yaml_syntax_error_has_a_line():
    (problem,) = problems("lab: t\nmachines: [\n  - name: box\n")
    assert problem.startswith("lab.yaml:") and "not valid YAML" in problem


def test_duplicate_key():
    (problem,) = problems(GOOD_MACHINE + "lab: again\n")
    assert "lab.yaml:8: lab: key given twice" == problem


def test_references_between_sections_are_checked():
    text = (
        GOOD_MACHINE
        + """
models:
  - {name: m1, path: /m, engine: sim, machine: nowhere}
  - {name: m2, path: /m, engine: sim, machine: box, gpus: [3]}
orchestra: {warm: [m9]}
"""
    )
    found = problems(text)
    assert any(p.startswith("lab.yaml:10: models[0].machine: no machine named 'nowhere'") for p in found)
    assert any(p.startswith("lab.yaml:11: models[1].gpus[0]: machine box has 1 GPU") for p in found)
    assert any(p.startswith("lab.yaml:12: orchestra.warm[0]: no model named 'm9'") for p in found)


def test_trainer_command_must_be_argv():
    text = GOOD_MACHINE + "trainers:\n  - {name: t, machine: box, command: 'rm -rf /', output_dir: /tmp/x}\n"
    (problem,) = problems(text)
    assert "trainers[0].command" in problem and "argv list" in problem


def test_durations():
    assert parse_duration("4h") == 14400
    assert parse_duration("90s") == 90
    assert parse_duration(30) == 30
    with pytest.raises(ValueError):
        parse_duration("soon")
