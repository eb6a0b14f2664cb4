"""Where a model's VRAM need fits in the lab: on one GPU, split evenly over several of one machine, or nowhere.

One rule for `cetlab models`, the console's swap picker and anything else that says it. A model split over GPUs
takes an even share of each (the agent's placement divides the need by the GPU count), so k GPUs hold it when the
smallest of them holds a k-th. Judged against each GPU's total memory: what is free now is placement's business.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

GIB = 1024**3


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def gpu_ranges(indices: Iterable[int]) -> str:
    """GPU indices as runs: [1, 2, 3, 4, 6] -> "1-4,6"."""
    runs: list[list[int]] = []
    for i in sorted(set(indices)):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ",".join(map(str, r)) for r in runs)


def split_over(need: int, totals: Mapping[int, int]) -> list[int] | None:
    """The fewest GPUs of one machine that hold ``need`` in even shares (the largest first); None when all cannot."""
    ranked = sorted(totals.items(), key=lambda item: (-item[1], item[0]))
    for k in range(1, len(ranked) + 1):
        if ranked[k - 1][1] * k >= need:
            return sorted(index for index, _ in ranked[:k])
    return None


def where_fits(need: int | None, gpus: Mapping[str, Mapping[int, int]]) -> str:
    """``gpus``: each machine's GPUs, index -> total bytes. "fits on m5 GPU 1-4, irina GPU 0", or "needs 42.0 GiB: no
    single GPU; split over m5 GPU 1-4", or why it fits nowhere; "" when the need is unknown."""
    if not need:
        return ""
    reported = {m: g for m, g in sorted(gpus.items()) if g}
    if not reported:
        return f"needs {gib(need)}: no machine has reported its GPUs yet"
    single = {m: [i for i, total in g.items() if total >= need] for m, g in reported.items()}
    places = [f"{m} GPU {gpu_ranges(found)}" for m, found in single.items() if found]
    if places:
        return f"fits on {', '.join(places)}"
    splits = {m: split_over(need, g) for m, g in reported.items()}
    fewest = min((len(s) for s in splits.values() if s), default=None)
    if fewest is not None:
        over = [f"{m} GPU {gpu_ranges(s)}" for m, s in splits.items() if s and len(s) == fewest]
        return f"needs {gib(need)}: no single GPU; split over {' or '.join(over)}"
    largest = max(reported.items(), key=lambda item: sum(item[1].values()))
    return (
        f"needs {gib(need)}: more than any machine's GPUs together "
        f"(the most: {largest[0]}, {len(largest[1])} GPUs, {gib(sum(largest[1].values()))})"
    )
