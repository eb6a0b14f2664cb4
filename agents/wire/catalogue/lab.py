"""The method catalogue: every RPC method with its params model, its result model, its role and its doc: lab.

`cetlab lab push` sends the workstation's lab.yaml to every agent (``lab.apply``) with the lab's pinned host keys
and the peer keys the agents need of each other; ``lab.rollback`` puts the previous one back. Operators only; the
keys a push authorizes get the gateway or node role, never more (the agent decides which, from the lab it applies).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from agents.wire.catalogue.method import OP, Method, Params
from agents.wire.lab.yaml_doc import MAX_BYTES
from agents.wire.protocol import PeerKeys
from agents.wire.schema import Name
from agents.wire.sections.base import Section

MAX_KNOWN_HOSTS_CHARS = 256 * 1024  # a known_hosts line is ~100 characters: two thousand machines


class LabApplyParams(Params):
    text: Annotated[str, Field(min_length=1, max_length=MAX_BYTES)]  # the lab.yaml, as the workstation holds it
    # the console's known_hosts lines for the lab's machines: the agent's peer known hosts (never trust on first use)
    known_hosts: Annotated[str, Field(max_length=MAX_KNOWN_HOSTS_CHARS)] = ""
    # each machine's public client keys, as its hello said: the agent authorizes those the lab needs of them
    peer_keys: Annotated[dict[Name, PeerKeys], Field(max_length=4096)] = Field(default_factory=dict)
    dry_run: bool = False  # validate and say what would change; write nothing


class LabRollbackParams(Params):
    dry_run: bool = False


class LabApplied(Section):
    """What a push (or a rollback) did on one machine."""

    version: str  # the lab.yaml it runs now
    previous: str | None = None  # the one it ran before
    changed: bool = True  # False: it ran this text already
    live: list[str] = Field(default_factory=list)  # what changed and was applied without a restart
    restart: list[str] = Field(default_factory=list)  # what changed and waits for the agent's next start
    peer_hosts: int = 0  # host keys written to its peer known hosts
    authorized: list[str] = Field(default_factory=list)  # "gateway@hub", "node@m1": the peer keys it now lets in
    dry_run: bool = False


LAB_APPLY = Method(
    "lab.apply",
    LabApplyParams,
    LabApplied,
    OP,
    "Validate a lab.yaml and apply it live (keeping the previous one); its errors as lab.yaml:LINE:COL.",
)

LAB_ROLLBACK = Method(
    "lab.rollback", LabRollbackParams, LabApplied, OP, "Apply the lab.yaml this machine ran before the last push."
)
