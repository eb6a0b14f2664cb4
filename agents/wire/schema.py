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


def _no_dot_segments(value: str) -> str:
    # `provider/model` has a slash; `a/../b` is no model anywhere, and a name that is ever joined to a path must not climb
    if any(part in ("", ".", "..") for part in value.split("/")):
        raise ValueError(f"a model name has no empty, '.' or '..' part between its slashes ({MODEL_NAME_RULE})")
    return value


ModelName = Annotated[str, Field(pattern=MODEL_NAME_RE), AfterValidator(_no_dot_segments)]
# names the agent makes of a lab name (a job id is `<machine>-<n>`, an alert id `<machine>#<n>`, a run a job id or a
# folder's safe name with `~<rank>`): the same alphabet, a little longer; a params field that names one of these uses
# its type, so a name is checked where it enters whichever method carries it (tests/fast/wire/test_names.py walks them all)
JOB_ID_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
RUN_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._~-]{0,99}$"
ALERT_ID_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}[#-](?:[0-9]{1,18}|offline)$"
# a gateway key's allowed model: a name or alias, or an fnmatch pattern over them (`llama-*`, `provider/*`, `tiny?`)
KEY_MODEL_RE = r"^[A-Za-z0-9*?\[][A-Za-z0-9._:/@+*?\[\]!-]{0,255}$"
PARAM_NAME_RE = r"^[a-z][a-z0-9_]{0,40}$"  # a trainer's param (it becomes --name on its command line)
TOPIC_RE = r"^[a-z]{1,16}(?::[A-Za-z0-9][A-Za-z0-9._-]{0,99})?$"  # an event (`tick`, `notice`) or `log:<job id>`
JobId = Annotated[str, Field(pattern=JOB_ID_RE)]
RunName = Annotated[str, Field(pattern=RUN_NAME_RE)]
AlertId = Annotated[str, Field(pattern=ALERT_ID_RE)]
Topic = Annotated[str, Field(pattern=TOPIC_RE)]
ParamName = Annotated[str, Field(pattern=PARAM_NAME_RE)]
KeyModelPattern = Annotated[str, Field(pattern=KEY_MODEL_RE), AfterValidator(_no_dot_segments)]
CURRENCY_RE = r"^[A-Z]{3}$"  # ISO 4217
CurrencyCode = Annotated[str, Field(pattern=CURRENCY_RE)]
# each name pattern in words, for an error that names the rule, never the regular expression
NAME_RULES = {
    NAME_RE: NAME_RULE,
    MODEL_NAME_RE: MODEL_NAME_RULE,
    JOB_ID_RE: "a job id: <machine>-<n>",
    RUN_NAME_RE: "a run: a job id or a folder's name (letters, digits and ._~-, at most 100)",
    ALERT_ID_RE: "an alert id: <machine>#<n> (box#12)",
    KEY_MODEL_RE: "a model name or an fnmatch pattern over names (llama-*, provider/*)",
    CURRENCY_RE: "a currency: three capital letters (ISO 4217)",
    PARAM_NAME_RE: "a param's name: lower-case letters, digits and _, at most 41",
    TOPIC_RE: "a topic: tick, notice or log:<job id>",
}
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
