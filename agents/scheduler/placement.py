"""Where a queued job can run now, or why it waits: the lab as the queue sees it (each GPU and what holds it), and the
one placement rule (agents/wire/lab/queue.py's gpu_misfit for what a recipe by need accepts).

Pure functions over typed views, so the decision is tested without agents and benched at a thousand jobs."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agents.runtime.view import MachineView
from agents.wire.lab.model import Lab, Trainer
from agents.wire.lab.queue import Need, gpu_misfit
from agents.wire.protocol import GpuSample, LinkStatus
from agents.wire.states import JOB_HOLDS_GPU, MODEL_HOLDS_GPU, ModelState
from agents.wire.words import plural

NEVER = float("inf")
MAX_PHRASES = 6  # a reason names this many blockers, then counts the rest


@dataclass(frozen=True)
class Holder:
    """What holds a GPU now: a job, a model, or a job the queue is starting there."""

    what: str  # "model llama-3.1-8b (warm, pinned)", "job m5-12 (sft)"
    until: float = NEVER  # when it is expected to let go (a job's ETA); NEVER: not known
    pinned: bool = False
    model: str | None = None  # a model that may give its GPUs to a job (lab.yaml orchestra.yields): its name


@dataclass
class MachineGpus:
    """One machine's GPUs as the queue sees them, and what holds each."""

    name: str
    online: bool
    gpus: dict[int, GpuSample] = field(default_factory=dict)
    holders: dict[int, list[Holder]] = field(default_factory=dict)
    why_offline: str | None = None
    fits: dict[tuple[object, ...], tuple[list[int], list[str]]] = field(default_factory=dict)  # _fits, per kind of need
    free_count: int | None = None
    free_at_cache: dict[tuple[tuple[int, ...], int], float] = field(default_factory=dict)
    yielding: bool = False  # some model here may give its GPUs to a job

    def hold(self, index: int, holder: Holder) -> None:
        """Add a holder of a GPU (every holder comes in here, so the pass's counts stay right)."""
        self.holders.setdefault(index, []).append(holder)
        self.free_count = None
        self.free_at_cache.clear()
        if holder.model is not None:
            self.yielding = True

    def nth_free_at(self, fitting: list[int], n: int, now: float) -> float:
        """When n of these GPUs are expected to be free (kept until a holder is added)."""
        key = (tuple(fitting), n)
        if key not in self.free_at_cache:
            self.free_at_cache[key] = sorted(self.frees_at(i, now) for i in fitting)[n - 1]
        return self.free_at_cache[key]

    def free_gpus(self) -> int:
        """How many of its GPUs nothing holds (kept until a holder is added)."""
        if self.free_count is None:
            self.free_count = sum(1 for i in self.gpus if not self.holders.get(i))
        return self.free_count

    def free(self, index: int, yielding: bool = False) -> bool:
        """Nothing holds it; or (``yielding``) only models that may give it to a job."""
        holders = self.holders.get(index, [])
        return all(h.model is not None for h in holders) if yielding else not holders

    def yielders(self, indices: list[int]) -> list[str]:
        """The models that would give these GPUs up, in GPU order, each once."""
        names = [h.model for i in indices for h in self.holders.get(i, []) if h.model is not None]
        return list(dict.fromkeys(names))

    def frees_at(self, index: int, now: float) -> float:
        """When this GPU is expected to be free: now, a job's expected end, or NEVER (a model, or a job with no ETA)."""
        holders = self.holders.get(index)
        return now if not holders else max(h.until for h in holders)


@dataclass(frozen=True)
class Placement:
    machine: str
    gpus: list[int]
    yields: tuple[str, ...] = ()  # models of that machine put aside for it first (lab.yaml orchestra.yields)


@dataclass(frozen=True)
class Wait:
    reason: str  # why, in words a person reads
    expected_start: float | None = None  # from the holders' ETAs; None: not known


def _until(seconds: float | None, now: float) -> str:
    return f" until about {time.strftime('%H:%M', time.localtime(now + seconds))}" if seconds is not None else ""


