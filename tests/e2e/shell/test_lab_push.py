"""`cetlab lab push` on the agent's side, in process: a pushed lab.yaml validated (lab.yaml:LINE:COL), kept in the state
dir with the previous one, applied live (models, alerts, gateway policies), its version in hello, ticks and status;
rollback; the pushed copy winning over --lab at the next start; the keys a push may authorize."""

from __future__ import annotations

import pytest

from tests.support.lab_push import LAB, pool, started, text_of, with_changes
from tests.support.waits import wait_for


@pytest.mark.slow  # a sim engine's process
async def test_a_warm_engine_stays_warm_across_a_push(in_process):
    lab, client = await started(in_process)
    await client.call("box", "models.warm", {"model": "tiny"})
    models = pool(lab.agents["box"])
    slot = models.slots["tiny"]
    await wait_for(lambda: slot.state == "warm", timeout=60)
    engine = slot.engine
    changed = with_changes(models=[{**LAB["models"][0], "load_timeout_s": 600}], alerts={"temp_c": 70})
    reply = await client.call("box", "lab.apply", {"text": text_of(changed)})
    assert "models: ~tiny" in reply["live"]
    assert slot is models.slots["tiny"] and slot.engine is engine and slot.state == "warm"
    assert slot.model.load_timeout_s == 600  # taken for its next start
