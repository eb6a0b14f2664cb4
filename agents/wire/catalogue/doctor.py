"""The method catalogue: every RPC method with its params model, its result model, its role and its doc: doctor."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agents.wire.catalogue.method import OP, Method, Params
from agents.wire.sections.base import Section

DOCTOR_TIMEOUT_S = 60.0  # the torch probe alone may take 20 s per Python on a loaded machine
DOCTOR_MAX_TIMEOUT_S = 300.0
Level = Literal["OK", "WARN", "FAIL"]


class DoctorParams(Params):
    timeout_s: float = Field(
        default=DOCTOR_TIMEOUT_S, gt=0, le=DOCTOR_MAX_TIMEOUT_S
    )  # the checks not done by then are said to be so


class DoctorCheck(Section):
    """One line of the doctor: what was checked, how it stands, and the one command that fixes it (where there is one)."""

    name: str = Field(max_length=200)
    level: Level
    message: str = Field(max_length=4000)
    fix: str | None = Field(default=None, max_length=2000)


class DoctorReport(Section):
    """`doctor.run`: this machine's checks against its lab.yaml entry; ``complete`` is False when some ran out of time."""

    machine: str
    agent_version: str
    checks: list[DoctorCheck] = Field(default_factory=list, max_length=1000)
    complete: bool = True


DOCTOR_RUN = Method(
    "doctor.run",
    DoctorParams,
    DoctorReport,
    OP,
    "Run this machine's doctor (GPUs, stacks per GPU, engines and model files, trainer Pythons, ports, keys and modes, "
    "peer links, disk, clock) off the agent's loop, within timeout_s.",
)