def lab_gpus(
    lab: Lab, views: Iterable[tuple[str, MachineView]], starting: Mapping[tuple[str, int], str], now: float
) -> dict[str, MachineGpus]:
    """Every machine's GPUs and their holders: the jobs and models its last tick shows, and the GPUs of jobs the queue
    is starting there (``starting``: (machine, GPU) -> "queue entry 12 (sft)") that no tick shows yet."""
    seen = dict(views)
    yielding = set(lab.orchestra.yields)
    picture: dict[str, MachineGpus] = {}
    for machine in lab.machines:
        view = seen.get(machine.name)
        online = view is not None and view.link is LinkStatus.ONLINE
        entry = MachineGpus(
            machine.name,
            online,
            dict(view.gpus) if view is not None else {},
            why_offline=None if online else (f"its link is {view.link}" if view is not None else "not reached yet"),
        )
        if view is not None:
            for job in view.jobs:
                if job.state in JOB_HOLDS_GPU:
                    until = now + job.eta_s if job.eta_s is not None else NEVER
                    holder = Holder(f"job {job.id} ({job.recipe})" + _until(job.eta_s, now), until)
                    for index in job.gpus:
                        entry.hold(index, holder)
            for model in view.models.models if view.models is not None else []:
                if model.state in MODEL_HOLDS_GPU:
                    gives = model.name in yielding and not model.pinned and model.state is ModelState.WARM and not model.op
                    holder = Holder(
                        f"model {model.name} ({model.state}{', pinned' if model.pinned else ''})",
                        pinned=model.pinned,
                        model=model.name if gives else None,
                    )
                    for index in model.gpus:
                        entry.hold(index, holder)
        picture[machine.name] = entry
    for (name, index), what in starting.items():
        if name in picture and not any(what in h.what for h in picture[name].holders.get(index, [])):
            picture[name].hold(index, Holder(what))
    return picture


