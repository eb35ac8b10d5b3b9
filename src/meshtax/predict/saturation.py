"""Where each queue of the tail model saturates (pure): the rate factor at which a station's
utilisation reaches the threshold and 1, with the cost models re-priced at the scaled rates on
a log grid and interpolated in log–log (ρ is a rate times a cost that varies with log rate),
the first station's crossing bisected inside its grid step; the vCPU each needs at the given
rates to stay under the threshold. Split from :mod:`meshtax.predict.stations` (its loads)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from meshtax.model.ecg import EcgBatch
from meshtax.predict.engine import ProfileLookup
from meshtax.predict.ramp_price import closed_loop_scale
from meshtax.predict.stations import (
    StationLoad,
    Stations,
    TailOptions,
    crossings,
    station_mix,
    stations,
)

FloatArray = npt.NDArray[np.float64]

__all__ = ["FACTORS", "factors", "loads"]


#: rate factors the utilisation is evaluated at to find where it crosses the threshold
FACTORS = np.logspace(-3, 3, 25)


def _rho_at(
    batch: EcgBatch, profiles: ProfileLookup, opts: TailOptions, f: float, queued: bool = False
) -> FloatArray:
    scaled = replace(batch, rate=batch.rate * f)
    if queued:  # the closed loop at the shape through the profile's, when asked (else 1)
        opts = replace(opts, cost_scale=opts.cost_scale * closed_loop_scale(scaled, profiles, opts))
    cx = crossings(scaled, profiles, opts, split=False, queued=queued)
    sts = stations(scaled, profiles, cx, opts)
    out = np.zeros(len(sts.names))
    for k in range(len(sts.names)):
        got = station_mix(sts, k, 1.0)
        if got is not None:
            out[k] = got[0] * got[1].mean() * 1e-6 / sts.servers[k]
    return out


def _crossing(grid: FloatArray, level: float) -> float:
    """The rate factor at which a utilisation curve on :data:`FACTORS` reaches ``level``
    (log–log interpolation between the grid points around it; beyond the grid, in proportion
    to the rate, as costs are flat outside the profiled rates; inf: no load at all)."""
    if grid.max() <= 0:
        return math.inf
    above = np.flatnonzero(grid >= level)
    if above.size == 0:
        return float(FACTORS[-1] * level / grid[-1])
    j = int(above[0])
    if j == 0:
        return float(FACTORS[0] * level / grid[0])
    x0, x1 = math.log(FACTORS[j - 1]), math.log(FACTORS[j])
    y0, y1 = math.log(max(grid[j - 1], 1e-300)), math.log(grid[j])
    t = (math.log(level) - y0) / (y1 - y0) if y1 != y0 else 1.0
    return float(math.exp(x0 + t * (x1 - x0)))


def factors(
    batch: EcgBatch, profiles: ProfileLookup, opts: TailOptions, sts: Stations
) -> dict[float, list[float]]:
    """Per level (``opts.threshold`` and 1), each station's rate factor at which its
    utilisation reaches it. The threshold is reached at the costs of the rates (the load
    factor at each sidecar's own rate); saturation (ρ = 1) at the costs of the closed-loop
    maximum, where every client's request is queued (:func:`queued_factor`)."""
    at: dict[float, list[float]] = {}
    for level, queued in ((opts.threshold, False), (1.0, True)):
        grid = np.stack([_rho_at(batch, profiles, opts, float(f), queued) for f in FACTORS])
        xs = [_crossing(grid[:, k], level) for k in range(len(sts.names))]
        finite = [k for k, x in enumerate(xs) if FACTORS[0] < x < FACTORS[-1]]
        if finite:  # the first station to get there, exactly
            k = min(finite, key=lambda j: xs[j])
            xs[k] = _refined(batch, profiles, opts, k, level, xs[k], queued)
        at[level] = xs
    return at


def loads(
    batch: EcgBatch,
    profiles: ProfileLookup,
    opts: TailOptions,
    sts: Stations,
    waits: tuple[FloatArray, FloatArray, FloatArray],
    at: dict[float, list[float]] | None = None,
) -> tuple[StationLoad, ...]:
    """Each station's load, and the rate factors at which it reaches the threshold and
    saturates (:func:`factors`, unless given as ``at``); ``waits``: per station its
    utilisation, mean and p99 wait (µs) as simulated."""
    if at is None:
        at = factors(batch, profiles, opts, sts)
    out = []
    for k, name in enumerate(sts.names):
        rho = float(waits[0][k])
        out.append(
            StationLoad(
                name,
                sts.modes[k],
                sts.servers[k],
                float(sts.job_rate[sts.job_station == k].sum()),
                _mean_service(sts, k),
                rho,
                at[opts.threshold][k],
                at[1.0][k],
                rho * sts.servers[k] / opts.threshold,
                float(waits[1][k]),
                float(waits[2][k]),
            )
        )
    return tuple(out)


def _refined(
    batch: EcgBatch,
    profiles: ProfileLookup,
    opts: TailOptions,
    k: int,
    level: float,
    x: float,
    queued: bool = False,
) -> float:
    """Station ``k``'s crossing of ``level`` by bisection in log rate factor inside the grid
    step around ``x`` (the grid's interpolation misses by up to several per cent where costs
    bend with rate)."""
    step = float(FACTORS[1] / FACTORS[0])
    lo, hi = math.log(x / step), math.log(x * step)
    y_lo, y_hi = (float(_rho_at(batch, profiles, opts, math.exp(v), queued)[k]) for v in (lo, hi))
    if not 0 < y_lo < level <= y_hi:
        return x
    for _ in range(REFINE_STEPS):
        mid = (lo + hi) / 2
        y = float(_rho_at(batch, profiles, opts, math.exp(mid), queued)[k])
        lo, y_lo, hi, y_hi = (mid, y, hi, y_hi) if y < level else (lo, y_lo, mid, y)
    # log–log between the last two: exact where the utilisation is a power of the rate
    t = (math.log(level) - math.log(y_lo)) / (math.log(y_hi) - math.log(y_lo))
    return math.exp(lo + t * (hi - lo))


#: bisection steps of a saturation rate inside one grid step (a factor of 1.78): 0.2 %
REFINE_STEPS = 9


def _mean_service(sts: Stations, k: int) -> float:
    got = station_mix(sts, k, 1.0)
    return 0.0 if got is None else got[1].mean()
