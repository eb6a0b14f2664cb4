"""What files can do to an agent: forged key comments, lab.yaml bombs, a broken state.db, a taken socket, a hung component."""

from __future__ import annotations

import pytest

from agents.wire.lab.model import load_lab
from agents.wire.sections.jobs import JobDetail
from agents.wire.states import JobState
from console.cli.jobs import job_human


def test_anchors_and_merge_keys_still_load_with_lines_named(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text(
        "lab: x\ngpu: &p4 {name: Tesla P4, memory_gib: 8, tdp_w: 75}\nmachines:\n- name: a\n  gpus: {sim: [*p4, *p4]}\n"
        "- name: b\n  gpus: {sim: [{<<: *p4, memory_gib: 16}]}\n  idle_wats: 3\n"
    )
    with pytest.raises(Exception) as info:
        load_lab(path)
    assert f"{path}:8: machines[1].idle_wats: unknown key" in str(info.value)


# ---------------------------------------------------------------------------- argv (finding 12)


def test_a_jobs_argv_is_shown_on_one_line_with_control_and_bidi_characters_escaped():
    job = JobDetail(
        id="box-1",
        recipe="tiny",
        machine="box",
        gpus=[0],
        state=JobState.RUNNING,
        log_path="/x.log",
        started_at=0.0,
        output_dir="/runs/box-1",
        argv=["python", "train.py", "--lr", "0.1\nbox-2 (tiny) on box: exited 0", "name\u202eexe.txt", "a b"],
    )
    shown = job_human(job)
    assert len(shown.splitlines()) == 3, shown
    assert "$'0.1\\nbox-2 (tiny) on box: exited 0'" in shown and "$'name\\u202eexe.txt'" in shown and "'a b'" in shown
    assert "\u202e" not in shown
