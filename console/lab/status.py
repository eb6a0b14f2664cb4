"""`cetlab status` as data and as lines: the lab's machines, GPUs, gateway and model counts from a LabState, and where
lab.yaml is. One answer for the CLI's `status` and for `cetlab machine add`'s last step (the new machine's line)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from agents.wire.catalogue.verbs import lacking_said
from agents.wire.states import ModelState
from agents.wire.words import plural
from console.lab.state import LabState
from widgets.format import fmt, fmt_bytes

# a GPU in `cetlab --json status` (documented in docs/cli.md)
STATUS_GPU_KEYS = {
    "index",
    "name",
    "util_pct",
    "mem_used_bytes",
    "mem_total_bytes",
    "temp_c",
    "power_w",
    "power_limit_w",
    "failed",
    "simulated",
    "compute_capability",
}


def find_lab(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    if os.environ.get("CETLAB_LAB"):
        return Path(os.environ["CETLAB_LAB"])
    return Path("lab.yaml")


def status_json(state: LabState) -> dict[str, Any]:
    now = time.time()
    machines = []
    for view in state.machines.values():
        age_s = view.age_s(now)
        entry: dict[str, Any] = {
            "name": view.name,
            "online": view.online,
            "simulated": view.simulated,
            "age_s": None if age_s is None else round(age_s, 3),
            "cpu_pct": view.host.cpu_pct,
            "ram_used_bytes": view.host.ram_used_bytes,
            "ram_total_bytes": view.host.ram_total_bytes,
            "disk_used_bytes": view.host.disk_used_bytes,
            "disk_total_bytes": view.host.disk_total_bytes,
            "gpu_status": view.gpu_status.status if view.gpu_status else None,
            "gpus": [g.model_dump(include=STATUS_GPU_KEYS) for g in sorted(view.gpus.values(), key=lambda g: g.index)],
        }
        # sections whose component fails on the agent now: their figures elsewhere are the last ones before it failed
        entry["sections_failed"] = [f.to_wire() for f in view.section_faults()]  # and those refused here as sent
        if (
            view.gpu_support is not None
        ):  # which stacks each GPU can run, with the reason and the fix (docs/engines.md, "Older GPUs")
            entry["gpu_support"] = view.gpu_support.to_wire()
        entry["lab_version"] = view.lab_version  # the lab.yaml it runs (None: unknown, an older agent)
        entry["lab_differs"] = view.lab_differs(state.lab_version)  # not the workstation's: `cetlab lab push`
        if view.lab is not None and view.lab.restart_pending:
            entry["lab_restart_pending"] = view.lab.restart_pending
        if not view.online:
            entry["error"] = view.error or view.link
            entry["last_seen"] = view.last_seen
        entry["agent_version"] = view.agent_version  # and what this console can do that it cannot: `cetlab lab upgrade`
        entry["lacks"] = view.lacking()
        machines.append(entry)
    return {
        "lab": state.lab.lab,
        "lab_version": state.lab_version,
        "gateway": gateway_status(state),
        "models": models_status(state),
        "machines": machines,
    }


def gateway_status(state: LabState) -> dict[str, Any] | None:
    """Where lab.yaml puts the gateway and whether it serves there now (None: the lab has no gateway)."""
    config = state.lab.gateway
    if config is None:
        return None
    view = state.machines.get(config.machine)
    section = view.gateway if view is not None and view.online else None
    up = section is not None and section.url is not None and section.error is None
    if view is None or not view.online:
        error: str | None = f"{config.machine} is offline"
    elif section is None:
        error = f"{config.machine}'s agent serves no gateway (is its lab.yaml the workstation's? `cetlab lab push`)"
    else:
        error = None if up else section.error or "not listening yet"
    return {
        "machine": config.machine,
        "listen": f"{config.host}:{config.port}",
        "url": section.url if section is not None and section.url else config.url,
        "up": up,
        "error": error,
    }


# serving first, then on the way up, resting, and what needs a look
STATUS_MODEL_ORDER = [
    ModelState.WARM,
    ModelState.WARMING,
    ModelState.LOADING,
    ModelState.SLEEPING,
    ModelState.CACHED,
    ModelState.COLD,
    ModelState.FAILED,
]
assert set(STATUS_MODEL_ORDER) == set(ModelState)


def models_status(state: LabState) -> dict[str, int]:
    """How many of lab.yaml's models are in each state, as their machines say (`unknown`: its machine is offline)."""
    counts = {str(s): 0 for s in STATUS_MODEL_ORDER}
    counts["unknown"] = 0
    for model in state.lab.models:
        view = state.machines.get(model.machine)
        info = None
        if view is not None and view.online and view.models is not None:
            info = next((m for m in view.models.models if m.name == model.name), None)
        counts[str(info.state) if info is not None else "unknown"] += 1
    return {"total": len(state.lab.models), **counts}


