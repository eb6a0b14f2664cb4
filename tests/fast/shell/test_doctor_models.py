"""`cetlab-agent doctor` knows what this machine's lab.yaml entry needs: each model's engine binary, its weights
present and in a format the engine loads (a GGUF whose header reads), the ports it names; each failure with its fix."""

from __future__ import annotations

import yaml

P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}


def test_doctor_warns_of_every_engine_another_user_can_reach(tmp_path):
    """An engine on 127.0.0.1 (a model's port:, or `transformers serve`, which has no unix-socket option) is reachable by
    any user of the machine with no key: WARN; one on its agent's socket says nothing."""
    from agents.shell.doctor import WARN, check_models
    from agents.wire.lab.model import parse_lab

    lab = parse_lab(
        yaml.safe_dump(
            {
                "lab": "listen",
                "machines": [{"name": "box", "gpus": {"sim": [P4]}}],
                "models": [
                    {"name": "pinned", "path": str(tmp_path), "engine": "sim", "machine": "box", "port": 8123},
                    {"name": "hf", "path": str(tmp_path), "engine": "transformers", "machine": "box"},
                    {"name": "quiet", "path": str(tmp_path), "engine": "sim", "machine": "box"},
                ],
            }
        )
    )
    checks = {c.name: c for c in check_models(lab, "box")}
    assert checks["model pinned listen"].level == WARN and "127.0.0.1:8123" in checks["model pinned listen"].message
    assert checks["model hf listen"].level == WARN and "no unix-socket option" in checks["model hf listen"].message
    assert "model quiet listen" not in checks


def test_a_simulated_model_without_its_folder_or_a_placeholder_fails_with_the_fix(tmp_path):
    """The sim engines refuse to start where the model's path is missing (as real engines do); the doctor said
    "simulated, no weights needed" and a new user's first request then failed. It names the fix now."""
    from agents.orchestra.engines import engine_class
    from agents.wire.lab.model import Model

    def check(**sim: object) -> tuple[bool, str]:
        model = Model.model_validate({"name": "m", "path": "x", "engine": "sim", "machine": "box", "vram_gib": 1, "sim": sim})
        (found,) = engine_class("sim").doctor_checks(model, tmp_path / "x", {})
        return found.ok, found.message

    ok, said = check()
    assert not ok and f"mkdir -p {tmp_path / 'x'}" in said
    assert check(placeholder_mib=1)[0]  # the agent writes placeholder weights there
    (tmp_path / "x").mkdir()
    assert check()[0]
