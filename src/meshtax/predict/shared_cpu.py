"""Pricing sidecars whose pods share CPUs (pure): at which rate each message is priced, and how
much its neighbours on the CPU change its cost.

Per-message CPU depends on how busy the CPU is (an idle CPU wakes cold for every message), and
the profile measured it with one sidecar whose CPU sees ``2·r`` crossings per second at request
rate ``r``. On ``k`` shared CPUs every crossing of the graph lands on them:
``r_eff = Σ crossings/s of the graph / (2·k)`` is the one-hop rate that loads a CPU alike
(:func:`shared_cpu_rates`); ``r_own``, the sidecar's own traffic (:func:`sidecar_rates`).

Two ways to price a message between them, per sidecar mode, in this order:

1. **Crowding measured by the profiler** (:class:`~meshtax.model.crowding.Crowding`, the
   profile's ``crowding``): the message is priced at its sidecar's own rate ``r_own`` and
   multiplied by the measured cost ratio of a sidecar with neighbours at the sharing
   ``r_eff / r_own``. Nothing is fitted to an application.
2. **The co-location exponent** (``meshtax calibrate``, the profile's ``colocation``):
   ``r_own^(1−α) · r_eff^α``; α = 1 (the CPU's rate alone) for a mode with neither.

An ``alpha`` given by the caller overrides both (the calibration's own fit uses it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from meshtax.model.ecg import EcgBatch
from meshtax.model.profile import Profile

__all__ = [
    "SidePricing",
    "priced_rates",
    "pricing",
    "shared_cpu_rates",
    "side_alphas",
    "sidecar_rates",
]

FloatArray = npt.NDArray[np.float64]
ProfileLookup = Callable[[str | None], Profile]


def shared_cpu_rates(batch: EcgBatch, pod_cpus: int) -> FloatArray:
    """Per row, the one-hop request rate that loads a CPU as the row's graph loads its
    ``pod_cpus`` shared CPUs: Σ over the graph of crossings × rate, ÷ (2 · pod_cpus)."""
    sides = (batch.caller_spec >= 0).astype(np.float64) + (batch.callee_spec >= 0)
    g = batch.graph_of()
    per_s = np.bincount(
        g, weights=2.0 * sides * batch.rate, minlength=batch.n_graphs
    )  # crossings/s
    r = per_s[g] / (2.0 * pod_cpus)
    # a row of a graph without any sidecar has no crossing to price: keep its own rate
    return np.asarray(np.where(r > 0, r, batch.rate), dtype=np.float64)


def sidecar_rates(batch: EcgBatch) -> tuple[FloatArray, FloatArray]:
    """Per row, the one-hop request rate of the caller's and of the callee's sidecar: all the
    crossings/s through that service's sidecar in the row's graph (every call in and out), ÷ 2.
    A side without a sidecar keeps the row's rate (nothing is priced there)."""
    g = batch.graph_of()
    S = max(len(batch.services), 1)
    out = []
    for svc, spec in ((batch.caller, batch.caller_spec), (batch.callee, batch.callee_spec)):
        meshed = (spec >= 0) & (svc >= 0)
        key = np.where(meshed, g * S + svc, -1)
        out.append((key, meshed))
    total = np.zeros(batch.n_graphs * S)
    for key, meshed in out:  # 2 crossings per call at each meshed side
        np.add.at(total, key[meshed], 2.0 * batch.rate[meshed])
    caller, callee = (
        np.where(meshed, total[np.maximum(key, 0)] / 2.0, batch.rate) for key, meshed in out
    )
    return np.asarray(caller, dtype=np.float64), np.asarray(callee, dtype=np.float64)


def side_alphas(batch: EcgBatch, profiles: ProfileLookup) -> tuple[FloatArray, FloatArray]:
    """Per row, the co-location exponent of the caller's and of the callee's sidecar (its
    profile's, for its mode; 1 where there is no sidecar)."""
    per_spec = np.array(
        [profiles(spec.platform).alpha(spec.config.mode) for spec in batch.specs] + [1.0]
    )
    # index -1 (no sidecar) picks the appended 1.0
    return per_spec[batch.caller_spec], per_spec[batch.callee_spec]


def priced_rates(
    batch: EcgBatch, pod_cpus: int, alpha: float | tuple[FloatArray, FloatArray] = 1.0
) -> tuple[FloatArray, FloatArray]:
    """Per row, the rate the caller's and the callee's sidecar price its messages at on
    ``pod_cpus`` shared CPUs: ``r_own^(1−alpha) · r_eff^alpha`` (the module docstring);
    ``alpha`` for every sidecar, or per row for each side."""
    a_caller, a_callee = (
        (np.full(batch.n_invocations, float(alpha)), np.full(batch.n_invocations, float(alpha)))
        if not isinstance(alpha, tuple)
        else alpha
    )
    if ((a_caller < 0) | (a_caller > 1) | (a_callee < 0) | (a_callee > 1)).any():
        raise ValueError(f"alpha must be within [0, 1], got {alpha}")
    eff = shared_cpu_rates(batch, pod_cpus)
    if (a_caller == 1.0).all() and (a_callee == 1.0).all():
        return eff, eff
    own_caller, own_callee = sidecar_rates(batch)
    return own_caller ** (1.0 - a_caller) * eff**a_caller, own_callee ** (
        1.0 - a_callee
    ) * eff**a_callee


@dataclass(frozen=True)
class SidePricing:
    """Per row, the rate each side's sidecar prices its messages at and the factor its cost is
    multiplied by (crowding; 1 where priced by the exponent)."""

    rate_caller: FloatArray
    rate_callee: FloatArray
    factor_caller: FloatArray
    factor_callee: FloatArray
    crowded: bool  # some side used a measured crowding


def pricing(
    batch: EcgBatch, pod_cpus: int, profiles: ProfileLookup, alpha: float | None = None
) -> SidePricing:
    """How every row is priced on ``pod_cpus`` shared CPUs (see the module docstring)."""
    if alpha is not None:
        rc, rd = priced_rates(batch, pod_cpus, alpha)
        one = np.ones(batch.n_invocations)
        return SidePricing(rc, rd, one, one.copy(), False)
    rc, rd = priced_rates(batch, pod_cpus, side_alphas(batch, profiles))
    eff = shared_cpu_rates(batch, pod_cpus)
    own = sidecar_rates(batch)
    crowd = [profiles(spec.platform).crowding.get(spec.config.mode) for spec in batch.specs]
    rates, factors = [rc.copy(), rd.copy()], [np.ones(batch.n_invocations) for _ in range(2)]
    used = False
    for side, spec_col in enumerate((batch.caller_spec, batch.callee_spec)):
        for s, c in enumerate(crowd):
            if c is None:
                continue
            rows = np.flatnonzero(spec_col == s)
            if rows.size == 0:
                continue
            used = True
            rates[side][rows] = own[side][rows]
            factors[side][rows] = c.factor(eff[rows] / own[side][rows])
    return SidePricing(rates[0], rates[1], factors[0], factors[1], used)
