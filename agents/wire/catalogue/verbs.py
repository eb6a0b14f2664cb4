"""What a user calls each method by (the `cetlab` verb, the console's view), and what an older agent lacks of them.

A console newer than an agent learns from its hello which methods the agent serves (``Hello.methods``); the ones of
this catalogue it lacks are said by the verb a user would use, grouped, and a call to one of them is answered with
the agent's version and the fix instead of a protocol error. A method not named here is said by its own name.
"""

from __future__ import annotations

from collections.abc import Iterable

from agents.wire.protocol import ErrorCode, RemoteError

UPGRADE = "cetlab lab upgrade"

USER_VERBS: dict[str, str] = {
    "set_interval": "the sampling interval",
    "sim.override": "`cetlab sim-override`",
    "gpus.support": "the GPU support check",
    "jobs.recipes": "`cetlab train`",
    "jobs.start": "`cetlab train`",
    "jobs.list": "`cetlab jobs`",
    "jobs.get": "`cetlab jobs`",
    "jobs.stop": "`cetlab stop`",
    "jobs.kill": "`cetlab stop`",
    "jobs.logs": "`cetlab logs`",
    "jobs.node_start": "multi-node recipes",
    "jobs.node_stop": "multi-node recipes",
    "jobs.node_status": "multi-node recipes",
    "models.list": "`cetlab models`",
    "models.get": "`cetlab models`",
    "models.warm": "`cetlab warm`",
    "models.sleep": "`cetlab sleep`",
    "models.cold": "`cetlab cold`",
    "models.cache": "`cetlab cache`",
    "models.swap": "`cetlab swap`",
    "models.pin": "`cetlab pin`",
    "models.rotation": "`cetlab rotate`",
    "models.rotate": "`cetlab rotate`",
    "models.adapter": "`cetlab serve-checkpoint`",
    "models.rpc_start": "models spread over several machines (rpc:)",
    "models.rpc_stop": "models spread over several machines (rpc:)",
    "models.rpc_status": "models spread over several machines (rpc:)",
    "checkpoints.runs": "`cetlab checkpoints`",
    "checkpoints.list": "`cetlab checkpoints`",
    "checkpoints.resume": "`cetlab resume`",
    "checkpoints.serve": "`cetlab serve-checkpoint`",
    "checkpoints.delete": "`cetlab delete-checkpoint`",
    "checkpoints.keep": "`cetlab keep`",
    "checkpoints.prune": "`cetlab prune`",
    "costs.get": "`cetlab costs`",
    "gateway.status": "`cetlab gateway`",
    "gateway.keys.add": "`cetlab gateway keys`",
    "gateway.keys.list": "`cetlab gateway keys`",
    "gateway.keys.revoke": "`cetlab gateway keys`",
    "notify.status": "`cetlab alerts`",
    "notify.test": "`cetlab alerts notify-test`",
    "audit.list": "`cetlab audit`",
    "alerts.list": "`cetlab alerts`",
    "alerts.ack": "`cetlab alerts --ack`",
    "doctor.run": "`cetlab lab doctor`",
}


def user_verb(method: str) -> str:
    return USER_VERBS.get(method, method)


def lacking(known: Iterable[str], wanted: Iterable[str]) -> dict[str, list[str]]:
    """The methods of ``wanted`` (this console's catalogue) not in ``known`` (an agent's), by the verb a user would use."""
    have = set(known)
    grouped: dict[str, list[str]] = {}
    for method in wanted:
        if method not in have:
            grouped.setdefault(user_verb(method), []).append(method)
    return grouped


def lacks_error(machine: str, agent_version: str | None, method: str) -> RemoteError:
    """A call to a method the agent does not serve: its version, what the user asked for, and the fix."""
    runs = f"runs cetlab {agent_version}" if agent_version else "runs an older cetlab"
    verb = user_verb(method)
    what = f"{verb} ({method})" if verb != method else method
    return RemoteError(
        ErrorCode.METHOD_NOT_FOUND,
        f"{machine} {runs}, which has no {what}: run `{UPGRADE}`",
        {"machine": machine, "method": method, "agent_version": agent_version},
    )


def lacking_said(agent_version: str | None, lacks: dict[str, list[str]]) -> str:
    """What an agent older than this console cannot do, by the verb a user would use; the rest works as usual."""
    from agents import __version__

    return (
        f"runs cetlab {agent_version or '?'}, older than this console's {__version__}: no {', '.join(lacks)} there "
        f"(the rest works): run `{UPGRADE}`"
    )
