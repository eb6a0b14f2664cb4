"""What a simulated engine writes when a request constrains its answer (SIMULATED): a tool call or JSON of a schema.

A real engine turns `response_format` (json_object, json_schema) and `tool_choice` "required" or a named function
into a grammar, so even a model with random weights writes valid JSON of the schema (tests/e2e/orchestra/test_llamacpp_tools.py
shows it on the real llama-server). The simulators write an instance of the schema, token-sized piece by piece,
so a client's parser meets what it would meet on the real engine.
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

WORDS = ("lab", "model", "token", "warm", "engine", "cache", "swap", "queue")  # a string value's words
MAX_DEPTH = 4  # a recursive schema stops here


@dataclass(frozen=True)
class Structured:
    """The constrained answer asked for: JSON content of ``schema``, or (``tool`` set) a call of that function."""

    schema: dict[str, Any]
    tool: str | None = None


def instance(schema: object, rng: random.Random, depth: int = 0) -> Any:
    """A value that validates against the JSON schema (the subset grammars are made of: types, properties, required,
    items, enum, const, anyOf/oneOf); an unknown or empty schema gives an object."""
    if not isinstance(schema, dict):
        return {}
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return instance(schema[key][0], rng, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema or depth == 0 else "string"
    if kind == "object":
        found, listed = schema.get("properties"), schema.get("required")
        properties: dict[str, Any] = found if isinstance(found, dict) else {}
        required: list[Any] = listed if isinstance(listed, list) else []
        if depth >= MAX_DEPTH:
            return {}
        return {name: instance(sub, rng, depth + 1) for name, sub in properties.items() if name in required or rng.random() < 0.5}
    if kind == "array":
        least = schema.get("minItems")
        low = least if isinstance(least, int) else 0
        count = low if depth >= MAX_DEPTH else max(low, rng.randint(0, 2))
        return [instance(schema.get("items"), rng, depth + 1) for _ in range(count)]
    if kind == "integer":
        return rng.randint(int(schema.get("minimum", 0)), int(schema.get("maximum", 1000)))
    if kind == "number":
        return round(rng.uniform(float(schema.get("minimum", 0)), float(schema.get("maximum", 1000))), 3)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))


def pieces(value: object, rng: random.Random) -> list[str]:
    """The JSON text of ``value`` cut into token-sized pieces (one to four characters, as a BPE vocabulary cuts JSON)."""
    text = json.dumps(value, ensure_ascii=False)
    out, at = [], 0
    while at < len(text):
        size = rng.randint(1, 4)
        out.append(text[at : at + size])
        at += size
    return out


def call_id(rng: random.Random) -> str:
    """A tool call's id as llama-server makes one: 32 random letters and digits."""
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(32))


# vLLM's request models for these fields (its protocol's pydantic types: a malformed one is a 400 naming the field)
class VllmFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    parameters: dict[str, Any] | None = None


class VllmTool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: VllmFunction


class VllmNamed(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: VllmFunction


class VllmJsonSchema(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")


class VllmResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: VllmJsonSchema | None = None


ANY_OBJECT = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def constraint(tools: list[VllmTool] | None, choice: str | VllmNamed | None, fmt: VllmResponseFormat | None) -> Structured | None:
    """What a vLLM request constrains its answer to: a call of the named (or, "required", the first) tool, JSON of
    the response_format's schema, or any JSON object."""
    if tools and (choice == "required" or isinstance(choice, VllmNamed)):
        named = choice.function.name if isinstance(choice, VllmNamed) else None
        function = next((t.function for t in tools if t.function.name == named), tools[0].function)
        return Structured(function.parameters or {"type": "object"}, function.name)
    if fmt is not None and fmt.type == "json_schema":
        schema = fmt.json_schema.json_schema if fmt.json_schema is not None else None
        return Structured(schema or {"type": "object"})
    if fmt is not None and fmt.type == "json_object":
        return Structured(ANY_OBJECT)
    return None
