"""The workstation's files `cetlab machine` edits: lab.yaml (round-tripped, comments and order kept), the console's
known_hosts (the agent's pinned host key) and the record of how each machine was set up (for `machine remove`)."""

from __future__ import annotations

import copy
import io
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from agents.wire.lab.model import LabError, load_lab
from console.machine.remote import Layout
from console.machine.ssh import MachineError

NEW_LAB = """\
# The lab: written by `cetlab machine add`, yours to edit (it keeps comments and order). Every key is documented in
# the README ("lab.yaml reference").
lab: {name}
"""


def _yaml() -> YAML:
    yaml = YAML()  # round-trip: comments, order, quotes and flow style as written
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    return yaml


def read_doc(path: Path, lab_name: str) -> Any:
    text = path.read_text() if path.exists() else NEW_LAB.format(name=lab_name)
    return _yaml().load(text)


def _dump(doc: Any) -> str:
    out = io.StringIO()
    _yaml().dump(doc, out)
    return out.getvalue()


def load_problem(path: Path, doc: Any) -> str | None:
    """Why this lab.yaml would not load (None: it loads), checked as a file beside the real one so relative paths
    resolve the same. A lab whose last machine was removed is judged with a stand-in machine: empty is fine to keep
    (the next `machine add` fills it), a model or trainer still placed on the removed one is not."""
    probe = copy.deepcopy(doc)
    if not probe.get("machines"):
        probe["machines"] = [{"name": "stand-in", "gpus": "none"}]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.check")
    tmp.write_text(_dump(probe))
    try:
        load_lab(tmp)
    except LabError as exc:
        said = str(exc).replace(str(tmp), str(path))  # the lines are the edited text's, named as the file it becomes
        return said.replace("(machines: stand-in)", "(no machine is left)")
    finally:
        tmp.unlink(missing_ok=True)
    return None


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.new")
    tmp.write_text(text)
    os.replace(tmp, path)


def machine_entry(doc: Any, name: str) -> Any | None:
    for entry in doc.get("machines") or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    return None


def entry_conflict(path: Path, doc: Any, name: str, host: str, port: int) -> str | None:
    """Another entry of this name (another host or port): what to say, checked before anything changes."""
    found = machine_entry(doc, name)
    if found is None or (str(found.get("host", "127.0.0.1")) == host and int(found.get("port", 7022)) == port):
        return None
    return (
        f"{path}: machine {name!r} is already in lab.yaml at {found.get('host')}:{found.get('port', 7022)}, "
        f"not {host}:{port}\n  fix: `cetlab machine remove {name}` first, or add this one under another name"
    )


def add_machine(path: Path, lab_name: str, name: str, host: str, port: int, gpus: str, origin: str) -> bool:
    """Add the machine's entry (False: an entry with this host and port is there already). Another entry of that name
    is an error: the operator removes it first."""
    doc = read_doc(path, lab_name)
    conflict = entry_conflict(path, doc, name, host, port)
    if conflict is not None:
        raise MachineError(conflict)
    if machine_entry(doc, name) is not None:
        return False
    machines = doc.get("machines")
    if not isinstance(machines, CommentedSeq) or not machines:
        machines = CommentedSeq()
        doc["machines"] = machines
    entry = CommentedMap()
    entry["name"] = name
    entry["host"] = host
    entry["port"] = port
    entry["gpus"] = gpus
    entry.yaml_add_eol_comment(f"added by `cetlab machine add` ({origin})", "name")
    machines.append(entry)
    problem = load_problem(path, doc)
    if problem is not None:
        raise MachineError(f"with {name!r} added, {path} would not load; left unchanged:\n{problem}")
    _write(path, _dump(doc))
    return True


def _hand_on_trailing_comment(seq: Any, entry: Any) -> None:
    """ruamel keeps the comment lines after a block entry on its last key: given to the entry before it, so removing the
    last machine does not take the operator's comment about what follows (say, `models:`) with it."""
    if not isinstance(entry, CommentedMap) or not entry or seq.index(entry) == 0:
        return
    last = list(entry.keys())[-1]
    item = entry.ca.items.get(last)
    if not item or len(item) < 3 or item[2] is None or "\n" not in item[2].value:
        return
    following = item[2].value.split("\n", 1)[1]  # the first line is the removed line's own end-of-line comment
    before = seq[seq.index(entry) - 1]
    if not isinstance(before, CommentedMap) or not before or not following.strip():
        return
    key = list(before.keys())[-1]
    slot = before.ca.items.setdefault(key, [None, None, None, None])
    if slot[2] is None:
        token = copy.copy(item[2])
        token.value = "\n" + following
        slot[2] = token
    else:
        slot[2].value = slot[2].value.rstrip("\n") + "\n" + following


