"""A plain, obviously-correct critical-path computation, used only to check the numba kernel.

Same semantics as :mod:`meshtax.predict.critical_path` (its docstring), written as direct
recursion over Python lists: no sorting tricks, no arrays, no sharing of work.
"""

from __future__ import annotations

from collections.abc import Sequence


def _precedes(a: int, c: int, start: Sequence[float], end: Sequence[float]) -> bool:
    """a happens before its sibling c: a ended by the time c started; zero-length calls at
    one instant are ordered by (start, end, row)."""
    return end[a] <= start[c] and (start[a], end[a], a) < (start[c], end[c], c)


def graph_latency(
    parent: Sequence[int], start: Sequence[float], dur: Sequence[float], extra: Sequence[float]
) -> tuple[float, float]:
    """(mesh-free latency, latency with ``extra`` added to every call) of one graph; ``parent``
    holds local indices, -1 for roots (children of a virtual client)."""
    n = len(parent)
    end = [start[i] + dur[i] for i in range(n)]
    kids: dict[int, list[int]] = {i: [] for i in range(-1, n)}
    for i, p in enumerate(parent):
        kids[p].append(i)

    def W(c: int) -> float:
        sibs = kids[parent[c]]
        preds = [a for a in sibs if a != c and _precedes(a, c, start, end)]
        delay = max(end[a] + W(a) for a in preds) - max(end[a] for a in preds) if preds else 0.0
        return delay + extra[c] + inner(c)

    def inner(i: int) -> float:
        ch = kids[i]
        if not ch:
            return 0.0
        return max(end[c] + W(c) for c in ch) - max(end[c] for c in ch)

    roots = kids[-1]
    t0 = min(start[r] for r in roots)
    base = max(end[r] for r in roots) - t0
    new = max(end[r] + W(r) for r in roots) - t0
    return base, new
