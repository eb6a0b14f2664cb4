"""What tests/e2e/gateway/test_tools.py, tests/fast/gateway/test_tools.py share: WEATHER."""

from __future__ import annotations

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}, "days": {"type": "integer"}},
            "required": ["city", "unit"],
        },
    },
}