def models_said(counts: dict[str, int]) -> str:
    """`5 models: 2 warm, 1 sleeping, 1 cached, 1 cold` (the states with none left out)."""
    parts = [f"{n} {name}" for name, n in counts.items() if name != "total" and n]
    return f"{plural(counts['total'], 'model')}" + (f": {', '.join(parts)}" if parts else "")


def gateway_said(gateway: dict[str, Any]) -> str:
    state = "up" if gateway["up"] else f"DOWN: {gateway['error']}"
    return f"gateway on {gateway['machine']}: {gateway['url']} (listens on {gateway['listen']}), {state}"


def status_human(data: dict[str, Any]) -> str:
    lines = [f"lab {data['lab']}" + (f"  lab.yaml {data['lab_version']}" if data.get("lab_version") else "")]
    if data.get("gateway") is not None:
        lines.append(gateway_said(data["gateway"]))
    if data.get("models") and data["models"]["total"]:  # a lab without models (yet) has no line for them
        lines.append(models_said(data["models"]))
    for m in data["machines"]:
        sim = " SIM" if m["simulated"] else ""
        if not m["online"]:
            lines.append(f"{m['name']:<14} OFFLINE  {m['error']}")
            continue
        lines.append(
            f"{m['name']:<14} online{sim}  cpu {fmt(m['cpu_pct'], '.0f', '%')}  ram {fmt_bytes(m['ram_used_bytes'])}/{fmt_bytes(m['ram_total_bytes'])}"
            f"  lab.yaml {m['lab_version'] or '?'}" + (f"  cetlab {m['agent_version']}" if m["agent_version"] else "")
        )
        if m["lab_differs"]:
            lines.append(f"  runs lab.yaml {m['lab_version']}, not the workstation's {data['lab_version']}: `cetlab lab push`")
        if m.get("lab_restart_pending"):
            lines.append(f"  lab.yaml at the next start: {', '.join(m['lab_restart_pending'])}")
        if m["lacks"]:
            lines.append(f"  {lacking_said(m['agent_version'], m['lacks'])}")
        if m["gpu_status"]:
            lines.append(f"  {m['gpu_status']}")
        lines += [f"  section {f['section']} FAILED ({f['phase']}): {f['error']}" for f in m["sections_failed"]]
        for g in m["gpus"]:
            if g["failed"]:
                lines.append(f"  gpu{g['index']} {g['name']:<26} FAILED: {g['failed']}")
                continue
            lines.append(
                f"  gpu{g['index']} {g['name']:<26} {fmt(g['util_pct'], '>3.0f', '%')}  "
                f"{fmt_bytes(g['mem_used_bytes']):>6}/{fmt_bytes(g['mem_total_bytes']):<6} "
                f"{fmt(g['temp_c'], '>3.0f', 'C')}  {fmt(g['power_w'], '>4.0f', 'W')}"
            )
    return "\n".join(lines)
