"""A damaged job record in state.db (issue 21, N11): skipped, named and shown as damaged; every other job still listed."""

from __future__ import annotations

import sqlite3

import pytest

from agents.protocol import ErrorCode, RemoteError
from tests.hardening_fixtures import connected

pytestmark = pytest.mark.timeout(120)


async def test_a_damaged_job_record_is_listed_as_damaged_and_the_rest_still_list(small_demo):
    client = await connected(small_demo.lab_path)
    try:
        db = sqlite3.connect(small_demo.dir / "agents" / "box" / "state.db", timeout=10)
        with db:
            for job_id, record in (("bad-json", "{not json"), ("bad-types", '{"id": "bad-types", "state": "no-such-state"}'),
                                   ("bad-shape", "[1, 2]")):
                db.execute("INSERT INTO jobs (id, recipe, record, state) VALUES (?, ?, ?, ?)", (job_id, "r", record, "exited"))
        db.close()
        listed = await client.call("box", "jobs.list")  # before: `internal` on every call
        damaged = {j["id"]: j for j in listed if j.get("damaged")}
        assert set(damaged) == {"bad-json", "bad-types", "bad-shape"}, listed
        assert all("damaged record in state.db" in j["error"] for j in damaged.values())
        with pytest.raises(RemoteError) as info:
            await client.call("box", "jobs.get", {"id": "bad-json"})
        assert info.value.code == ErrorCode.UNAVAILABLE and "damaged" in info.value.message
    finally:
        await client.stop()
