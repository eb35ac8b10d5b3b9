"""A topology's sidecars on shared CPUs priced from the profile's capacity ramp (pure; issue
#20, set 11): the decision (:func:`priced_from_ramp`, one rule for ``meshtax predict`` and the
validation's topologies) and the price (:func:`ramp_price`), with what it did, for the report.
Split from :mod:`meshtax.predict.stations`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import numpy as np

from meshtax.model.ecg import EcgBatch
from meshtax.model.profile import ModeProfile
from meshtax.predict.engine import ProfileLookup
from meshtax.predict.load_factor import SHAPE_BELOW, closed_loop, closed_loop_us, ramp_sidecar_us
from meshtax.predict.ramp_queue import bounded_by_ramp
from meshtax.predict.rates import graph_rates, row_weights, sidecar_rates
from meshtax.predict.stations import FloatArray, TailOptions, crossings

__all__ = [
    "RAMP_SHAPE",
    "RampPrice",
    "closed_loop_scale",
    "own_shape",
    "priced_from_ramp",
    "ramp_price",
]

#: the ramp price below a quarter of the closed loop's rate R: u_R × a × (rate ÷ R)^b —
#: fitted on sets 10–12's three profiles' pooled ramp runs at ≤ R/4 (12 runs), whose low runs
#: moved 2.3× between sittings while the closed loop moved ≤ 15 %; held on set 13 (BENCHMARKS.md)
RAMP_SHAPE = (1.377, -0.355)

#: the fewest distinct fixed rates at ≤ R/4 a profile's own shape is fitted on
OWN_SHAPE_RATES = 3


def own_shape(mp: ModeProfile | None) -> tuple[float, float] | None:
    """The ramp shape (a, b) of this profile's own ramp: the least-squares line of log(u ÷ u_R)
    on log(rate ÷ R) over its fixed-rate runs through the sidecar at ≤ a quarter of the closed
    loop's rate R (with ``Capacity.repeats`` at those rates; u: each run's sidecar CPU-µs a
    request, u_R the closed loop's). None without a closed loop, with fewer than
    :data:`OWN_SHAPE_RATES` distinct rates there, or when the fit does not fall with the rate
    (b > 0) — then :data:`RAMP_SHAPE` prices.

    Why (issue #20, set 19, seen): :data:`RAMP_SHAPE` was fitted on another VM's profiles (the
    sidecar 4–6× faster); on set 19's profile its value at R/4 is 2.27 u_R where the profile's
    own run there measured 1.43, and it priced Bookinfo's sidecars 1.43× what they used at 90 %
    load (the profile's own fit 0.81 × f^−0.48: 1.12×). The form carries between machines; its
    constants are the machine's, and a fit over the 4–6 runs there is steadier than any one."""
    top = closed_loop(mp) if mp is not None else None
    cap = mp.capacity if mp is not None else None
    if top is None or cap is None:
        return None
    rc, uc = top
    low = [
        p
        for p in (*cap.points, *cap.repeats)
        if p.meshed
        and 0 < p.target <= SHAPE_BELOW * rc * 1.02
        and p.achieved > 0
        and p.sidecar_cpu > 0
    ]
    if len({round(p.target) for p in low}) < OWN_SHAPE_RATES or uc <= 0:
        return None
    x = np.log([p.achieved / rc for p in low])
    y = np.log([p.sidecar_cpu / p.achieved * 1e6 / uc for p in low])
    b, log_a = np.polyfit(x, y, 1)
    if not (np.isfinite(b) and np.isfinite(log_a)) or b > 0:
        return None
    return float(np.exp(log_a)), float(b)


def _shape_of(mp: ModeProfile | None, opts: TailOptions) -> tuple[float, float] | None:
    """The shape a mode's ramp price reads below R/4: the profile's own (``ramp_own_shape``)
    where it has one, else ``opts.ramp_shape``."""
    own = own_shape(mp) if opts.ramp_own_shape and opts.ramp_shape is not None else None
    return own or opts.ramp_shape


@dataclass(frozen=True)
class RampPrice:
    """What the ramp price did to a tail prediction: ``used`` or not, ``scale`` (× every
    crossing's latency and CPU; 1 when not used) and ``note``, one sentence saying which and
    why (a report lists it with the model's assumptions)."""

    used: bool
    scale: float
    note: str

    def to_dict(self) -> dict[str, object]:
        return {"used": self.used, "scale": self.scale, "note": self.note}


def priced_from_ramp(opts: TailOptions) -> TailOptions:
    """``opts`` for a topology: on shared CPUs with a capacity ramp in the profile, each sidecar
    priced at what the profile's own sidecar used on the ramp at its own rate (``ramp_price``;
    :func:`ramp_price` says whether it could be).

    Why here: ``meshtax predict`` (``app.tail``) and the validation's topologies
    (``validate.tail_run.topology_options``) predict with the same model; adopted by a rule
    registered before set 11 and held there (Bookinfo's p90/p99 error 38 % / 38 % against
    77 % / 138 % with a cost scale fitted on a measured level). The validation's one hop is
    the profile's own bed and keeps the models' price. Below a quarter of the closed loop's
    rate the price is read from a shape × the closed loop's (registered before set 13 as
    ``s13-ramp-shape`` and held there): since set 20 the profile's own (:func:`own_shape`, fitted
    on its ramp's runs there; registered before set 20 as ``s20-own-shape`` and held there),
    :data:`RAMP_SHAPE` only for a profile without enough runs there; the ramp price's note
    says which."""
    shape = opts.ramp_shape or RAMP_SHAPE
    return bounded_by_ramp(replace(opts, ramp_price=True, ramp_shape=shape, ramp_own_shape=True))


def ramp_price(batch: EcgBatch, profiles: ProfileLookup, opts: TailOptions) -> RampPrice:
    """On shared CPUs, the factor that makes a request's sidecar work what the profile's own
    sidecar costs at each sidecar's own rate: Σ over sides of the ramp's sidecar CPU per
    request there (:func:`~meshtax.predict.load_factor.ramp_sidecar_us`), at the sides'
    rates, ÷ the models' price of the same work (the crossings at the shared CPU's rate × the
    load factor at the own rate, ``cost_scale`` 1). Not used (scale 1) without shared CPUs,
    without a ramp for every meshed mode, or without sidecar work.

    Why (issue #20): the models price a topology's message at the shared CPU's rate (warmer)
    and then discount it again by the load factor at the sidecar's own rate; Bookinfo's
    sidecars used 1.7–2.2× that and 0.85–1.00× the ramp at their own rates (set 10). Chosen
    after set 10 and held on a fresh set 11 (BENCHMARKS.md), it replaces a cost scale fitted
    on a measured level of the topology."""
    models = "the sidecars keep the cost models' price × the load factor"
    if opts.pod_cpus is None:
        return RampPrice(False, 1.0, f"not used: the pods do not share CPUs, {models}")
    if batch.n_invocations == 0:
        return RampPrice(False, 1.0, f"not used: no calls, {models}")
    shapes: dict[int, tuple[float, float] | None] = {}  # per mode profile priced, once

    def price(mp: ModeProfile, rates: FloatArray) -> FloatArray | None:
        if id(mp) not in shapes:
            shapes[id(mp)] = _shape_of(mp, opts)
        return ramp_sidecar_us(mp, rates, shapes[id(mp)])

    ramp, missing = _sides_us(batch, profiles, opts, price)
    if missing is not None:
        return RampPrice(
            False,
            1.0,
            f"not used: the profile has no capacity ramp for {missing} "
            f"mode (`meshtax profile --capacity` measures one), {models}",
        )
    priced = _models_us(batch, profiles, opts)
    if priced <= 0 or ramp <= 0:
        return RampPrice(False, 1.0, f"not used: no sidecar work to price, {models}")
    scale = ramp / priced
    return RampPrice(
        True,
        scale,
        "used: the sidecars on the shared CPUs cost what the profile's capacity ramp measured "
        f"its sidecar using at each one's own rate (× {scale:.2f} the cost models' price)"
        + _shape_note(shapes.values(), opts.ramp_shape),
    )


def _shape_note(
    shapes: Iterable[tuple[float, float] | None], pooled: tuple[float, float] | None
) -> str:
    """Which shape priced the rates below a quarter of the closed loop's (empty: none): a
    profile's own among the ``shapes`` used, else the ``pooled`` one."""
    if pooled is None:
        return ""
    own = [x for x in shapes if x is not None and x != pooled]
    which = "the profile's own ramp shape" if own else "the pooled shape"
    a, b = own[0] if own else pooled
    return f"; below a quarter of its closed loop's rate, {which} {a:.3f} × (rate ÷ R)^{b:.3f}"


def closed_loop_scale(batch: EcgBatch, profiles: ProfileLookup, opts: TailOptions) -> float:
    """At a closed loop's maximum on shared CPUs (``opts.closed_shape``), the factor that
    makes a request's sidecar work Σ over its sides of
    :func:`~meshtax.predict.load_factor.closed_loop_us` at each sidecar's own rate (the ramp
    shape's exponent through the profile's closed loop) ÷ the models' price of it at the
    queued state (the crossings × the queue factor, as the saturation prices it without);
    1 when not asked, without shared CPUs, a shape, a closed loop for every meshed mode, or
    sidecar work."""
    shape = opts.ramp_shape
    asked = opts.closed_shape and opts.ramp_price
    if not asked or shape is None or opts.pod_cpus is None or batch.n_invocations == 0:
        return 1.0
    b = shape[1]
    closed, missing = _sides_us(batch, profiles, opts, lambda mp, r: closed_loop_us(mp, r, b))
    priced = _models_us(batch, profiles, opts, queued=True)
    if missing is not None or priced <= 0 or closed <= 0:
        return 1.0
    return closed / priced


def _sides_us(
    batch: EcgBatch,
    profiles: ProfileLookup,
    opts: TailOptions,
    price: Callable[[ModeProfile, FloatArray], FloatArray | None],
) -> tuple[float, str | None]:
    """Σ over every sidecar side of its rate × ``price`` at its own rate (CPU-µs per second),
    and the mode with no price (None: every side priced)."""
    own = sidecar_rates(batch, opts.load)
    w = row_weights(batch, opts.load) * batch.rate
    total = 0.0
    for side, specs in ((0, batch.caller_spec), (1, batch.callee_spec)):
        for s, spec in enumerate(batch.specs):
            rows = np.flatnonzero((specs == s) & (own[:, side] > 0))
            if not rows.size:
                continue
            mp = profiles(spec.platform).modes.get(spec.config.mode)
            us = price(mp, own[rows, side]) if mp is not None else None
            if us is None:
                return 0.0, spec.config.mode.value
            total += float((w[rows] * us).sum())
    return total, None


def _models_us(
    batch: EcgBatch, profiles: ProfileLookup, opts: TailOptions, queued: bool = False
) -> float:
    """The models' price of every request's sidecar work (CPU-µs per second, ``cost_scale`` 1):
    the crossings at the shared CPU's rate × the load factor at the own rate (``queued``: ×
    the queue factor of a closed loop at its maximum)."""
    cx = crossings(batch, profiles, replace(opts, cost_scale=1.0), split=not queued, queued=queued)
    work = np.bincount(
        batch.graph_of(), weights=(cx.cpu_req + cx.cpu_resp).sum(axis=1), minlength=batch.n_graphs
    )
    return float((graph_rates(batch, opts.load) * work).sum())
