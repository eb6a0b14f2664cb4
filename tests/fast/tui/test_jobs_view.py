"""The Jobs and log views against real agents: start a recipe from the form, watch it, search its log, stop it."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(120)


def test_cetlab_jobs_has_a_precision_column_and_the_job_its_notes():
    from agents.wire.sections.jobs import JobInfo
    from console.cli.jobs import job_human, jobs_human
    from tests.support.console import frozen_jobs

    raw = frozen_jobs()
    raw[0].update(precision="bf16", notes=["tf32 on"])
    jobs = [JobInfo.model_validate(j) for j in raw]
    header, first, second, *_ = jobs_human(jobs, {}).splitlines()
    assert header.split()[4] == "PREC" and first.split()[4] == "bf16" and second.split()[4] == "-"
    assert "  precision: bf16\n  note: tf32 on" in job_human(jobs[0])