def remove_machine(path: Path, name: str, dry_run: bool) -> bool:
    """Take the machine's entry out (False: it was not there). Checked before anything else is undone: a model or
    trainer still placed on it would leave a lab.yaml that does not load, which is said instead."""
    if not path.exists():
        return False
    doc = _yaml().load(path.read_text())
    found = machine_entry(doc, name)
    if found is None:
        return False
    _hand_on_trailing_comment(doc["machines"], found)
    doc["machines"].remove(found)
    problem = load_problem(path, doc)
    if problem is not None:
        raise MachineError(
            f"removing {name!r} from {path} would leave a lab.yaml that does not load (move or remove what is placed "
            f"on it first):\n{problem}"
        )
    if not dry_run:
        _write(path, _dump(doc))
    return True


# ---------------------------------------------------------------------------- known_hosts


def host_pattern(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def pin_host_key(known_hosts: Path, host: str, port: int, public_key: str, dry_run: bool) -> str:
    """The agent's host key as the one line for [host]:port: "pinned", "already pinned" or "replaced" (an older key of
    a reinstalled machine; the new one was read over the operator's own authenticated ssh)."""
    parts = public_key.split()
    if len(parts) < 2 or not parts[0].startswith("ssh-"):
        raise MachineError(f"the agent printed no host key (got {public_key[:200]!r})")
    pattern = host_pattern(host, port)
    line = f"{pattern} {parts[0]} {parts[1]}"
    lines = known_hosts.read_text().splitlines() if known_hosts.exists() else []
    mine = [i for i, text in enumerate(lines) if text.split(None, 1)[:1] == [pattern]]
    if any(lines[i].split()[1:3] == parts[:2] for i in mine):
        return "already pinned"
    kept = [text for i, text in enumerate(lines) if i not in mine]
    if not dry_run:
        known_hosts.parent.mkdir(parents=True, exist_ok=True)
        known_hosts.write_text("\n".join([*kept, line]) + "\n")
    return "replaced" if mine else "pinned"


def unpin_host_key(known_hosts: Path, host: str, port: int, dry_run: bool) -> bool:
    if not known_hosts.exists():
        return False
    pattern = host_pattern(host, port)
    lines = known_hosts.read_text().splitlines()
    kept = [text for text in lines if text.split(None, 1)[:1] != [pattern]]
    if len(kept) != len(lines) and not dry_run:
        known_hosts.write_text("".join(f"{text}\n" for text in kept))
    return len(kept) != len(lines)


# ---------------------------------------------------------------------------- the record of each machine's set-up


class Record(BaseModel):
    """How `machine add` set a machine up: what `machine remove` and the lab.yaml copies need to reach it again."""

    model_config = ConfigDict(extra="forbid")
    machine: str
    target: str
    ssh_config: str | None
    host: str
    port: int
    mode: str
    uid: int
    layout: Layout
    # the lab.yaml the agent was last started with: a copy made since (by another machine's add) needs a restart
    started_lab_sha256: str | None = None


def records_dir(lab_name: str) -> Path:
    """Per lab, in the console's config dir: the same machine name may be in two labs."""
    from platformdirs import user_config_path

    return user_config_path("cetlab") / "machines" / lab_name


def save_record(folder: Path, record: Record) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{record.machine}.json").write_text(record.model_dump_json(indent=2) + "\n")


def load_record(folder: Path, machine: str) -> Record | None:
    path = folder / f"{machine}.json"
    if not path.exists():
        return None
    try:
        return Record.model_validate(json.loads(path.read_text()))
    except ValueError as exc:
        raise MachineError(f"{path}: not a machine record ({exc}); remove the file and add the machine again") from None


def all_records(folder: Path) -> list[Record]:
    return [r for p in sorted(folder.glob("*.json")) if (r := load_record(folder, p.stem)) is not None]
