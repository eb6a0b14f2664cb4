"""The lab queue: one machine's agent (lab.yaml `scheduler:`) keeps every job a team submits in its SQLite, starts
each where what it needs is free, and says in words why the others wait.

It only decides: each machine's agent still starts and supervises its own processes, asked through the catalogue
(`jobs.start` with the GPUs chosen) with the scheduler role's rights, its own machine in-process. A job it started
carries its entry's label (``queued_as``), so after a restart of either agent the entry finds its job again and
nothing starts twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from agents.runtime.hooks import Hooks
from agents.runtime.reach import Reach
from agents.runtime.rpc import Peer
from agents.scheduler.methods import register
from agents.scheduler.placement import Placement, lab_gpus, need_words, place, reserve, take
from agents.wire.catalogue.jobs import JOBS_GET, JOBS_START, JobParams, StartParams
from agents.wire.catalogue.method import request
from agents.wire.catalogue.models import MODELS_COLD, MODELS_SLEEP, MODELS_WARM, ModelParams
from agents.wire.catalogue.queue import (
    SubmitParams,
)
from agents.wire.lab.model import Lab, Trainer
from agents.wire.lab.queue import queues_jobs, scheduler_machine
from agents.wire.protocol import ErrorCode, RemoteError, Role
from agents.wire.sections.queue import (
    ENTRY_DONE,
    ENTRY_PLACED,
    ENTRY_WAITING,
    QUEUE_SHOWN,
    REASON_CHARS,
    EntryState,
    QueueEntry,
    QueueSection,
)
from agents.wire.states import JOB_ENDED, MODEL_HOLDS_GPU, JobState

if TYPE_CHECKING:
    from agents.runtime.core import AgentCore
    from agents.runtime.peers import PeerClient

log = logging.getLogger("cetlab.queue")

KEEP_ENDED = 50  # ended and cancelled entries kept in memory (and shown); all stay in state.db
YIELD_TIMEOUT_S = 300.0  # models asked to give their GPUs that still hold them after this: the entry waits again
START_TIMEOUT_S = 60.0
ASK_S = 30.0  # a running entry's job missing from its machine's tick: asked for by id at most this often  # a machine's `jobs.start` answers within this, or the entry waits again (its label guards a retry)

SCHEMA = [
    """CREATE TABLE queue_entries (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        record TEXT NOT NULL,       -- the entry as JSON (agents/wire/sections/queue.py's QueueEntry)
        state TEXT NOT NULL
    )""",
    "CREATE INDEX queue_entries_state ON queue_entries(state)",
]


def _cut(text: str) -> str:
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


class SchedulerComponent(Hooks):
    """Keeps the lab queue where lab.yaml's scheduler machine is this agent's (in a lab with recipes); else nothing."""

    name = "queue"

    def __init__(self, core: AgentCore) -> None:
        self.core = core
        self.enabled = scheduler_machine(core.lab) == core.machine.name
        self.entries: dict[int, QueueEntry] = {}
        self.peers: PeerClient | None = None
        self.reach: Reach | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one pass at a time: a submit's pass and the loop's never give a GPU twice
        self._wake = asyncio.Event()
        self._lent_at: dict[int, float] = {}  # entry -> when its models were asked to give their GPUs
        self._asked: dict[int, float] = {}  # entry -> when its job was last asked for by id
        if self.enabled:
            register(self)

    @property
    def lab(self) -> Lab:
        return self.core.lab

    # -- life

    async def start(self) -> None:
        if not self.enabled:
            return
        store = self.core.store
        store.migrate(self.name, SCHEMA)
        waiting = store.query("SELECT id, record FROM queue_entries WHERE state NOT IN ('ended', 'cancelled') ORDER BY id")
        ended = store.query(
            "SELECT id, record FROM queue_entries WHERE state IN ('ended', 'cancelled') ORDER BY id DESC LIMIT ?", (KEEP_ENDED,)
        )
        for row in [*reversed(ended), *waiting]:
            try:
                self.entries[row["id"]] = QueueEntry.model_validate_json(row["record"])
            except ValueError as exc:
                log.warning("queue entry %s in state.db is unreadable, left out: %s", row["id"], exc)
        self.reach = Reach(self.core, None, Role.SCHEDULER)
        if queues_jobs(self.lab):
            await self._links(self.lab)
        self._task = asyncio.create_task(self._loop(), name="queue")
        log.info("lab queue on %s: %d waiting or running", self.core.machine.name, len(waiting))

    async def _links(self, lab: Lab) -> None:
        from agents.runtime.peers import SCHEDULER_KEY_NAME, PeerClient  # the SSH stack: only with other machines to call

        own = self.core.machine.name
        others = [m.name for m in lab.machines if m.name != own]
        replaced = self.peers
        self.peers = PeerClient(lab, self.core.state_dir, machines=others, key_name=SCHEDULER_KEY_NAME) if others else None
        if self.peers is not None:
            await self.peers.start()
        if self.reach is not None:
            self.reach.peers = self.peers
        if replaced is not None:
            await replaced.stop()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.peers is not None:
            await self.peers.stop()

    async def reconfigure(self, old: Lab, new: Lab) -> None:
        """A pushed lab.yaml: recipes as they now are from the next pass; machines added, removed or moved get new links."""
        if not self.enabled:
            return
        own = self.core.machine.name
        moved = {(m.name, m.host, m.port) for m in old.machines if m.name != own} != {
            (m.name, m.host, m.port) for m in new.machines if m.name != own
        }
        if queues_jobs(new) and (moved or self.peers is None):  # machines moved, or the first recipes: links to the others
            await self._links(new)
        self._wake.set()

    def retry_peers(self) -> None:
        """Peer trust was just written (a push): the links that were untrusted or refused try again now."""
        if self.peers is not None:
            self.peers.core.retry_now()

    async def _loop(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.lab.scheduler.interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.run_pass()
            except Exception:
                log.exception("lab queue pass")

    # -- the entries

    def _save(self, entry: QueueEntry) -> None:
        with self.core.store.transaction() as db:
            db.execute(
                "UPDATE queue_entries SET record=?, state=? WHERE id=?", (entry.model_dump_json(), str(entry.state), entry.id)
            )
        self.entries[entry.id] = entry
        ended = [e.id for e in self.entries.values() if e.state in ENTRY_DONE]
        for old in ended[:-KEEP_ENDED]:
            del self.entries[old]

    def _update(self, entry: QueueEntry, **changes: Any) -> QueueEntry:
        updated = entry.model_copy(update=changes)
        self._save(updated)
        return updated

    def _recipe(self, name: str) -> Trainer:
        for recipe in self.lab.trainers:
            if recipe.name == name:
                return recipe
        names = ", ".join(r.name for r in self.lab.trainers) or "none"
        raise RemoteError(ErrorCode.NOT_FOUND, f"no recipe named {name!r} in lab.yaml (recipes: {names})")

    def label(self, entry_id: int) -> str:
        """The entry's label on the job it starts: this machine and the entry's number."""
        return f"{self.core.machine.name}:{entry_id}"

    def get(self, entry_id: int) -> QueueEntry:
        entry = self.entries.get(entry_id)
        if entry is None:
            rows = self.core.store.query("SELECT record FROM queue_entries WHERE id=?", (entry_id,))
            if not rows:
                raise RemoteError(ErrorCode.NOT_FOUND, f"no queue entry {entry_id}")
            entry = QueueEntry.model_validate_json(rows[0]["record"])
        return entry

    def ordered(self) -> list[QueueEntry]:
        """Waiting entries in the order they would start: priority, plus a point per age_bonus_s waited, then age."""
        now = time.time()
        bonus = self.lab.scheduler.age_bonus_s
        waiting = [e for e in self.entries.values() if e.state in ENTRY_WAITING]
        return sorted(waiting, key=lambda e: (-(e.priority + (now - e.submitted_at) / bonus), e.submitted_at, e.id))

    async def submit(self, peer: Peer, params: SubmitParams) -> QueueEntry:
        recipe = self._recipe(params.recipe)
        now = time.time()
        with self.core.store.transaction() as db:
            cursor = db.execute("INSERT INTO queue_entries (record, state) VALUES ('{}', 'queued')")
            entry_id = int(cursor.lastrowid or 0)
        entry = QueueEntry(
            id=entry_id,
            recipe=recipe.name,
            user=peer.who,
            priority=params.priority if params.priority is not None else recipe.priority,
            state=EntryState.QUEUED,
            submitted_at=now,
            need=need_words(recipe),
            params={k: v for k, v in params.params.items() if isinstance(v, str | int | float | bool)},
        )
        self._save(entry)
        log.info("%s queued %s as entry %d (%s)", peer.who, recipe.name, entry_id, entry.need)
        await self.run_pass(only=entry_id if params.now else None)
        entry = self.entries[entry_id]
        if params.now and entry.state in ENTRY_WAITING:
            entry = self._update(entry, state=EntryState.CANCELLED, ended_at=time.time(), position=None)
            raise RemoteError(ErrorCode.CONFLICT, f"{recipe.name} cannot start now: {entry.reason}", {"entry": entry_id})
        if entry.state is EntryState.ENDED and entry.job_id is None:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"{recipe.name} could not start: {entry.reason}", {"entry": entry_id})
        return entry

    # -- one pass: place what can start, say why the rest waits

    async def run_pass(self, only: int | None = None) -> None:
        """Look at the lab once: follow running entries to their jobs' ends, then start every waiting entry that fits,
        in order, each reserving what the first blocked one waits for. ``only``: place that entry or none (`--now`)."""
        if self.reach is None:
            return
        async with self._lock:
            now = time.time()
            views = list(self.reach.all_views())
            self._follow(views, now)
            await self._ask_for_missing(views, now)
            await self._after_yields(views, now)
            # placed entries whose jobs no tick shows yet (a tick is up to a second behind): they hold their GPUs
            shown = {job.queued_as for _, view in views for job in view.jobs if job.queued_as}
            starting = {
                (e.machine or "", gpu): f"job {e.job_id or '(starting)'} ({e.recipe}, starting)"
                for e in self.entries.values()
                if e.state in ENTRY_PLACED and self.label(e.id) not in shown
                for gpu in e.gpus
            }
            picture = lab_gpus(self.lab, views, starting, now)
            position = 0
            blocked = False
            for entry in self.ordered():
                if entry.state is EntryState.HELD:
                    self._update(entry, position=None, reason="held: `cetlab release` lets it start")
                    continue
                if only is not None and entry.id != only:
                    continue
                try:
                    recipe = self._recipe(entry.recipe)
                except RemoteError as exc:
                    self._update(entry, state=EntryState.ENDED, ended_at=now, reason=_cut(exc.message), position=None)
                    continue
                decision = place(recipe, picture, now)
                if isinstance(decision, Placement):
                    take(picture, decision, f"queue entry {entry.id} ({entry.recipe}, starting)")
                    if decision.yields:
                        await self._lend(entry, decision)
                    else:
                        await self._start(entry, recipe, decision)
                    continue
                position += 1
                self._update(entry, position=position, reason=_cut(decision.reason), expected_start=decision.expected_start)
                if not blocked:  # the first one that cannot start keeps what it waits for: no newer job takes it
                    blocked = True
                    reserve(recipe, picture, f"queue entry {entry.id} ({entry.recipe}), next in line")

    def _follow(self, views: list[tuple[str, Any]], now: float) -> None:
        """Running entries whose jobs ended become ended, with the job's state; a starting one finds its job by label."""
        jobs = {job.queued_as: job for _, view in views for job in view.jobs if job.queued_as}
        for entry in list(self.entries.values()):
            if entry.state not in ENTRY_PLACED:
                continue
            job = jobs.get(self.label(entry.id))
            if job is None:
                continue
            if job.state in JOB_ENDED:
                reason = job.error or (f"exit code {job.exit_code}" if job.exit_code else None)
                self._update(
                    entry,
                    state=EntryState.ENDED,
                    job_id=job.id,
                    job_state=job.state,
                    ended_at=job.ended_at or now,
                    reason=_cut(reason) if reason else None,
                )
            elif entry.state is EntryState.STARTING or entry.job_state != job.state:
                self._update(entry, state=EntryState.RUNNING, job_id=job.id, job_state=job.state)

    async def _ask_for_missing(self, views: list[tuple[str, Any]], now: float) -> None:
        """A running entry whose job its machine's tick no longer lists (it shows the active jobs and the newest ended
        ones: one that ended while this agent was down may be past them) is asked for by id, at most every ASK_S."""
        assert self.reach is not None
        seen = dict(views)
        for entry in list(self.entries.values()):
            if entry.state is not EntryState.RUNNING or entry.job_id is None or entry.machine is None:
                continue
            view = seen.get(entry.machine)
            if view is None or not view.online or any(job.id == entry.job_id for job in view.jobs):
                continue
            if now - self._asked.get(entry.id, 0.0) < ASK_S:
                continue
            self._asked[entry.id] = now
            try:
                job = await request(self.reach, entry.machine, JOBS_GET, JobParams(id=entry.job_id))
            except RemoteError as exc:
                if exc.code == ErrorCode.NOT_FOUND:
                    self._update(entry, state=EntryState.ENDED, ended_at=now, job_state=JobState.LOST, reason=_cut(exc.message))
                continue
            if job.state in JOB_ENDED:
                self._update(entry, state=EntryState.ENDED, job_state=job.state, ended_at=job.ended_at or now)

    # -- models that give their GPUs to a job, and come back after it

    async def _lend(self, entry: QueueEntry, placement: Placement) -> None:
        """Put the models aside (sleep, or stop where the engine cannot sleep); the job starts once they let go."""
        assert self.reach is not None
        for model in placement.yields:
            try:
                try:
                    await request(self.reach, placement.machine, MODELS_SLEEP, ModelParams(model=model))
                except RemoteError as exc:
                    if exc.code != ErrorCode.UNAVAILABLE:  # UNAVAILABLE: no sleep mode; stopped instead
                        raise
                    await request(self.reach, placement.machine, MODELS_COLD, ModelParams(model=model))
            except RemoteError as exc:
                self._update(entry, reason=_cut(f"{model} on {placement.machine} would not give its GPUs: {exc.message}"))
                return
        log.info(
            "queue entry %d (%s): %s put aside on %s", entry.id, entry.recipe, ", ".join(placement.yields), placement.machine
        )
        self._lent_at[entry.id] = time.monotonic()
        self._update(
            entry,
            state=EntryState.STARTING,
            machine=placement.machine,
            gpus=placement.gpus,
            yielded=list(placement.yields),
            restored=False,
            position=None,
            reason=_cut(f"{', '.join(placement.yields)} gives its GPUs to it; it starts when they are free"),
        )

    async def _after_yields(self, views: list[tuple[str, Any]], now: float) -> None:
        """Start the jobs whose models have let go of their GPUs; bring back the models of jobs that ended."""
        assert self.reach is not None
        seen = dict(views)
        for entry in list(self.entries.values()):
            if not entry.yielded or entry.machine is None:
                continue
            view = seen.get(entry.machine)
            if entry.state is EntryState.STARTING and entry.job_id is None:
                models = [view.model(m) if view is not None else None for m in entry.yielded]
                if all(m is not None and m.state not in MODEL_HOLDS_GPU for m in models):
                    recipe = next((r for r in self.lab.trainers if r.name == entry.recipe), None)
                    if recipe is not None:
                        self._lent_at.pop(entry.id, None)
                        await self._start(entry, recipe, Placement(entry.machine, entry.gpus))
                elif time.monotonic() - self._lent_at.get(entry.id, time.monotonic()) > YIELD_TIMEOUT_S:
                    self._update(
                        entry, state=EntryState.QUEUED, reason=_cut(f"{', '.join(entry.yielded)} did not let go in time")
                    )
                    await self._restore(self.entries[entry.id])
            elif entry.state in ENTRY_DONE or (entry.state is EntryState.QUEUED and not entry.restored):
                if not entry.restored:
                    await self._restore(entry)

    async def _restore(self, entry: QueueEntry) -> None:
        """The models put aside for an entry, warm again (each tried on every pass until it is)."""
        assert self.reach is not None and entry.machine is not None
        for model in entry.yielded:
            try:
                await request(self.reach, entry.machine, MODELS_WARM, ModelParams(model=model))
            except RemoteError as exc:
                log.info("queue entry %d: %s not back yet on %s: %s", entry.id, model, entry.machine, exc.message)
                return
        log.info(
            "queue entry %d (%s) ended: %s warm again on %s", entry.id, entry.recipe, ", ".join(entry.yielded), entry.machine
        )
        self._update(entry, restored=True)

    async def _start(self, entry: QueueEntry, recipe: Trainer, placement: Placement) -> None:
        assert self.reach is not None
        entry = self._update(
            entry, state=EntryState.STARTING, machine=placement.machine, gpus=placement.gpus, position=None, reason=None
        )
        params = StartParams(
            recipe=recipe.name,
            params=dict(entry.params),
            gpus=placement.gpus if recipe.need is not None else None,
            queued_as=self.label(entry.id),
            user=entry.user[:200],
        )
        try:
            job = await request(self.reach, placement.machine, JOBS_START, params, timeout=START_TIMEOUT_S)
        except RemoteError as exc:
            if exc.code in (ErrorCode.CONFLICT, ErrorCode.DISCONNECTED, ErrorCode.TIMEOUT):
                # taken since the last tick, or the machine did not answer: it waits again (its label finds a job that
                # did start after all)
                self._update(entry, state=EntryState.QUEUED, reason=_cut(f"{placement.machine}: {exc.message}"))
                return
            log.warning("queue entry %d (%s) could not start on %s: %s", entry.id, recipe.name, placement.machine, exc.message)
            self._update(entry, state=EntryState.ENDED, ended_at=time.time(), job_state=JobState.FAILED, reason=_cut(exc.message))
            return
        log.info(
            "queue entry %d (%s) started as job %s on %s GPUs %s",
            entry.id,
            recipe.name,
            job.id,
            placement.machine,
            placement.gpus,
        )
        self._update(entry, state=EntryState.RUNNING, job_id=job.id, job_state=job.state, started_at=time.time())

    # -- what it shows

    def section(self) -> QueueSection | None:
        if not self.enabled:
            return None
        waiting = self.ordered()
        placed = sorted((e for e in self.entries.values() if e.state in ENTRY_PLACED), key=lambda e: e.id)
        done = sorted((e for e in self.entries.values() if e.state in ENTRY_DONE), key=lambda e: -e.id)
        return QueueSection(
            machine=self.core.machine.name,
            entries=[*placed, *waiting, *done][:QUEUE_SHOWN],
            waiting=len(waiting),
            running=len(placed),
        )
