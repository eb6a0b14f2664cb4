"""Several machines' typed answers split into replies and errors (console/lab/replies.py), and a reply printed as it was sent."""

from __future__ import annotations

from typing import Any

from agents.wire.catalogue.jobs import JOBS_LIST, JobListParams
from agents.wire.catalogue.method import ReplyInvalid, request_all
from agents.wire.protocol import ErrorCode, RemoteError
from console.lab.replies import Answers, sent
from tests.support.console import frozen_jobs


class Lab:
    """call as FleetClient answers it: a raw result, or the RemoteError of a machine not reached."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, str, Any]] = []

    async def call(self, machine: str, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        self.asked.append((machine, method, params))
        answer = self.answers[machine]
        if isinstance(answer, RemoteError):
            raise answer
        return answer


async def test_each_machine_is_typed_or_says_why_not():
    job = frozen_jobs()[0]
    broken = {**job, "state": "dancing"}  # a JobState no agent sends
    lab = Lab({"m5": [job], "irina": [broken], "pharaoh": RemoteError(ErrorCode.DISCONNECTED, "pharaoh is offline")})
    answers = Answers.of(await request_all(lab, lab.answers, JOBS_LIST, JobListParams(limit=5)))
    assert sorted(lab.asked) == [(m, "jobs.list", {"limit": 5}) for m in ("irina", "m5", "pharaoh")]
    assert list(answers.replies) == ["m5"] and answers.replies["m5"].root[0].id == job["id"]
    assert isinstance(answers.errors["irina"], ReplyInvalid) and "jobs.list" in answers.messages()["irina"]
    assert answers.messages()["pharaoh"] == "pharaoh is offline"


async def test_a_typed_reply_prints_as_the_json_the_agent_sent():
    job = frozen_jobs()[0]
    answers = Answers.of(await request_all(Lab({"m5": [job]}), ["m5"], JOBS_LIST))
    assert sent(answers.replies["m5"]) == [job]
