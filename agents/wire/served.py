"""Whether a checkpoint is being served: the one answer the console's :checkpoints view and `cetlab checkpoints` give.

The agent's serving record of a checkpoint (``CheckpointInfo.serving``, made in agents/checkpoints/component.py)
carries the state of the model that serves it, or the serve's own step before that model exists:

- ``merging`` (an adapter merged into a copy of its base) and ``converting`` (a PEFT adapter turned into a
  GGUF for llama.cpp): the serve is under way and reads the checkpoint now; an engine comes next;
- ``loading``, ``warming``: the engine is being brought up with the checkpoint's weights;
- ``warm``: the engine answers with them; ``sleeping``: the engine process still holds them (in host RAM)
  and wakes on the next request, so the checkpoint is still the model's;
- ``cold``, ``cached``: the model was stopped; no engine holds the weights (``cached`` only says the files
  are in the page cache, which serves nothing);
- ``unloaded``: an adapter whose engine restarted since: the adapter is gone from it;
- ``failed``: the merge, the conversion or the engine failed; nothing serves it (the error says why).

So a checkpoint is served while an engine holds it or a serve is bringing it up, and not once nothing
does: :data:`SERVED_STATES`. (The console used to call ``failed`` served and the CLI ``cached``.)
"""

from __future__ import annotations

from agents.wire.sections.models import Serving
from agents.wire.states import MODEL_BRINGING_UP, MODEL_ENGINE_UP, ModelState

# The serve's own steps, before the model that will serve the checkpoint is started.
SERVE_PREPARING: frozenset[str] = frozenset({"merging", "converting"})
# An engine holds the checkpoint (loading, warming, warm, sleeping) or a serve is bringing it up.
SERVED_STATES: frozenset[str] = frozenset(MODEL_ENGINE_UP) | SERVE_PREPARING
# On the way up: the state will change without anyone acting (readers poll while a serve is in these).
SERVE_MOVING: frozenset[str] = frozenset(MODEL_BRINGING_UP) | SERVE_PREPARING


def is_served(serving: Serving | None) -> bool:
    """Whether the checkpoint with this serving record is being served (see the module's docstring)."""
    return serving is not None and serving.state in SERVED_STATES


def serve_failed(serving: Serving | None) -> bool:
    """Whether the last serve of the checkpoint failed (nothing serves it; ``serving.error`` says why)."""
    return serving is not None and serving.state == ModelState.FAILED


def serve_moving(serving: Serving | None) -> bool:
    """Whether a serve of the checkpoint is on its way up (merging, converting, loading, warming)."""
    return serving is not None and serving.state in SERVE_MOVING
