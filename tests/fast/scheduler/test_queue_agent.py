"""The lab queue in its keeper's agent (in this event loop): what waits says why, in the order it would start;
hold, release and cancel; `--now` refuses instead of queueing; a restart of the agent keeps every entry; a recipe
by need is never started by hand without the GPUs the queue chose. (Starting jobs is the end-to-end tier's.)"""

from __future__ import annotations

import pytest

from agents.wire.protocol import ErrorCode, RemoteError, Role
from tests.support.waits import wait_for

P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}
LAB = {
    "lab": "queue-test",
    "machines": [{"name": "box", "gpus": {"sim": [P4]}}],
    "trainers": [
        # nothing here fits either: they wait, and say why
        {"name": "huge", "need": {"gpus": 1, "min_vram_gib": 80}, "machine": "box", "command": ["x"], "output_dir": "runs"},
        {"name": "two", "need": {"gpus": 2}, "machine": "box", "command": ["x"], "output_dir": "runs", "priority": 5},
    ],
}


async def _client(lab, role=Role.OPERATOR, who="alice@lab"):
    client = lab.client(role=role, who=who)
    await client.start()
    await client.wait_connected(10)
    return client


async def test_what_cannot_start_waits_in_order_and_says_why(in_process):
    lab = await in_process(LAB)
    alice = await _client(lab)
    try:
        first = await alice.call("box", "queue.submit", {"recipe": "huge"})
        assert first["state"] == "queued" and first["user"] == "alice@lab" and first["need"] == "1 GPU >= 80 GiB"
        assert (
            first["reason"] == "waiting for 1 GPU >= 80 GiB: box has 0 GPUs that fit (GPU 0 (Tesla P4) has 8 GiB, under 80 GiB)"
        )
        second = await alice.call("box", "queue.submit", {"recipe": "two"})  # priority 5: ahead of the first
        assert second["position"] == 1 and second["reason"] == "waiting for 2 GPUs: box has 1 GPU that fits (2 needed)"
        listing = await alice.call("box", "queue.list", {})
        assert [(e["id"], e["position"]) for e in listing] == [(second["id"], 1), (first["id"], 2)]
        view = alice.state.machines["box"]
        await wait_for(lambda: view.queue is not None and view.queue.waiting == 2, timeout=10)  # pushed in the tick

        held = await alice.call("box", "queue.hold", {"id": second["id"]})
        assert held["state"] == "held" and "cetlab release" in held["reason"]
        listing = await alice.call("box", "queue.list", {})
        assert next(e for e in listing if e["id"] == first["id"])["position"] == 1  # the held one no longer counts
        released = await alice.call("box", "queue.release", {"id": second["id"]})
        assert released["state"] == "queued"
        cancelled = await alice.call("box", "queue.cancel", {"id": first["id"]})
        assert cancelled["state"] == "cancelled" and cancelled["reason"] == "cancelled by alice@lab"
        with pytest.raises(RemoteError) as again:
            await alice.call("box", "queue.cancel", {"id": first["id"]})
        assert again.value.code == ErrorCode.CONFLICT and "is cancelled" in again.value.message
    finally:
        await alice.stop()


async def test_now_refuses_with_the_reason_and_queues_nothing(in_process):
    lab = await in_process(LAB)
    alice = await _client(lab)
    try:
        with pytest.raises(RemoteError) as refused:
            await alice.call("box", "queue.submit", {"recipe": "huge", "now": True})
        assert refused.value.code == ErrorCode.CONFLICT
        assert refused.value.message.startswith("huge cannot start now: waiting for 1 GPU >= 80 GiB")
        assert not [e for e in await alice.call("box", "queue.list", {}) if e["state"] == "queued"]
        with pytest.raises(RemoteError) as unknown:
            await alice.call("box", "queue.submit", {"recipe": "nope"})
        assert unknown.value.code == ErrorCode.NOT_FOUND and "recipes: huge, two" in unknown.value.message
    finally:
        await alice.stop()


async def test_a_viewer_reads_the_queue_and_cannot_change_it(in_process):
    lab = await in_process(LAB)
    alice, bob = await _client(lab), await _client(lab, Role.VIEWER, "bob@lab")
    try:
        entry = await alice.call("box", "queue.submit", {"recipe": "huge"})
        assert [e["id"] for e in await bob.call("box", "queue.list", {})] == [entry["id"]]
        for method in ("queue.submit", "queue.cancel", "queue.hold"):
            with pytest.raises(RemoteError) as refused:
                await bob.call("box", method, {"recipe": "huge"} if method == "queue.submit" else {"id": entry["id"]})
            assert refused.value.code == ErrorCode.FORBIDDEN
    finally:
        await alice.stop()
        await bob.stop()


async def test_a_restart_of_the_keeper_keeps_every_entry(in_process):
    lab = await in_process(LAB)
    alice = await _client(lab)
    try:
        kept = await alice.call("box", "queue.submit", {"recipe": "huge"})
        gone = await alice.call("box", "queue.submit", {"recipe": "two"})
        await alice.call("box", "queue.cancel", {"id": gone["id"]})
    finally:
        await alice.stop()
    await lab.stop_agent("box")
    await lab.start_agent("box")
    alice = await _client(lab)
    try:
        listing = {e["id"]: e for e in await alice.call("box", "queue.list", {})}
        assert listing[kept["id"]]["state"] == "queued" and listing[kept["id"]]["submitted_at"] == kept["submitted_at"]
        assert listing[gone["id"]]["state"] == "cancelled"
        newer = await alice.call("box", "queue.submit", {"recipe": "huge"})
        assert newer["id"] > gone["id"]  # numbers go on after a restart
    finally:
        await alice.stop()


async def test_a_recipe_by_need_is_not_started_by_hand_without_its_gpus(in_process):
    lab = await in_process(LAB)
    alice = await _client(lab)
    try:
        with pytest.raises(RemoteError) as refused:
            await alice.call("box", "jobs.start", {"recipe": "huge"})
        assert refused.value.code == ErrorCode.INVALID_PARAMS
        assert refused.value.message == "recipe huge asks for 1 GPU >= 80 GiB: `cetlab train huge` queues it and picks its GPUs"
        with pytest.raises(RemoteError) as misfit:
            await alice.call("box", "jobs.start", {"recipe": "huge", "gpus": [0]})  # checked here too, not only by the queue
        assert misfit.value.code == ErrorCode.CONFLICT and "GPU 0 (Tesla P4) has 8 GiB, under 80 GiB" in misfit.value.message
    finally:
        await alice.stop()
