"""Damaged records and bad lab files (issue 21, N11 and N17): a damaged job record in state.db is listed as damaged
while the other jobs still list; a provider URL with credentials or CR/LF, an oversized orchestra group and a key given
twice thousands of times are each refused at load, briefly."""

from __future__ import annotations

import sqlite3

import pytest

from agents.wire.protocol import ErrorCode, RemoteError

pytestmark = pytest.mark.timeout(120)


async def test_a_damaged_job_record_is_listed_as_damaged_and_the_rest_still_list(in_process):
    lab = await in_process()
    client = lab.client()
    await client.start()
    await client.wait_connected(10)
    try:
        db = sqlite3.connect(lab.agents["box"].state_dir / "state.db", timeout=10)
        with db:
            for job_id, record in (
                ("bad-json", "{not json"),
                ("bad-types", '{"id": "bad-types", "state": "no-such-state"}'),
                ("bad-shape", "[1, 2]"),
            ):
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


@pytest.mark.parametrize(
    "base_url, expected",
    [
        ("https://user:secret@api.example.com/v1", "credentials"),
        ("https://api.example.com/v1\r\nX-Injected: 1", "control characters"),
        ("https://api.example.com/v 1", "control characters"),
    ],
)
def test_a_provider_base_url_with_credentials_or_crlf_is_refused_at_load(lab_file, base_url, expected):
    """N17: a provider's URL neither carries a secret into logs nor splits a header."""
    from agents.wire.lab.model import LabError, load_lab

    lab = {
        "lab": "x",
        "machines": [{"name": "box", "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}]}}],
        "providers": [{"name": "p", "base_url": base_url, "models": [{"name": "m"}]}],
    }
    with pytest.raises(LabError) as info:
        load_lab(lab_file(lab))
    assert "base_url" in str(info.value) and expected in str(info.value)


def test_an_orchestra_group_past_the_fan_out_cap_is_refused_at_load(lab_file):
    from agents.wire.lab.model import LabError, load_lab

    lab = {
        "lab": "x",
        "machines": [{"name": "box", "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}]}}],
        "providers": [{"name": "p", "base_url": "http://127.0.0.1:1/v1", "models": [{"name": f"m{i}"} for i in range(40)]}],
        "gateway": {"machine": "box"},
        "orchestra": {"groups": {"all": [f"m{i}" for i in range(40)]}},
    }
    with pytest.raises(LabError) as info:
        load_lab(lab_file(lab))
    assert "40 members" in str(info.value)


def test_a_repeated_asyncio_warning_is_one_line_per_ten_seconds():
    """N17: asyncio logs "socket.send() raised exception." once per write to a peer that left: unthrottled, thousands."""
    import logging

    from agents.runtime.limits import RepeatFilter

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("asyncio-test-repeat")
    logger.propagate = False
    logger.addHandler(Keep())
    logger.addFilter(RepeatFilter())
    for _ in range(5000):
        logger.warning("socket.send() raised exception.")
    logger.warning("another message")
    assert [r.getMessage() for r in records] == ["socket.send() raised exception.", "another message"]


def test_a_log_tail_of_long_lines_returns_as_many_lines_as_asked(tmp_path):
    """N17: `jobs.logs` read 512 bytes a line asked for and silently returned fewer lines when they were longer."""
    from agents.jobs.logs import tail

    log = tmp_path / "job.log"
    log.write_text("".join(f"{i:04d} " + "x" * 2000 + "\n" for i in range(100)))
    lines, size, _ = tail(log, 50)
    assert len(lines) == 50 and lines[0].startswith("0050 ") and lines[-1].startswith("0099 ")  # before: 12 lines
    assert size == log.stat().st_size
