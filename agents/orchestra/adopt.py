"""Model servers outlive an agent restart: the pool remembers its running engines and a new agent re-adopts them."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from agents.orchestra.engine import EngineDown, EngineRequestFailed
from agents.runtime.procfiles import write_json
from agents.wire.documents import BadDocument, read_json_object
from agents.wire.engine_address import EngineAddress
from agents.wire.states import ModelState

if TYPE_CHECKING:
    from agents.orchestra.engine import Engine
    from agents.orchestra.lifecycle import Lifecycle
    from agents.orchestra.slot import Slot

log = logging.getLogger("cetlab.orchestra")

POLL_S = 0.5
UNKNOWN_EXIT = -1  # the return code of a re-adopted engine that ended: how, only its log can say


def _alive(pid: int, create_time: float | None) -> bool:
    """This very process (a reused pid has another start time) is running."""
    try:
        proc = psutil.Process(pid)
        same = create_time is None or abs(proc.create_time() - create_time) < 0.05
        return same and bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


class AdoptedProcess:
    """Stands in for the asyncio Process of an engine a previous agent started: not our child, so we poll it."""

    def __init__(self, pid: int, create_time: float | None):
        self.pid, self.create_time = pid, create_time
        self.returncode: int | None = None

    async def wait(self) -> int | None:
        while _alive(self.pid, self.create_time):
            await asyncio.sleep(POLL_S)
        self.returncode = UNKNOWN_EXIT  # not our child: its exit status went to its parent (init), not to us
        return self.returncode


def remember(slots: dict[str, Slot]) -> dict[str, dict[str, Any]]:
    """The engine processes running now, as a record kept in SQLite."""
    running = {}
    for slot in slots.values():
        engine = slot.engine
        if engine is None or engine.pid is None or engine.returncode is not None:
            continue
        proc = engine.proc
        create_time = getattr(proc, "create_time", None)
        if create_time is None:
            try:
                create_time = psutil.Process(engine.pid).create_time()
            except psutil.Error:
                continue
        running[slot.name] = {
            "pid": engine.pid,
            "create_time": create_time,
            "listen": engine.address.endpoint,
            "gpus": slot.gpus,
            "log_offset": engine._log_offset,
            "state": slot.state,
        }
    return running


ENGINES_FILE = "engines.json"  # in <state>/models/: the same record, for a start that lost state.db


def keep_on_disk(models_dir: Path, running: dict[str, dict[str, Any]]) -> None:
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
        write_json(models_dir / ENGINES_FILE, {"engines": running})
    except OSError as exc:  # a full disk: state.db has the record; only this fallback is lost
        log.warning("could not keep the running engines in %s: %s", models_dir / ENGINES_FILE, exc)


def found_on_disk(models_dir: Path) -> dict[str, dict[str, Any]]:
    """The engines the last agent recorded in its folder (state.db lost them); malformed entries are left out."""
    try:
        doc = read_json_object(models_dir / ENGINES_FILE)
    except BadDocument as exc:
        log.error("%s", exc)
        return {}
    engines = (doc or {}).get("engines")
    if not isinstance(engines, dict):
        return {}
    kept = {}
    for name, record in engines.items():
        if isinstance(record, dict) and isinstance(record.get("pid"), int) and _address(record) is not None:
            kept[name] = record
        else:
            log.error("%s: the entry of %r is not an engine record; left out", models_dir / ENGINES_FILE, name)
    if kept:
        log.warning("state.db has no record of running engines: looking for the %d in %s", len(kept), models_dir / ENGINES_FILE)
    return kept


def _address(record: dict[str, Any]) -> EngineAddress | None:
    """Where a recorded engine listens (None: the record says nowhere a current engine could)."""
    listen, port = record.get("listen"), record.get("port")  # port: a record of an agent from before engines' sockets
    try:
        if isinstance(listen, str):
            return EngineAddress.parse(listen)
        return EngineAddress(port=port) if isinstance(port, int) else None
    except ValueError:
        return None


def _ours(pid: int, create_time: Any, address: EngineAddress | None) -> bool:
    """The very engine a record names, before any signal: the pid alive with the recorded start time (a record
    without one names nothing), leading its own process group, with the recorded socket or port on its command line."""
    if address is None:
        return False
    if isinstance(create_time, bool) or not isinstance(create_time, (int, float)) or not _alive(pid, float(create_time)):
        return False
    mark = address.socket if address.socket is not None else str(address.port)
    try:
        return os.getpgid(pid) == pid and any(mark in arg for arg in psutil.Process(pid).cmdline())
    except (OSError, psutil.Error):
        return False


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def adopt(lifecycle: Lifecycle, records: dict[str, dict[str, Any]]) -> list[str]:
    """Take over engines a previous agent left running: healthy ones are warm (or sleeping) again, others are stopped."""
    adopted = []
    book = lifecycle.book
    for name, record in records.items():
        slot = book.slots.get(name)
        pid, create_time = record.get("pid"), record.get("create_time")
        address = _address(record)
        if not isinstance(pid, int) or not _ours(pid, create_time, address):
            if isinstance(pid, int) and create_time is None:
                log.warning("engine record of %s names pid %s without its start time: not trusted, left alone", name, pid)
            continue
        if slot is None:
            log.warning("engine pid %s serves %s, no longer in lab.yaml for this machine: stopping it", pid, name)
            _kill_group(pid)
            continue
        try:
            engine: Engine = lifecycle.new_engine(slot, list(record.get("gpus") or slot.model.gpus), check_gpus=False)
        except Exception as exc:  # the model's path or engine went away: the orphan cannot be served
            log.warning("cannot re-adopt %s (pid %s): %s; stopping it", name, pid, exc)
            _kill_group(pid)
            continue
        assert address is not None  # _ours checked it
        engine.address, engine._log_offset = address, record.get("log_offset", 0)
        engine.proc = AdoptedProcess(pid, create_time)
        if not await engine.health():
            log.warning("engine of %s (pid %s) does not answer /health: stopping it", name, pid)
            _kill_group(pid)
            if record.get("state") in (ModelState.LOADING, ModelState.WARMING):  # the operator's warm request was lost: say so
                lifecycle.fail(slot, None, "the agent restarted while loading; warm it again")
            continue
        try:
            sleeping = engine.can_sleep and await engine.is_sleeping()
        except (EngineDown, EngineRequestFailed):
            sleeping = False
        slot.gpus, slot.engine, slot.last_engine, slot.error = engine.gpus, engine, engine, None
        book.set_state(slot, ModelState.SLEEPING if sleeping else ModelState.WARM)
        book.event(slot, "adopt", detail={"pid": pid, "listen": engine.address.endpoint})
        lifecycle.supervise(slot, engine)
        log.info("re-adopted the %s engine of %s (pid %s, at %s)", slot.model.engine, name, pid, engine.address)
        adopted.append(name)
    return adopted
