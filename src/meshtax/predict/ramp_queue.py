"""The queue the profile's own bed measured, as a bound on a station's modelled queue (pure;
issue #20: ``TailOptions.ramp_queue``, registered before set 12 as the variant
``s12-ramp-cap`` and held there; :func:`bounded_by_ramp` turns it on for ``meshtax predict``
and the validation).

The capacity ramp runs one sidecar at 2–90 % of its closed-loop maximum ``C``, each rate
without the sidecar and through it, and keeps both runs' latency quantiles. At a run's load
fraction ``f = rate / C`` the *queue* it shows at rank ``u`` is its overhead there (meshed −
direct quantile) above the lowest-rate run's (the crossing itself, unloaded), made a
quantile function (non-decreasing in ``u``, at least 0), in units of ``1 / C`` — the time
between completions at capacity, so a queue of so many requests ahead whatever the station's
speed. A station of a graph at load fraction ``f`` (its rate ÷ its predicted saturation rate,
the profile's) waits at most that many of *its* times per request: ``queue(f, u) × 1e6 / S``
µs.

Why (issue #20, sets 10–11): one hop's shared CPUs are priced busy as measured (ρ 0.94–1.00
at 50–90 % load) and the G/G/c queue at that ρ fills with the clients, 1.9–4× the measured
p90/p99 at 50–75 %, while the ramp's own runs at the same rates show the measured tail within
5–13 % (p90). A busy CPU that batches (a sidecar handles every ready event per wake-up) keeps
its queue short: the ramp measures how short, the busy fraction does not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from meshtax.model.capacity import SKETCH_PROBS
from meshtax.model.profile import ModeProfile
from meshtax.predict.stations import TailOptions

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "POOLED_QUEUE",
    "POOL_FRACTIONS",
    "QueueForm",
    "RampQueue",
    "bounded_by_ramp",
    "form_k",
    "pooled_queue",
    "queue_form",
    "ramp_draws",
    "ramp_queue",
]

# the capacity ramp's fixed-rate runs, as fractions of the closed loop (profile/capacity.py)
POOL_FRACTIONS = (0.02, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9)


# This machine's ramps' queue (AMD EPYC VM, 2 vCPUs, Envoy 1.40, http 100 B): the median over
# issue #20's sets 10–17's eight profiles (``pooled_queue``; experiments/tail_pooled_queue.py
# --print-table), registered before set 18 as ``s18-pooled-queue`` and held there. Its form
# (queue in requests' worth against the load fraction) is meant to carry; its values are this
# machine's, as the ramp shape's are.
# one row per fraction, its 16 values at SKETCH_PROBS
# fmt: off
POOLED_QUEUE: tuple[tuple[float, ...], tuple[tuple[float, ...], ...]] = (POOL_FRACTIONS, (
    # at 0.02 of the closed loop
    (0.0000, 0.0000, 0.0006, 0.0006, 0.0015, 0.0020, 0.0020, 0.0020,
     0.0020, 0.0020, 0.0020, 0.0020, 0.0020, 0.0319, 0.1609, 0.3277),
    # at 0.05 of the closed loop
    (0.0002, 0.0028, 0.0238, 0.0254, 0.0606, 0.0805, 0.0828, 0.0838,
     0.0871, 0.0923, 0.1016, 0.1097, 0.1097, 1.1466, 5.8704, 12.1440),
    # at 0.1 of the closed loop
    (0.0139, 0.1691, 0.2412, 0.3049, 0.3597, 0.4648, 0.5250, 0.5630,
     0.7619, 0.8987, 1.5080, 2.2053, 2.8977, 3.0032, 13.5187, 13.8593),
    # at 0.25 of the closed loop
    (0.0000, 0.0000, 0.1719, 0.3217, 0.4962, 0.7281, 1.0394, 2.2839,
     2.8191, 3.0882, 3.1916, 3.2566, 4.1345, 5.5895, 7.7115, 7.8621),
    # at 0.5 of the closed loop
    (0.0002, 0.0063, 0.0172, 0.1131, 0.1630, 0.2243, 0.3139, 0.3951,
     0.5196, 0.6155, 1.0634, 1.5898, 2.2640, 9.9374, 43.9563, 69.9538),
    # at 0.75 of the closed loop
    (0.0708, 1.5601, 2.6437, 3.2654, 4.0135, 4.4981, 4.8856, 5.2718,
     5.8232, 6.6078, 7.8101, 10.2024, 16.2799, 23.8280, 52.3401, 54.0331),
    # at 0.9 of the closed loop
    (0.4151, 4.1312, 5.6824, 6.7355, 8.7033, 10.3532, 11.6582, 13.1487,
     15.8386, 19.8414, 24.5403, 28.8848, 34.7184, 44.2421, 66.3457, 106.5682),
))
# fmt: on


@dataclass(frozen=True)
class RampQueue:
    """The ramp's queue: ``fractions`` (each fixed-rate run's rate ÷ the closed-loop maximum,
    ascending), ``probs`` (the quantiles kept) and ``queue`` (runs × probs: the queue at each,
    in requests' worth — units of 1 / the closed-loop maximum)."""

    fractions: FloatArray
    probs: FloatArray
    queue: FloatArray
    #: how many draws each row is the median of (empty: one each, or a pooled table)
    draws: tuple[int, ...] = ()

    def at(self, fraction: float, u: npt.ArrayLike, heavy: bool = False) -> FloatArray:
        """The queue (requests' worth) at load fraction ``fraction`` and ranks ``u``:
        linear between the runs in the fraction (``heavy``: in 1 ÷ (1 − fraction), as a
        queue grows near saturation), 0 below the first, held beyond the last."""
        f = float(np.clip(fraction, self.fractions[0], self.fractions[-1]))
        j = int(np.searchsorted(self.fractions, f, side="right")) - 1
        j = min(max(j, 0), len(self.fractions) - 1)
        row = self.queue[j]
        if j + 1 < len(self.fractions):
            a, b = self.fractions[j], self.fractions[j + 1]
            t = (f - a) / (b - a)
            if heavy and b < 1.0:  # ρ/(1 − ρ)-like growth: 1/(1 − f) is its linear coordinate
                t = (1 / (1 - f) - 1 / (1 - a)) / (1 / (1 - b) - 1 / (1 - a))
            row = row + t * (self.queue[j + 1] - row)
        return np.asarray(np.interp(np.asarray(u, dtype=np.float64), self.probs, row))

    def table(self) -> tuple[tuple[float, ...], tuple[tuple[float, ...], ...]]:
        """``(fractions, queue rows)`` as tuples (at ``SKETCH_PROBS``): a frozen option's value."""
        return tuple(map(float, self.fractions)), tuple(tuple(map(float, r)) for r in self.queue)

    @classmethod
    def from_table(
        cls, table: tuple[tuple[float, ...], tuple[tuple[float, ...], ...]]
    ) -> RampQueue:
        """The queue of :meth:`table`'s ``(fractions, rows)``, at ``SKETCH_PROBS``."""
        fractions, rows = table
        probs = np.asarray(SKETCH_PROBS, dtype=np.float64)
        queue = np.asarray(rows, dtype=np.float64)
        if queue.shape != (len(fractions), probs.size) or len(fractions) < 2:
            raise ValueError(f"a ramp queue table needs ≥ 2 rows of {probs.size} quantiles")
        return cls(np.asarray(fractions, dtype=np.float64), probs, queue)


def pooled_queue(
    queues: list[RampQueue], fractions: tuple[float, ...] = POOL_FRACTIONS
) -> RampQueue:
    """The median over ``queues`` of each one's queue at each of ``fractions`` and each kept
    quantile (requests' worth: already in units of each ramp's closed loop). One 2 s run a
    fraction moves 2–3× between profiles at 0.75–0.9 of the closed loop (issue #20, sets
    10–17) while the validation's levels there move ≤ 1.5×; the median of the runs is the
    steadier reading. Pointwise medians of non-decreasing rows stay non-decreasing."""
    if not queues:
        raise ValueError("no ramp queues to pool")
    probs = queues[0].probs
    stack = np.stack([np.stack([q.at(f, probs) for f in fractions]) for q in queues])
    return RampQueue(np.asarray(fractions, dtype=np.float64), probs, np.median(stack, axis=0))


def ramp_draws(mp: ModeProfile, repeats: bool = False) -> list[list[tuple[float, FloatArray]]]:
    """Every draw of the ramp's queue, per fixed rate (ascending), as ``(load fraction, queue
    row)`` (requests' worth, as :func:`ramp_queue`'s rows): one per fixed-rate run through the
    sidecar with its run without it at the same target, and with ``repeats`` one more per
    repeated pair (``Capacity.repeats``: the run without the sidecar, then the one through
    it). The lowest rate's overhead (the median over its draws) is every row's floor. Empty
    without a closed loop or without two rates that have both sides' quantiles."""
    cap = mp.capacity
    if cap is None or cap.requests_per_s <= 0:
        return []
    n = len(SKETCH_PROBS)
    direct = {p.target: p for p in cap.points if not p.meshed and p.target > 0}
    pairs = [(direct.get(p.target), p) for p in cap.points if p.meshed]
    if repeats:
        rep = cap.repeats
        pairs += [(d, m) for d, m in zip(rep, rep[1:]) if not d.meshed and m.meshed]
    by_target: dict[float, list[tuple[float, FloatArray]]] = {}
    for d, m in pairs:
        if (
            d is None
            or d.target != m.target
            or m.achieved <= 0
            or len(m.quantiles_us) != n
            or len(d.quantiles_us) != n
        ):
            continue
        ov = np.asarray(m.quantiles_us) - np.asarray(d.quantiles_us)
        by_target.setdefault(m.target, []).append((m.achieved, ov))
    if len(by_target) < 2:
        return []
    groups = sorted(by_target.values(), key=lambda g: float(np.median([a for a, _ in g])))
    floor = np.median(np.stack([ov for _, ov in groups[0]]), axis=0)  # the crossing itself
    unit = cap.requests_per_s * 1e-6
    return [
        [
            (a / cap.requests_per_s, np.maximum.accumulate(np.maximum(ov - floor, 0.0)) * unit)
            for a, ov in g
        ]
        for g in groups
    ]


def ramp_queue(mp: ModeProfile, repeats: bool = False) -> RampQueue | None:
    """The queue of ``mp``'s capacity ramp (see the module docstring); None without a closed
    loop or without two fixed-rate runs that have both sides' quantiles. With ``repeats`` a
    rate the ramp measured more than once (``Capacity.repeats``) reads the median of its
    draws' queues at each rank, at the median of their load fractions (issue #20, set 19:
    one 2 s run near saturation is a noisy draw)."""
    groups = ramp_draws(mp, repeats)
    if not groups:
        return None
    fractions = np.array([float(np.median([f for f, _ in g])) for g in groups])
    queue = np.stack([np.median(np.stack([r for _, r in g]), axis=0) for g in groups])
    probs = np.asarray(SKETCH_PROBS, dtype=np.float64)
    return RampQueue(fractions, probs, queue, tuple(len(g) for g in groups))


#: the queue form's fit: the ramp's draws at ≥ this fraction of the closed loop (its runs at
#: half the closed loop and above: those at 0.5 achieve 0.49–0.50), ranks in
#: [FORM_RANKS[0], FORM_RANKS[1]] (the 0.999 and 1.0 ranks are single requests), and at least
#: FORM_DRAWS such draws — else the form is not the profile's and the table bounds
FORM_FROM = 0.45
FORM_RANKS = (0.5, 0.99)
FORM_DRAWS = 3


@dataclass(frozen=True)
class QueueForm:
    """A queue in requests' worth, ``k × f ÷ (1 − f) × −ln(1 − u)`` at load fraction ``f``
    (held beyond ``top``, the highest fraction it was fitted on) and rank ``u`` (held beyond
    0.999): a single-server queue's heavy-traffic wait (exponential, mean ∝ ρ ÷ (1 − ρ)) with
    one constant ``k`` from ``draws`` of the profile's own ramp."""

    k: float
    top: float
    draws: int

    def queue(self, fractions: FloatArray, probs: FloatArray) -> FloatArray:
        """fractions × probs: the form's queue (requests' worth)."""
        f = np.clip(fractions, 0.0, self.top)
        g = -np.log1p(-np.minimum(probs, 0.999))
        return np.asarray(self.k * np.outer(f / (1 - f), g), dtype=np.float64)

    def ramp(self, steps: int = 90) -> RampQueue:
        """The form as a :class:`RampQueue` on ``steps`` even fractions up to ``top``."""
        fractions = np.linspace(0.0, self.top, steps + 1)
        probs = np.asarray(SKETCH_PROBS, dtype=np.float64)
        return RampQueue(fractions, probs, self.queue(fractions, probs))


def queue_form(mp: ModeProfile | None) -> QueueForm | None:
    """The profile's own queue form (:class:`QueueForm`): ``k`` the least-squares constant
    through the origin of every draw of its ramp's queue (:func:`ramp_draws`, with the
    repeats) at ≥ :data:`FORM_FROM` of the closed loop, over its ranks in :data:`FORM_RANKS`
    — one number from all of them, no table. None with fewer than :data:`FORM_DRAWS` such
    draws or without a positive fit (then :data:`POOLED_QUEUE` bounds).

    Why (issue #20, sets 19–20, seen): one 2 s draw at 0.75–0.9 moves 2–17× within a minute
    (set 19: the median of three per cell no steadier), while the pooled table came from
    another VM. The form fits that table with k 1.30 and set 19's and set 20's own draws
    (this machine, 4–6× slower) with k 1.28 and 1.43: the form carries, its one constant is
    read from all the profile's top draws at once. Registered before set 21 as
    ``s21-queue-form`` and not held there: that profile's top runs mostly fell short of their
    rate (saturated) and, fitted at their achieved fractions, gave k 4.35."""
    if mp is None:
        return None
    draws = [(f, row) for g in ramp_draws(mp, repeats=True) for f, row in g if FORM_FROM <= f < 1]
    if len(draws) < FORM_DRAWS:
        return None
    k = form_k(draws)
    if not np.isfinite(k) or k <= 0:
        return None
    return QueueForm(k, max(f for f, _ in draws), len(draws))


def form_k(draws: list[tuple[float, FloatArray]]) -> float:
    """The least-squares constant through the origin of the form k × f/(1 − f) × −ln(1 − u)
    over ``draws`` ((load fraction, queue row at ``SKETCH_PROBS``)), at the ranks in
    :data:`FORM_RANKS` (:func:`queue_form`'s fit; NaN when no draw has a positive load)."""
    probs = np.asarray(SKETCH_PROBS, dtype=np.float64)
    sel = (probs >= FORM_RANKS[0]) & (probs <= FORM_RANKS[1])
    unit = QueueForm(1.0, 0.999, len(draws))
    x = np.concatenate([unit.queue(np.array([f]), probs)[0, sel] for f, _ in draws])
    q = np.concatenate([row[sel] for _, row in draws])
    xx = float((x * x).sum())
    return float((q * x).sum()) / xx if xx > 0 else float("nan")


def bounded_by_ramp(opts: TailOptions) -> TailOptions:
    """``opts`` with the ramp's queue as the bound on the shared CPUs' wait (``ramp_queue``):
    the one rule of ``meshtax predict`` (through
    :func:`~meshtax.predict.ramp_price.priced_from_ramp`) and the validation (one hop:
    ``validate.tail_run.one_hop_options``; topologies: ``topology_options``). Adopted by a rule
    registered before set 12 (BENCHMARKS.md, set 12); read from :data:`POOLED_QUEUE` (the ramps'
    queue pooled over profiles) unless ``opts`` carries a table, since set 18."""
    pooled = POOLED_QUEUE if opts.ramp_pooled is None else opts.ramp_pooled
    return replace(opts, ramp_queue=True, ramp_pooled=pooled)
