"""Rotation plans: which models go out, which come in, and which pairs swap on the same GPUs."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Candidate:
    """A model as the planner sees it: where it runs now, or would run, and whether it sleeps there."""

    name: str
    gpus: tuple[int, ...]
    sleeping: bool = False


@dataclass
class Moves:
    swaps: list[tuple[str, str]] = field(default_factory=list)  # (out, in) sharing GPUs
    out: list[str] = field(default_factory=list)  # put to sleep (or stopped)
    up: list[str] = field(default_factory=list)  # brought up on their own GPUs

    def empty(self) -> bool:
        return not (self.swaps or self.out or self.up)


def plan_moves(up: list[Candidate], target: set[str], pinned: set[str], rest: list[Candidate]) -> Moves:
    """Moves from the models up now to the target set; pinned models never go out.

    A model coming in takes the GPUs of one going out when it can: a sleeping model only
    on the GPUs it sleeps on, a cold one on any set of the same size. Unpaired models
    go out or come up on their own.
    """
    outs = [c for c in up if c.name not in target and c.name not in pinned]
    up_names = {c.name for c in up}
    ins = [c for c in rest if c.name in target and c.name not in up_names]
    moves = Moves()
    for incoming in ins:
        match = None
        for outgoing in outs:
            if incoming.sleeping:
                if set(incoming.gpus) <= set(outgoing.gpus):
                    match = outgoing
                    break
            elif len(outgoing.gpus) == len(incoming.gpus):
                match = outgoing
                break
        if match is None:
            moves.up.append(incoming.name)
        else:
            outs.remove(match)
            moves.swaps.append((match.name, incoming.name))
    moves.out = [c.name for c in outs]
    return moves
