"""The method catalogue: every RPC method with its params model, its result model, its role and its doc: index."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from agents.wire.catalogue.agent import (
    GPUS_SUPPORT,
    HELLO,
    HISTORY,
    METHODS,
    PING,
    SET_INTERVAL,
    SIM_OVERRIDE,
    STATUS,
    SUBSCRIBE,
    UNSUBSCRIBE,
)
from agents.wire.catalogue.alerts import ALERTS_ACK, ALERTS_LIST
from agents.wire.catalogue.audit import AUDIT_LIST
from agents.wire.catalogue.checkpoints import (
    CHECKPOINTS_DELETE,
    CHECKPOINTS_KEEP,
    CHECKPOINTS_LIST,
    CHECKPOINTS_PRUNE,
    CHECKPOINTS_RESUME,
    CHECKPOINTS_RUNS,
    CHECKPOINTS_SERVE,
)
from agents.wire.catalogue.costs import COSTS_GET
from agents.wire.catalogue.doctor import DOCTOR_RUN
from agents.wire.catalogue.gateway import (
    GATEWAY_KEYS_ADD,
    GATEWAY_KEYS_LIST,
    GATEWAY_KEYS_REVOKE,
    GATEWAY_STATUS,
)
from agents.wire.catalogue.jobs import (
    JOBS_GET,
    JOBS_KILL,
    JOBS_LIST,
    JOBS_LOGS,
    JOBS_NODE_START,
    JOBS_NODE_STATUS,
    JOBS_NODE_STOP,
    JOBS_RECIPES,
    JOBS_START,
    JOBS_STOP,
)
from agents.wire.catalogue.lab import LAB_APPLY, LAB_ROLLBACK
from agents.wire.catalogue.method import Method, validate_reply
from agents.wire.catalogue.models import (
    MODELS_ADAPTER,
    MODELS_CACHE,
    MODELS_COLD,
    MODELS_GET,
    MODELS_LIST,
    MODELS_PIN,
    MODELS_ROTATE,
    MODELS_ROTATION,
    MODELS_SLEEP,
    MODELS_SWAP,
    MODELS_WARM,
)
from agents.wire.catalogue.notify import NOTIFY_STATUS, NOTIFY_TEST
from agents.wire.catalogue.queue import QUEUE_CANCEL, QUEUE_HOLD, QUEUE_LIST, QUEUE_RELEASE, QUEUE_SUBMIT
from agents.wire.catalogue.spread import MODELS_RPC_START, MODELS_RPC_STATUS, MODELS_RPC_STOP

CATALOGUE: dict[str, Method[Any, Any]] = {
    m.name: m
    for m in (
        HELLO,
        PING,
        STATUS,
        HISTORY,
        SUBSCRIBE,
        UNSUBSCRIBE,
        SET_INTERVAL,
        METHODS,
        SIM_OVERRIDE,
        JOBS_RECIPES,
        JOBS_LIST,
        JOBS_GET,
        JOBS_START,
        JOBS_STOP,
        JOBS_KILL,
        JOBS_LOGS,
        JOBS_NODE_START,
        JOBS_NODE_STOP,
        JOBS_NODE_STATUS,
        MODELS_LIST,
        MODELS_GET,
        MODELS_WARM,
        MODELS_SLEEP,
        MODELS_COLD,
        MODELS_SWAP,
        MODELS_CACHE,
        MODELS_PIN,
        MODELS_ROTATION,
        MODELS_ROTATE,
        MODELS_ADAPTER,
        MODELS_RPC_START,
        MODELS_RPC_STOP,
        MODELS_RPC_STATUS,
        CHECKPOINTS_RUNS,
        CHECKPOINTS_LIST,
        CHECKPOINTS_RESUME,
        CHECKPOINTS_SERVE,
        CHECKPOINTS_DELETE,
        CHECKPOINTS_KEEP,
        CHECKPOINTS_PRUNE,
        COSTS_GET,
        GATEWAY_STATUS,
        GATEWAY_KEYS_ADD,
        GATEWAY_KEYS_LIST,
        GATEWAY_KEYS_REVOKE,
        NOTIFY_STATUS,
        NOTIFY_TEST,
        AUDIT_LIST,
        ALERTS_LIST,
        ALERTS_ACK,
        GPUS_SUPPORT,
        LAB_APPLY,
        LAB_ROLLBACK,
        DOCTOR_RUN,
        QUEUE_SUBMIT,
        QUEUE_LIST,
        QUEUE_CANCEL,
        QUEUE_HOLD,
        QUEUE_RELEASE,
    )
}


def parse_result(method_name: str, raw: Any) -> BaseModel:
    """A reply of the named method, typed; ReplyInvalid when it does not validate, KeyError for an unknown method."""
    reply: BaseModel = validate_reply(CATALOGUE[method_name], raw)  # the catalogue holds every kind of method: Any
    return reply