def _ranges(indices: list[int]) -> str:
    """[1, 2, 3, 4] -> "1-4", [0, 2] -> "0,2"."""
    parts: list[str] = []
    for index in sorted(indices):
        if parts and parts[-1].split("-")[-1] == str(index - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{index}"
        else:
            parts.append(str(index))
    return ",".join(parts)


def _held(machine: MachineGpus, indices: list[int]) -> list[str]:
    """ "m5 GPUs 1-4 hold model x (warm, pinned)", one phrase per holder, its GPUs together."""
    by_holder: dict[str, list[int]] = {}
    for index in indices:
        for holder in machine.holders.get(index, []):
            by_holder.setdefault(holder.what, []).append(index)
    phrases = []
    for what, gpus in by_holder.items():
        label = f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {_ranges(gpus)}"
        verb = "runs" if what.startswith("job") else "holds"
        phrases.append(f"{machine.name} {label} {verb if len(gpus) == 1 else verb.removesuffix('s')} {what}")
    return phrases


def _fixed(recipe: Trainer, picture: Mapping[str, MachineGpus], now: float) -> Placement | Wait:
    machine = picture.get(recipe.machine)
    wanted = f"GPU{'s' if len(recipe.gpus) != 1 else ''} {_ranges(recipe.gpus)} of {recipe.machine}"
    if machine is None or not machine.online:
        return Wait(f"waiting for {recipe.machine}: {machine.why_offline if machine else 'not in the lab'}")
    busy = [i for i in recipe.gpus if not machine.free(i)]
    if not busy:
        return Placement(recipe.machine, list(recipe.gpus))
    if all(machine.free(i, yielding=True) for i in busy):
        return Placement(recipe.machine, list(recipe.gpus), tuple(machine.yielders(busy)))
    frees = max(machine.frees_at(i, now) for i in busy)
    return Wait(f"waiting for {wanted}: " + "; ".join(_held(machine, busy)), frees if frees != NEVER else None)


def _fits(need: Need, machine: MachineGpus) -> tuple[list[int], list[str]]:
    """The GPUs of this machine that do for the need (free or not), and why each other one does not (worked out once
    per kind of need and machine in a pass: a thousand jobs ask the same few questions of each machine)."""
    key = (need.min_vram_gib, need.min_compute_capability, need.gpu_name)
    known = machine.fits.get(key)
    if known is not None:
        return known
    fitting: list[int] = []
    misfits: list[str] = []
    for index, gpu in sorted(machine.gpus.items()):
        problem = gpu_misfit(need, gpu)
        if problem is None:
            fitting.append(index)
        else:
            misfits.append(problem)
    machine.fits[key] = (fitting, misfits)
    return fitting, misfits


def _by_need(recipe: Trainer, need: Need, picture: Mapping[str, MachineGpus], now: float) -> Placement | Wait:
    allowed = need.machines or list(picture)
    best: tuple[int, int, int, str, list[int]] | None = None
    blocked: list[str] = []
    expected = NEVER
    for order, name in enumerate(allowed):
        machine = picture.get(name)
        if machine is None or not machine.online:
            blocked.append(f"{name}: {machine.why_offline if machine else 'not in the lab'}")
            continue
        fitting, misfits = _fits(need, machine)
        if len(fitting) < need.gpus:
            if not machine.gpus:
                blocked.append(f"{name} has no GPU")
            else:
                shown = misfits[0] if misfits else f"{need.gpus} needed"
                blocked.append(f"{name} has {plural(len(fitting), 'GPU')} that fit{'s' if len(fitting) == 1 else ''} ({shown})")
            continue
        free = [i for i in fitting if machine.free(i)] if machine.free_gpus() >= need.gpus else []
        if len(free) >= need.gpus:
            # the smallest GPUs that do, on the machine with the fewest free: the big ones stay for the big jobs
            chosen = sorted(free, key=lambda i: (machine.gpus[i].mem_total_bytes or 0, i))[: need.gpus]
            score = sum(machine.gpus[i].mem_total_bytes or 0 for i in chosen)
            candidate = (score, len(free), order, name, chosen)
            if best is None or candidate[:3] < best[:3]:
                best = candidate
            continue
        if len(blocked) < MAX_PHRASES:  # the words only for the machines the reason names
            blocked += _held(machine, [i for i in fitting if not machine.free(i)])
        else:
            blocked.append("")
        expected = min(expected, machine.nth_free_at(fitting, need.gpus, now))
    if best is not None:
        return Placement(best[3], sorted(best[4]))
    lent = _by_need_yielding(need, allowed, picture)
    if lent is not None:
        return lent
    named = [b for b in blocked if b][:MAX_PHRASES]
    more = len(blocked) - len(named)
    phrases = named + ([f"and {more} more like {'it' if more == 1 else 'these'}"] if more > 0 else [])
    reason = f"waiting for {need.describe()}: " + ("; ".join(phrases) if phrases else "no machine to run on")
    return Wait(reason, expected if expected != NEVER else None)


def _by_need_yielding(need: Need, allowed: list[str], picture: Mapping[str, MachineGpus]) -> Placement | None:
    """Where the need fits once models that may yield give their GPUs: the fewest models put aside, then the smallest GPUs."""
    best: tuple[int, int, int, Placement] | None = None
    for order, name in enumerate(allowed):
        machine = picture.get(name)
        if machine is None or not machine.online:
            continue
        fitting, _ = _fits(need, machine)
        if not machine.yielding and machine.free_gpus() < need.gpus:
            continue  # no model here gives way, and too few are free
        usable = [i for i in fitting if machine.free(i, yielding=True)]
        if len(usable) < need.gpus:
            continue
        chosen = sorted(usable, key=lambda i: (not machine.free(i), machine.gpus[i].mem_total_bytes or 0, i))[: need.gpus]
        yields = machine.yielders(chosen)
        score = (len(yields), sum(machine.gpus[i].mem_total_bytes or 0 for i in chosen), order)
        if best is None or score < best[:3]:
            best = (*score, Placement(name, sorted(chosen), tuple(yields)))
    return best[3] if best is not None else None


def place(recipe: Trainer, picture: Mapping[str, MachineGpus], now: float) -> Placement | Wait:
    """Where the recipe's job starts now (its machine and GPUs), or why it waits and when it may start."""
    if recipe.need is None:
        return _fixed(recipe, picture, now)
    return _by_need(recipe, recipe.need, picture, now)


def need_words(recipe: Trainer) -> str:
    """What the recipe waits for, in words: its need, or its GPU numbers and machine."""
    if recipe.need is not None:
        return recipe.need.describe()
    if not recipe.gpus:
        return f"{recipe.machine} (no GPU)"
    return f"GPU{'s' if len(recipe.gpus) != 1 else ''} {_ranges(recipe.gpus)} of {recipe.machine}"


def take(picture: Mapping[str, MachineGpus], placement: Placement, what: str) -> None:
    """Mark the placed GPUs held, so that one pass of the queue never gives a GPU twice."""
    machine = picture[placement.machine]
    for index in placement.gpus:
        machine.hold(index, Holder(what))


def reserve(recipe: Trainer, picture: Mapping[str, MachineGpus], what: str) -> None:
    """Keep what the first waiting job waits for from every job behind it: its free GPUs now (a recipe with numbers),
    or the free GPUs that fit on the machine closest to having enough (a recipe by need)."""
    if recipe.need is None:
        machine = picture.get(recipe.machine)
        if machine is not None:
            for index in recipe.gpus:
                if machine.free(index):
                    machine.hold(index, Holder(what))
        return
    need = recipe.need
    best: tuple[int, MachineGpus, list[int]] | None = None
    for name in need.machines or list(picture):
        machine = picture.get(name)
        if machine is None or not machine.online:
            continue
        fitting, _ = _fits(need, machine)
        if len(fitting) < need.gpus:
            continue
        free = [i for i in fitting if machine.free(i)]
        if best is None or len(free) > best[0]:
            best = (len(free), machine, free[: need.gpus])
    if best is not None:
        for index in best[2]:
            best[1].hold(index, Holder(what))
