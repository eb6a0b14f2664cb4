"""The states of jobs and models, with the named sets every reader uses instead of spelling them again."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal


class JobState(StrEnum):
    """A trainer job: starting → running → stopping → exited | failed | lost."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    EXITED = "exited"  # ended with exit code 0, or stopped on request
    FAILED = "failed"  # ended with a non-zero exit code, or could not start
    LOST = "lost"  # its runner vanished without recording an exit code (killed, reboot)

    @property
    def active(self) -> bool:
        return self in JOB_ACTIVE


# A job in these states is alive, holds its GPUs and may be stopped.
JOB_ACTIVE: frozenset[JobState] = frozenset({JobState.STARTING, JobState.RUNNING, JobState.STOPPING})
JOB_HOLDS_GPU = JOB_ACTIVE
JOB_ENDED: frozenset[JobState] = frozenset(JobState) - JOB_ACTIVE

# A node of a multi-node job, as its coordinator sees it: its job's state there, or offline while its agent does not answer.
NODE_OFFLINE: Literal["offline"] = "offline"
NodeState = JobState | Literal["offline"]


class ModelState(StrEnum):
    """A model of the pool: cold → cached → loading → warming → warm ⇄ sleeping; any → failed."""

    COLD = "cold"  # on disk only
    CACHED = "cached"  # weights resident in the page cache
    LOADING = "loading"  # engine starting (or waking)
    WARMING = "warming"  # healthy, warm-up request running
    WARM = "warm"  # serving
    SLEEPING = "sleeping"  # vLLM sleep: weights in host RAM, GPU memory given back
    FAILED = "failed"  # the engine died or never became healthy


# The model's GPUs are taken (a sleeping engine has given them back).
MODEL_HOLDS_GPU: frozenset[ModelState] = frozenset({ModelState.LOADING, ModelState.WARMING, ModelState.WARM})
# An engine process exists: it holds its weights (and a served checkpoint) even while asleep.
MODEL_ENGINE_UP: frozenset[ModelState] = MODEL_HOLDS_GPU | {ModelState.SLEEPING}
# On the way up: a cancelled or failed operation stops a model in these states.
MODEL_BRINGING_UP: frozenset[ModelState] = frozenset({ModelState.LOADING, ModelState.WARMING})
# No engine: the model rests on disk or in the page cache.
MODEL_AT_REST: frozenset[ModelState] = frozenset({ModelState.COLD, ModelState.CACHED})
# No operation in flight can leave a model in these states half-way.
MODEL_SETTLED: frozenset[ModelState] = frozenset(ModelState) - MODEL_BRINGING_UP
