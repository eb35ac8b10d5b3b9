"""Paired no-mesh/mesh runs until the overhead's interval is tight (pure; runs are injected).

The two deployments run side by side and are driven in turn, the order alternating every pair
(no mesh first, then mesh first, …), so slow drift of a shared machine lands on both sides of a
difference equally. Repetition stops when the median of the paired latency *and* CPU
differences both have a 95 % interval narrower than ``rel_halfwidth`` of the median (from 6
pairs on, where the order-statistic interval first reaches 95 %), or at ``max_pairs``, or when
the next pair would overrun ``budget_s``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from meshtax.validate.result import RunSample, overheads

__all__ = ["PairPolicy", "measure_pairs"]

Side = str  # "no_mesh" | "mesh"


@dataclass(frozen=True)
class PairPolicy:
    """How many pairs: at least ``min_pairs``, at most ``max_pairs``, within ``budget_s``."""

    min_pairs: int = 6
    max_pairs: int = 12
    rel_halfwidth: float = 0.10
    budget_s: float | None = 120.0

    def __post_init__(self) -> None:
        if self.min_pairs < 1 or self.max_pairs < self.min_pairs:
            raise ValueError("need 1 <= min_pairs <= max_pairs")


def _narrow(pairs: list[tuple[RunSample, RunSample]], rel: float) -> bool:
    o = overheads(pairs)
    return all(o[k].coverage >= 0.95 and o[k].rel_halfwidth <= rel for k in ("p50", "cpu"))


def measure_pairs(
    run: Callable[[Side], RunSample],
    policy: PairPolicy = PairPolicy(),
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[tuple[RunSample, RunSample]], str]:
    """Pairs (no mesh, mesh) and why repetition stopped (``narrow``, ``max_pairs``, ``budget``)."""
    pairs: list[tuple[RunSample, RunSample]] = []
    t0 = clock()
    longest = 0.0
    while True:
        start = clock()
        order: tuple[Side, Side] = (
            ("no_mesh", "mesh") if len(pairs) % 2 == 0 else ("mesh", "no_mesh")
        )
        got = {side: run(side) for side in order}
        pairs.append((got["no_mesh"], got["mesh"]))
        end = clock()
        longest = max(longest, end - start)
        n = len(pairs)
        if n >= policy.min_pairs and _narrow(pairs, policy.rel_halfwidth):
            return pairs, "narrow"
        if n >= policy.max_pairs:
            return pairs, "max_pairs"
        if (
            n >= policy.min_pairs
            and policy.budget_s is not None
            and (end - t0) + longest > policy.budget_s
        ):
            return pairs, "budget"
