"""The method catalogue: every RPC method with its params model, its result model, its role and its doc: notify."""

from __future__ import annotations

from agents.wire.catalogue.method import OP, Method, NoParams, Params
from agents.wire.schema import Name
from agents.wire.sections.notify import NotifyStatus, TestResult


class NotifyTestParams(Params):
    route: Name


NOTIFY_STATUS = Method(
    "notify.status",
    NoParams,
    NotifyStatus,
    doc="Each notification route of this machine: queued, delivered, failures, the last answers.",
)


NOTIFY_TEST = Method(
    "notify.test", NotifyTestParams, TestResult, OP, "Send a test notification on a route now; answers what the endpoint said."
)
