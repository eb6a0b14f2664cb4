"""How a count reads in the words cetlab says (CLI, console, doctor, errors): `1 machine`, `2 machines`."""

from __future__ import annotations

# nouns whose plural is not the word with an s: a count of them reads right without each caller spelling it
IRREGULAR = {"entry": "entries", "process": "processes", "policy": "policies", "GPU-h": "GPU-h", "bus": "buses"}


def noun(n: int, word: str, many: str | None = None) -> str:
    """The noun as a count of `n` reads: `machine` for 1, `machines` for 0 or 2; `many` where the plural is not `word`
    + s (and not in IRREGULAR)."""
    return word if n == 1 else many or IRREGULAR.get(word, word + "s")


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 checkpoint`, `2 checkpoints`, `0 machines`."""
    return f"{n} {noun(n, word, many)}"
