"""Every machine's typed answer to one method (console/replies.py): a reply that does not validate costs only its machine."""

from __future__ import annotations

from typing import Any

from agents.catalogue import JOBS_LIST, JobListParams, ReplyInvalid
from agents.protocol import ErrorCode, RemoteError
from console.replies import request_all, sent
from tests.console_fixtures import frozen_jobs


class Lab:
    """call_all as FleetClient answers it: a result, or the exception, per machine."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, Any]] = []

    async def call_all(self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> dict[str, Any]:
        self.asked.append((method, params))
        return self.answers


async def test_each_machine_is_typed_or_says_why_not():
    job = frozen_jobs()[0]
    broken = {**job, "state": "dancing"}  # a JobState no agent sends
    lab = Lab({"m5": [job], "irina": [broken], "pharaoh": RemoteError(ErrorCode.DISCONNECTED, "pharaoh is offline")})
    answers = await request_all(lab, JOBS_LIST, JobListParams(limit=5))
    assert lab.asked == [("jobs.list", {"limit": 5})]
    assert list(answers.replies) == ["m5"] and answers.replies["m5"].root[0].id == job["id"]
    assert isinstance(answers.errors["irina"], ReplyInvalid) and "jobs.list" in answers.messages()["irina"]
    assert answers.messages()["pharaoh"] == "pharaoh is offline"


async def test_a_typed_reply_prints_as_the_json_the_agent_sent():
    job = frozen_jobs()[0]
    answers = await request_all(Lab({"m5": [job]}), JOBS_LIST)
    assert sent(answers.replies["m5"]) == [job]
