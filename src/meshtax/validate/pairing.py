"""Paired no-mesh/mesh runs until the overhead's interval is tight, on the one paired-run loop
(:func:`~meshtax.testbed.paired.paired_runs`; runs are injected).

The two deployments run side by side and are driven in turn, the order alternating every pair
(no mesh first, then mesh first, …), so slow drift of a shared machine lands on both sides of a
difference equally. Repetition stops when the median of the paired latency *and* CPU
differences both have a 95 % interval narrower than ``rel_halfwidth`` of the median (from
``min_rounds`` pairs on), or at ``max_rounds``, or when the next pair would overrun ``budget_s``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from meshtax.testbed.paired import Paired, PairPolicy, paired_runs
from meshtax.validate.result import RunSample, overheads

__all__ = ["measure_pairs"]

Side = str  # "no_mesh" | "mesh"


def _narrow(p: Paired[RunSample], rel: float) -> bool:
    o = overheads(p.pairs("no_mesh", "mesh"))
    return all(o[k].coverage >= 0.95 and o[k].rel_halfwidth <= rel for k in ("p50", "cpu"))


def measure_pairs(
    run: Callable[[Side], RunSample],
    policy: PairPolicy = PairPolicy(6, 12, 120.0),
    rel_halfwidth: float = 0.10,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[tuple[RunSample, RunSample]], str]:
    """Pairs (no mesh, mesh) and why repetition stopped (``narrow``, ``max_rounds``,
    ``budget``)."""
    p = paired_runs(
        [("no_mesh", "mesh")],
        run,
        policy,
        narrow=lambda r: _narrow(r, rel_halfwidth),
        clock=clock,
    )
    return p.pairs("no_mesh", "mesh"), p.stop
