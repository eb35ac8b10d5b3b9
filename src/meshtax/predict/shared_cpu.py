"""Pricing sidecars whose pods share CPUs (pure): the rate each message is priced at.

Per-message CPU depends on how busy the CPU is: a sidecar alone at 100 requests/s wakes a
cold, idle CPU for every message, at 1 000/s it finds it warm (the profile's rate models:
CPU per message against rate, measured from 100/s up to the maximum). The profile measured
one sidecar whose CPU sees ``2·r`` crossings per second at request rate ``r``. On ``k`` shared
CPUs every crossing of the graph lands on them, so each message is priced at the one-hop rate
that loads a CPU alike: ``r_eff = Σ crossings/s of the graph / (2·k)`` (:func:`shared_cpu_rates`)
— the CPU's utilisation, in the profile's own units. Nothing is fitted to an application.

Measured against the alternatives (BENCHMARKS.md, "Shared CPUs", issue #14): pricing each
sidecar at its own rate with an exponent fitted on chains of 1–8 services (``meshtax
calibrate``, removed) over-predicted the validation suite's hold-out set by +71 % (latency)
and +75 % (CPU); pricing at its own rate times the cost ratio measured with independently
loaded neighbour sidecars (``experiments/crowding.py``) by +49 % / +51 %; this pricing came
within −8 % / −5 %. In an app, a request crosses its sidecars back to back, so the CPU stays
as warm as its total traffic makes it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from meshtax.model.ecg import EcgBatch

__all__ = ["shared_cpu_rates"]

FloatArray = npt.NDArray[np.float64]


def shared_cpu_rates(batch: EcgBatch, pod_cpus: int, *, also: EcgBatch | None = None) -> FloatArray:
    """Per row, the one-hop request rate that loads a CPU as the row's graph loads its
    ``pod_cpus`` shared CPUs: Σ over the graph of crossings × rate, ÷ (2 · pod_cpus).
    ``also``: the same rows' further crossings (another architecture's waypoints)."""
    if pod_cpus < 1:
        raise ValueError(f"pod_cpus must be at least 1, got {pod_cpus}")
    sides = (batch.caller_spec >= 0).astype(np.float64) + (batch.callee_spec >= 0)
    if also is not None:
        sides = sides + (also.caller_spec >= 0) + (also.callee_spec >= 0)
    g = batch.graph_of()
    per_s = np.bincount(
        g, weights=2.0 * sides * batch.rate, minlength=batch.n_graphs
    )  # crossings/s
    r = per_s[g] / (2.0 * pod_cpus)
    # a row of a graph without any sidecar has no crossing to price: keep its own rate
    return np.asarray(np.where(r > 0, r, batch.rate), dtype=np.float64)
