"""Files that are not files (issue 21, N2 and N4): a FIFO or a symlink to /dev/zero where a trainer, an engine or a
watched folder should have a JSON document. The agent neither blocks, nor grows, nor stops listening.

Real agents over real SSH on loopback; the "trainer" is a real process that turns its progress file into a FIFO.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agents.wire.safe_read import NotARegularFile, TooLarge, read_capped, read_tail

pytestmark = [pytest.mark.timeout(180)]


def test_the_reader_refuses_links_pipes_devices_and_oversized_files(tmp_path):
    regular = tmp_path / "doc.json"
    regular.write_bytes(b"x" * 100)
    assert read_capped(regular, 100) == b"x" * 100
    with pytest.raises(TooLarge):
        read_capped(regular, 99)
    (tmp_path / "zero").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo")
    for path in (tmp_path / "zero", tmp_path / "fifo", Path("/dev/zero"), tmp_path):
        started = time.monotonic()
        with pytest.raises(NotARegularFile):
            read_capped(path, 1 << 20)
        with pytest.raises(NotARegularFile):
            read_tail(path, 1 << 20)
        assert time.monotonic() - started < 5  # a FIFO with no writer did not block the open


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "not-json"])
def test_an_unreadable_adapter_config_makes_its_checkpoint_incomplete_and_says_why(tmp_path, kind):
    """An adapter whose adapter_config.json is a FIFO, a symlink to /dev/zero or no JSON: listed INCOMPLETE with the
    reason (before: complete, and serving it said "the adapter's base model None is not a folder"). A symlink's own
    size counts, never its target's."""
    import json as json_

    from agents.checkpoints.parsing import read_checkpoint

    ckpt = tmp_path / "run" / "checkpoint-10"
    ckpt.mkdir(parents=True)
    (ckpt / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    (ckpt / "trainer_state.json").write_text(
        json_.dumps({"global_step": 10, "epoch": 1.0, "log_history": [{"step": 10, "loss": 1.0}]})
    )
    config = ckpt / "adapter_config.json"
    if kind == "fifo":
        os.mkfifo(config)
    elif kind == "dev-zero":
        config.symlink_to("/dev/zero")
    else:
        config.write_text("[1, 2")
    found = read_checkpoint("run", ckpt, settle_s=0.0, now=time.time() + 60)
    assert not found.complete and "adapter_config.json" in found.problem, found.problem
    assert {"fifo": "FIFO", "dev-zero": "symlink", "not-json": "JSON"}[kind] in found.problem
    assert found.save_s is None or found.save_s < 60  # /dev/zero's time (the boot) is not this save's
    config.unlink()
    config.write_text(json_.dumps({"base_model_name_or_path": "/models/base"}))
    found = read_checkpoint("run", ckpt, settle_s=0.0, now=time.time() + 60)
    assert found.complete and found.base_model == "/models/base", found.problem
