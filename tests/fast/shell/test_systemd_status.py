"""systemd's STATUS= line counts from the typed sections."""

from __future__ import annotations

from types import SimpleNamespace


def test_systemd_status_line_counts_from_the_typed_sections():
    from agents.shell.systemd import status_line
    from agents.wire.sections.jobs import JobInfo
    from agents.wire.sections.models import ModelInfo, ModelsSection

    def job(state: str) -> JobInfo:
        return JobInfo.model_validate(
            {
                "id": f"box-{state}",
                "recipe": "r",
                "machine": "box",
                "gpus": [0],
                "state": state,
                "started_at": 0.0,
                "output_dir": "/runs",
                "log_path": "/runs/log",
            }
        )

    def model(state: str) -> ModelInfo:
        return ModelInfo.model_validate(
            {"name": f"m-{state}", "machine": "box", "engine": "sim", "gpus": [0], "state": state, "since": 0.0}
        )

    agent = SimpleNamespace(
        peers=[SimpleNamespace(closed=False)],
        latest=None,
        interval_s=1.0,
        simulated=False,
        current={
            "jobs": [job("running"), job("exited"), job("stopping")],
            "models": ModelsSection(models=[model("warm"), model("sleeping")]),
        },
    )
    assert status_line([agent]).startswith("1 console, 2 jobs, 1 model warm, 0 GPUs, sampling 1 Hz")
