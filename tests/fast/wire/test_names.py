"""Names are checked by type (issue 30, item 4): every string a method's params carry is either one of the name types of
agents/wire/schema.py (NAME_RULES) or free text this file lists with its reason and a bound; every field that names a
thing (a model, a machine, a member, a route, a recipe, a key, a job, a run ...) is a name type. A new method that
forgets the type fails here, and each name field refuses the same hostile names wherever it sits."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from annotated_types import MaxLen
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from agents.gateway.openai_api import OrchestraBody, RoutedBody
from agents.wire.catalogue.index import CATALOGUE
from agents.wire.catalogue.method import params_error
from agents.wire.lab.model import Orchestra
from agents.wire.schema import NAME_RULES

# (model, field): free text, bounded, never a name: why it is free
FREE_TEXT: dict[tuple[str, str], str] = {
    ("AdapterParams", "path"): "a path on the agent's machine (resolved against lab.yaml, then checked as a file)",
    ("AuditListParams", "who"): "a filter matched against the audit's rows, never kept",
    ("AuditListParams", "key"): "a filter (a key's fingerprint) matched against the audit's rows, never kept",
    ("AuditListParams", "method"): "a filter matched against the audit's rows, never kept",
    ("NodeStopParams", "reason"): "the coordinator's words for why a job failed, shown as text",
    ("LabApplyParams", "text"): "lab.yaml's text, parsed by its own schema",
    ("LabApplyParams", "known_hosts"): "a known_hosts file's text, parsed line by line",
    ("PeerKeys", "peer"): "an OpenSSH public key line, parsed as one",
    ("PeerKeys", "node"): "an OpenSSH public key line, parsed as one",
    ("PeerKeys", "scheduler"): "an OpenSSH public key line, parsed as one",
    ("StartParams", "queued_as"): "the lab queue's label of its entry (machine:number), held to that pattern",
    ("StartParams", "user"): "who submitted the job to the lab queue (their key's comment), kept and shown as text",
}


# fields whose name says they name a thing: these must be a name type
NAMING = {"model", "models", "machine", "member", "members", "route", "recipe", "name", "id", "run", "provider", "in_"}


NAMING |= {"out", "group", "topics", "peer_keys", "key_name", "params"}  # params: its keys are a trainer's param names


# what a client, a peer or a script might send as a name
HOSTILE = {
    "escape": "a\x1b]52;c;cHduZWQ=\x07",  # OSC 52: a clipboard write
    "control": "a\x00b",
    "newline": "model\n",
    "10 kB": "a" * 10_240,
    "path": "../../etc/passwd",
    "climb": "a/../../b",
    "markup": "[bold red]x",
    "link": "a[link=https://evil]x",
    "bidi": "a\u202eb",
    "homoglyph": "gpt\u20114",  # a non-breaking hyphen
    "cyrillic": "\u0430dmin",
    "fullwidth": "\uff41",
    "empty": "",
    "space": "a b",
}


def leaves(model: type[BaseModel], seen: set[type] | None = None) -> Iterator[tuple[type[BaseModel], str, str, Any]]:
    """(model, field, where, the string type) for every string a model carries: its fields, list items and dict keys,
    through nested models."""
    seen = seen if seen is not None else set()
    if model in seen:
        return
    seen.add(model)
    model.model_rebuild()
    for name, info in model.model_fields.items():
        yield from _walk(model, name, info.annotation, info.metadata, "", seen)


def _walk(model: type[BaseModel], name: str, ann: Any, metadata: list[Any], where: str, seen: set[type]) -> Iterator[Any]:
    origin = typing.get_origin(ann)
    if origin is typing.Annotated:
        inner, *extra = typing.get_args(ann)
        found: list[Any] = []
        for item in extra:
            found += item.metadata if isinstance(item, FieldInfo) else [item]
        yield from _walk(model, name, inner, [*metadata, *found], where, seen)
    elif origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(ann):
            yield from _walk(model, name, arg, metadata, where, seen)
    elif origin is list:
        yield from _walk(model, name, typing.get_args(ann)[0], [], where + "[]", seen)
    elif origin is dict:
        key, value = typing.get_args(ann)
        yield from _walk(model, name, key, [], where + "{key}", seen)
        yield from _walk(model, name, value, [], where + "{value}", seen)
    elif ann is str:
        yield model, name, where, metadata
    elif isinstance(ann, type) and issubclass(ann, BaseModel):
        yield from leaves(ann, seen)


def name_rule(metadata: list[Any]) -> str | None:
    return next((NAME_RULES[p] for m in metadata if (p := getattr(m, "pattern", None)) in NAME_RULES), None)


WIRE_MODELS: list[type[BaseModel]] = [m.params for m in CATALOGUE.values()] + [RoutedBody, OrchestraBody, Orchestra]


STRINGS = sorted(
    {
        (model.__name__, field, where): (model, metadata)
        for wire in WIRE_MODELS
        for model, field, where, metadata in leaves(wire)
    }.items()
)


def test_the_walk_finds_the_name_fields_it_must():
    """The walk reaches params, list items, dict keys and nested models (a walk that found nothing would prove nothing)."""
    found = {key for key, _ in STRINGS}
    for expected in [
        ("ModelParams", "model", ""),
        ("SwapParams", "in_", ""),
        ("StartParams", "recipe", ""),
        ("StartParams", "params", "{key}"),
        ("KeyAddParams", "name", ""),
        ("NotifyTestParams", "route", ""),
        ("OrchestraBody", "models", "[]"),
        ("Orchestra", "groups", "{value}[]"),
        ("SubscribeParams", "topics", "[]"),
        ("PeerKeys", "peer", ""),
    ]:
        assert expected in found, expected


@pytest.mark.parametrize("key", [key for key, _ in STRINGS], ids=lambda k: ".".join(filter(None, k)))
def test_every_string_on_the_wire_is_a_name_type_or_bounded_free_text(key):
    model_name, field, where = key
    _model, metadata = dict(STRINGS)[key]
    rule = name_rule(metadata)
    if rule is not None:
        return
    assert field not in NAMING or (model_name, field) in FREE_TEXT, (
        f"{model_name}.{field}{where} names a thing: type it with a name type of agents/wire/schema.py"
    )
    assert (model_name, field) in FREE_TEXT, (
        f"{model_name}.{field}{where} is a string that is no name type: type it with one, or list it in FREE_TEXT with why"
    )
    assert any(isinstance(m, MaxLen) for m in metadata), f"{model_name}.{field}{where}: free text needs a max_length"


def _placed(where: str, value: str) -> Any:
    """`value` at the place `where` says (a list item, a dict key, a dict value's item)."""
    if where == "":
        return value
    if where == "[]":
        return [value]
    if where == "{key}":
        return {value: 1}
    if where == "{value}[]":
        return {"g": [value]}
    raise AssertionError(f"no placing for {where}")


NAME_FIELDS = [
    (key, model)
    for key, (model, metadata) in STRINGS
    if name_rule(metadata) is not None and key[2] in ("", "[]", "{key}", "{value}[]")
]


@pytest.mark.parametrize("key,model", NAME_FIELDS, ids=lambda k: ".".join(filter(None, k)) if isinstance(k, tuple) else "")
@pytest.mark.parametrize("kind", list(HOSTILE))
def test_each_name_field_refuses_hostile_names(key, model, kind):
    """The same hostile names at every name field: each is refused by the field's own type, and the words the caller
    gets back are short and carry no control character."""
    _model_name, field, where = key
    alias = model.model_fields[field].alias or field
    with pytest.raises(ValidationError) as caught:
        model.model_validate({alias: _placed(where, HOSTILE[kind])})
    mine = [e for e in caught.value.errors() if e["loc"] and e["loc"][0] in (alias, field)]
    assert mine, caught.value.errors()
    said = params_error(caught.value)
    assert len(said) < 2_000 and "\x1b" not in said and "\x00" not in said and "\u202e" not in said


def test_a_plain_name_passes_each_name_field():
    """The types refuse the hostile, not everything: an ordinary name of each kind is taken."""
    from pydantic import TypeAdapter

    from agents.wire.schema import AlertId, JobId, ModelName, Name, ParamName, RunName, Topic

    for kind, value in [
        (Name, "gpu-box.2"),
        (ModelName, "openai/gpt-4o-mini"),
        (ModelName, "qwen2.5:7b"),
        (JobId, "a-very-long-machine-name-of-sixty-four-characters-aaaaaaaaaaaaaa-12"),
        (RunName, "my-run~2"),
        (AlertId, "box#12"),
        (AlertId, "box#offline"),
        (Topic, "log:box-3"),
        (ParamName, "learning_rate"),
    ]:
        assert TypeAdapter(kind).validate_python(value) == value


@pytest.mark.parametrize("kind", ["escape", "10 kB", "climb", "markup", "cyrillic"])
def test_lab_yaml_names_a_model_by_the_same_type(kind):
    """lab.yaml's served_name (what the engine serves a model as, what clients ask for) and a fan-out group's members are
    model names like the wire's: a hostile one is refused where lab.yaml loads, naming where."""
    import yaml

    from agents.wire.lab.model import LabError, parse_lab

    base = {
        "lab": "t",
        "machines": [{"name": "box"}],
        "models": [{"name": "m", "engine": "sim", "machine": "box", "path": "/m"}],
    }
    served = {**base, "models": [{**base["models"][0], "served_name": HOSTILE[kind]}]}
    grouped = {**base, "orchestra": {"groups": {"g": ["m", HOSTILE[kind]]}}}
    for doc, where in ((served, "served_name"), (grouped, "groups")):
        with pytest.raises(LabError) as caught:
            parse_lab(yaml.safe_dump(doc))
        assert where in str(caught.value), str(caught.value)[:300]
    parse_lab(yaml.safe_dump({**base, "models": [{**base["models"][0], "served_name": "org/m-1.5b"}]}))
