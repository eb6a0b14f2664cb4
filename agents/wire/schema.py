"""The building blocks of lab.yaml's schema, shared by every part of it (the lab, the gateway, the trainers)."""

from __future__ import annotations

import re
from datetime import date
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
NAME_RULE = "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64"  # NAME_RE in words
Name = Annotated[str, Field(pattern=NAME_RE)]
# a model as a client or a peer asks for it: a lab name, an alias, `provider/model`, an engine's own `family:tag`.
# Every route body and every catalogue params model that carries one uses this type, so no door skips the check
# (an unchecked name is kept: metered, recorded, echoed)
MODEL_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,255}$"
MODEL_NAME_RULE = "letters, digits and ._:/@+-, starting with a letter or digit, at most 256"  # MODEL_NAME_RE in words
ModelName = Annotated[str, Field(pattern=MODEL_NAME_RE)]
# lab.yaml's `engine:` (and a model's engine on the wire): a name, checked against agents.orchestra.engines' registry
# when the agent loads lab.yaml; the wire carries it as a string so that an engine is added in one place
EngineName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,39}$")]


def _real_day(value: str) -> str:
    date.fromisoformat(value)  # a ValueError names what is wrong: 2026-02-30 matches the pattern, yet is no day
    return value


# a day on the wire (YYYY-MM-DD, the lab's local date): a real calendar day, so a view may parse it and show it as is
Day = Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}$"), AfterValidator(_real_day)]
NonNegative = Annotated[float, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]
# Power and money figures of lab.yaml, bounded: 1e300 W passes `ge=0` and turns every cost it enters into inf or nan.
# 100 kW is past any machine a small lab has; a billion is past any price in any currency (per hour, kWh, million tokens).
MAX_WATTS = 100_000.0
MAX_PRICE = 1_000_000_000.0
Watts = Annotated[float, Field(ge=0, le=MAX_WATTS)]
Price = Annotated[float, Field(ge=0, le=MAX_PRICE)]

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(value: Any) -> Any:
    """'90s', '30m', '4h', '1d' or a number of seconds -> seconds (float)."""
    if isinstance(value, str):
        match = _DURATION_RE.match(value)
        if not match:
            raise ValueError(f"expected a duration like 90s, 30m, 4h or 1d, got {value!r}")
        return float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    return value


Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]


class Strict(BaseModel):
    # allow_inf_nan=False: every number in lab.yaml is finite (YAML's .inf and .nan are refused at load, with file:line)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)
