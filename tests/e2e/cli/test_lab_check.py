"""`cetlab lab check` (offline, file:line:col per problem, exit 2 as for an invalid lab.yaml) and `cetlab lab schema` (lab.yaml's JSON Schema)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


BAD = """\
lab: day-one
machines:
  - name: box
    gpuz: 1
    gpus: {sim: [{name: Tesla P4, memory_gib: -8, tdp_w: 75}]}
models:
  - {name: tiny, path: models/tiny, engine: sim, machine: nowhere}
"""


def cetlab(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "console.cli.main", *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_check_prints_each_problem_at_its_line_and_column_and_exits_1(tmp_path):
    bad = tmp_path / "lab.yaml"
    bad.write_text(BAD)
    result = cetlab("lab", "check", str(bad))
    assert result.returncode == 2, result
    lines = result.stdout.splitlines()
    assert f"{bad}:4:5: machines[0].gpuz: unknown key (check the spelling; see docs/reference/lab-yaml.md)" in lines
    assert any(
        line.startswith(f"{bad}:5:35: machines[0].gpus.sim[0].memory_gib: Input should be greater than 0") for line in lines
    )
    # the cross-checks (a model on a machine lab.yaml lacks) come once the schema passes
    bad.write_text(BAD.replace("    gpuz: 1\n", "").replace("-8", "8"))
    result = cetlab("lab", "check", str(bad))
    assert result.returncode == 2
    assert result.stdout.startswith(f"{bad}:6:50: models[0].machine: no machine named 'nowhere'"), result.stdout


def test_check_of_broken_yaml_and_of_a_good_lab(tmp_path):
    broken = tmp_path / "lab.yaml"
    broken.write_text("lab: x\n machines: [\n")
    result = cetlab("lab", "check", str(broken))
    assert result.returncode == 2 and result.stdout.startswith(f"{broken}:2:10: not valid YAML: "), result.stdout
    good = cetlab("--lab", str(ROOT / "lab.yaml"), "lab", "check")  # no machine is dialled: none runs here
    assert good.returncode == 0 and "valid" in good.stdout, good


def test_schema_is_the_lab_yaml_models_and_the_bundled_lab_yaml_names_it(tmp_path):
    out = tmp_path / "lab.schema.json"
    assert cetlab("lab", "schema", "-o", str(out)).returncode == 0
    schema = json.loads(out.read_text())
    assert {"lab", "machines", "models", "gateway"} <= set(schema["properties"]) and "source" not in schema["properties"]
    assert schema["required"] == ["lab", "machines"]
    first = (ROOT / "lab.yaml").read_text().splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema=")
    named = ROOT / first.split("$schema=", 1)[1]
    assert json.loads(named.read_text()) == schema  # the file the modeline names is today's schema
