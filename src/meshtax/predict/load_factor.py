"""How much cheaper a sidecar's crossing is when many clients load it (pure): the factor on
a crossing's base CPU from the profile's capacity runs, against the sidecar's own rate
(:func:`load_factor`), against the requests queued at it (:func:`queue_factor`), and with
every client's request queued (:func:`queued_factor`), and as the queue at a sidecar grows
beyond what its rate alone keeps there (:func:`queue_relief`). Used by the tail model's stations
(:mod:`meshtax.predict.stations`)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from meshtax.model.capacity import SKETCH_PROBS, Capacity, CapacityPoint
from meshtax.model.components import BASE_COMPONENTS, UNATTRIBUTED
from meshtax.model.profile import ModeProfile

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "BASE",
    "load_factor",
    "queue_factor",
    "queue_relief",
    "queued_factor",
    "closed_loop",
    "closed_loop_us",
    "ramp_sidecar_us",
]

#: the components a crossing's base CPU is the sum of
BASE = (*BASE_COMPONENTS, UNATTRIBUTED)


#: from this fraction of the closed loop's rate up, ``plateau`` prices the runs at their mean
PLATEAU_FROM = 0.75


def load_factor(mp: ModeProfile, rates: FloatArray, plateau: bool = False) -> FloatArray:
    """Per rate, the factor on a crossing's base CPU when many clients load the sidecar: at
    each capacity run's rate (many clients, up to saturation), its CPU per request ÷ 2 per
    crossing ÷ what the CPU models (one client) price at that rate and the capacity's size;
    1 at the models' lowest profiled rate (requests that never overlap cost what one client's
    do), interpolated in log rate in between, held at the last run's beyond it (1 without
    capacity runs or a rate range). A sidecar kept busy by many clients handles several
    requests per wake-up, which one client at a time never lets it do.

    ``plateau``: the runs at ≥ :data:`PLATEAU_FROM` × the closed loop's rate (the fixed-rate
    ones and the closed loop) are each priced at their mean CPU-seconds a second ÷ its own
    rate — the sidecar's busy CPU measured by several runs, not one. Why (issue #20, set 16):
    one hop's 90 % level was priced from the single 2 s run at 0.9 of the closed loop, 0.52
    CPU-s/s against 0.73 at 0.75 and 0.63 at the closed loop (0.61–0.66 on sets 10–15), ρ
    0.93 where the pods measured 0.99 busy."""
    ones = np.ones_like(rates, dtype=np.float64)
    cap = mp.capacity
    models = [mp.components[c].cpu for c in BASE if c in mp.components]
    lows = [m.rate_lo for m in models if m.rate_lo is not None]
    if cap is None or not lows:
        return ones
    r_lo = min(lows)

    def priced(r: float) -> float:
        size, rate = np.array([float(cap.size_bytes)]), np.array([r])
        return sum(float(m.predict(size, rate)[0]) for m in models)

    samples = _plateau(cap, cap.cpu_samples()) if plateau else cap.cpu_samples()
    at = [(r, us, priced(r)) for r, us in samples if r > r_lo]
    pts = [(r, us / 2 / p) for r, us, p in at if p > 0]
    if not pts:
        return ones
    x = np.log([r_lo, *(r for r, _ in pts)])
    y = np.array([1.0, *(q for _, q in pts)])
    r = np.asarray(rates, dtype=np.float64)
    got = np.interp(np.log(np.maximum(r, r_lo)), x, y)
    return np.asarray(np.maximum(got, 0.0), dtype=np.float64)


def _plateau(
    cap: Capacity, samples: tuple[tuple[float, float], ...]
) -> tuple[tuple[float, float], ...]:
    """``samples`` (rate, CPU-µs a request) with those at ≥ :data:`PLATEAU_FROM` × the closed
    loop's rate at their mean CPU a second ÷ their own rate (unchanged without a closed loop
    or with fewer than two such runs)."""
    closed = [p.achieved for p in cap.points if p.meshed and p.target <= 0 and p.achieved > 0]
    if not closed:
        return samples
    top = [(r, us) for r, us in samples if r >= PLATEAU_FROM * max(closed)]
    if len(top) < 2:
        return samples
    busy = sum(r * us for r, us in top) / len(top)  # CPU-µs a second
    return tuple((r, busy / r) if (r, us) in top else (r, us) for r, us in samples)


def queue_factor(mp: ModeProfile, queued: FloatArray) -> FloatArray | None:
    """Per value of ``queued`` (requests waiting at or in a sidecar), the factor on its base
    CPU: the capacity runs' CPU per request ÷ 2 ÷ the CPU models' price at their rate (as
    :func:`load_factor`), against the requests they had in the system — Little's law on each
    fixed-rate run (its rate × its mean latency through the sidecar, from its quantiles) and
    the closed loop's clients at its maximum — interpolated in log requests, held beyond the
    runs. None without capacity runs with latency quantiles."""
    pts = []
    for rate, n, cpu in _ramp(mp):
        priced = _priced(mp, rate)
        if priced is not None and priced > 0:
            pts.append((n, cpu / 2 / priced))
    if not pts:
        return None
    pts.sort()
    x = np.log([n for n, _ in pts])
    y = np.array([f for _, f in pts])
    got = np.interp(np.log(np.maximum(np.asarray(queued, dtype=np.float64), 1e-9)), x, y)
    return np.asarray(np.maximum(got, 0.0), dtype=np.float64)


def queued_factor(mp: ModeProfile) -> float | None:
    """The load factor when every client's request is queued: the capacity's closed-loop
    maximum through the sidecar (its CPU per request ÷ 2 per crossing ÷ what the CPU models
    price at its rate and size). None without one.

    A closed loop of N clients keeps N requests in the system at its maximum; a sidecar that
    always finds requests waiting handles several per wake-up, whatever its own share of the
    rate. That state, not a rate, is what sets the closed-loop maximum of a topology too
    (issue #20, set 2: Bookinfo's sidecars at 180–2 000 requests/s each, far below the rates
    where one hop's factor falls, reached 736/s together with 32 clients)."""
    cap = mp.capacity
    top = [p for p in cap.points if p.meshed and p.target == 0 and p.achieved > 0] if cap else []
    if not top:
        return None
    p = max(top, key=lambda x: x.achieved)
    priced = _priced(mp, p.achieved)
    if priced is None:
        return None
    us = p.sidecar_cpu / p.achieved * 1e6
    return us / 2 / priced if priced > 0 else None


def _priced(mp: ModeProfile, rate: float) -> float | None:
    """What the CPU models of the base components price one crossing at, at ``rate`` and the
    capacity runs' size (µs); None without models."""
    models = [mp.components[c].cpu for c in BASE if c in mp.components]
    if not models:
        return None
    size = np.array([float(mp.capacity.size_bytes if mp.capacity else 0)])
    return sum(float(m.predict(size, np.array([rate]))[0]) for m in models)


def _ramp(mp: ModeProfile) -> list[tuple[float, float, float]]:
    """(requests/s, requests in the system, CPU-µs per request the mesh adds) of every run
    through the sidecar with latency quantiles (the closed loop: its clients), by rate."""
    cap = mp.capacity
    if cap is None:
        return []
    samples = dict(cap.cpu_samples())
    out = []
    for p in cap.points:
        if not p.meshed or p.achieved <= 0 or p.achieved not in samples:
            continue
        n = _in_system(cap, p)
        if n is not None and n > 0 and samples[p.achieved] > 0:
            out.append((p.achieved, n, samples[p.achieved]))
    return sorted(out)


def _in_system(cap: Capacity, p: CapacityPoint) -> float | None:
    """Requests in the system during capacity run ``p``: the closed loop's clients, or
    Little's law on a fixed-rate run (its rate × its mean latency, from its quantiles); None
    without quantiles."""
    if p.target == 0:
        return float(cap.connections)
    if not p.quantiles_us:
        return None
    q = np.asarray(p.quantiles_us, dtype=np.float64)
    pr = np.asarray(SKETCH_PROBS, dtype=np.float64)
    return p.achieved * float(np.sum(np.diff(pr) * (q[1:] + q[:-1]) / 2)) * 1e-6


def queue_relief(
    mp: ModeProfile, rate: float, queued: FloatArray, batching: bool = False
) -> FloatArray:
    """Per value of ``queued`` (requests in the system at a sidecar of request rate ``rate``),
    the factor on its CPU per request relative to what the capacity runs measured at that
    rate: their CPU per request at as many requests in the system (Little's law on each
    fixed-rate run, the clients at the closed loop; interpolated in log requests) ÷ theirs at
    the rate (interpolated in log rate), at most 1; 1 without capacity runs.

    A busy sidecar's worker handles every ready event per ``epoll`` wake-up, so a request
    costs less the more others are waiting with it: the profile's ramp (one hop, 32 clients)
    measured 132 CPU-µs a request with 0.1 in the system, 72 with 1.7, 44 with 9.5 and 33 with
    all 32 (2026-11-26, set 3's profile). Priced at its rate alone, a queue that grows beyond
    the rate's usual one never gets cheaper, and a station priced at ρ ≈ 1 fills to the
    clients (issue #20, set 3: one hop at 75–90 % load predicted at p50 2–3× the measured).

    ``batching``: a wake-up serves two only when another request is waiting, so fewer than
    one in the system costs what one does, and the reference is the ramp's CPU per request
    at the requests in the system its run at ``rate`` had, at least one (below, the ramp's
    falling cost is the rate's: a warmer CPU, not batching). Without it the reference is the
    ramp's cost at the rate: a topology's sidecars at a few hundred requests/s were relieved
    from the ramp's idle-sidecar cost as soon as a request or two were in the system (issue
    #20, set 4: Bookinfo's queue at 75–90 % load a third of the measured)."""
    pts = _ramp(mp)
    ones = np.ones_like(np.asarray(queued, dtype=np.float64))
    if len(pts) < 2:
        return ones
    by_n = sorted(pts, key=lambda t: t[1])
    xn, yn = np.log([p[1] for p in by_n]), [p[2] for p in by_n]
    if batching:  # only another request waiting lets a wake-up serve two: from one on
        n_rate = float(
            np.interp(np.log(max(rate, 1e-9)), np.log([p[0] for p in pts]), [p[1] for p in pts])
        )
        at_rate = float(np.interp(np.log(max(n_rate, 1.0)), xn, yn))
        q = np.maximum(np.asarray(queued, dtype=np.float64), 1.0)
    else:
        at_rate = float(
            np.interp(np.log(max(rate, 1e-9)), np.log([p[0] for p in pts]), [p[2] for p in pts])
        )
        q = np.maximum(np.asarray(queued, dtype=np.float64), 1e-9)
    got = np.interp(np.log(q), xn, yn)
    return np.asarray(np.minimum(got / at_rate, 1.0), dtype=np.float64) if at_rate > 0 else ones


#: below this fraction of the closed loop's rate a ``shape`` replaces the ramp's runs
SHAPE_BELOW = 0.25


def ramp_sidecar_us(
    mp: ModeProfile, rates: FloatArray, shape: tuple[float, float] | None = None
) -> FloatArray | None:
    """Per rate, the sidecar's own CPU-µs per request (both crossings) on the profile's
    capacity ramp — its fixed-rate runs through the sidecar, without the app's change —
    interpolated in log rate, held beyond the runs; None without such runs.

    With ``shape`` (coefficient a, exponent b) and a closed-loop run (rate R, CPU-µs per
    request u): below ``SHAPE_BELOW`` × R the price is u × a × (rate ÷ R)^b, and the runs
    below there are left out (the interpolation above starts from the shape's value there).

    Why (issue #20, sets 10–11): each of Bookinfo's sidecars used what the profile's own
    sidecar uses at the same own rate (median 0.90×), while the models priced its messages at
    the shared CPU's (warmer, cheaper) rate and then × the load factor at its own rate — 1.6×
    low. The ramp at its own rate is measured by the profile, nothing fitted to a topology.
    Why the shape (registered before set 13, held there): the ramp's runs below a quarter of
    the closed loop moved 2.3× between sittings' profiles (123–278 µs at ~350/s, sets 10–12)
    while its closed loop and the runs above moved ≤ 15 %."""
    cap = mp.capacity
    runs = [p for p in cap.points if p.meshed and p.achieved > 0] if cap is not None else []
    pts = sorted((p.achieved, p.sidecar_cpu / p.achieved * 1e6) for p in runs if p.target > 0)
    if not pts:
        return None
    r = np.maximum(np.asarray(rates, dtype=np.float64), 1e-9)
    top = closed_loop(mp)
    if shape is not None and top is not None:
        rc, uc = top
        low = SHAPE_BELOW * rc
        pts = [(low, uc * shape[0] * SHAPE_BELOW ** shape[1])] + [p for p in pts if p[0] > low]
        x, y = np.log([q for q, _ in pts]), np.array([u for _, u in pts])
        shaped = uc * shape[0] * (r / rc) ** shape[1]
        return np.asarray(np.where(r <= low, shaped, np.interp(np.log(r), x, y)), np.float64)
    x, y = np.log([q for q, _ in pts]), np.array([u for _, u in pts])
    return np.asarray(np.interp(np.log(r), x, y), dtype=np.float64)


def closed_loop_us(mp: ModeProfile, rates: FloatArray, exponent: float) -> FloatArray | None:
    """Per rate, a sidecar's CPU-µs per request (both crossings) at a closed loop's maximum:
    u_R × (rate ÷ R)^``exponent`` below the capacity's closed-loop rate R (u_R: its sidecar
    CPU a request there), u_R at and above it; None without a closed-loop run.

    Why (issue #20, after set 13): the ramp's fixed-rate runs below R/4 lie ``coefficient`` ×
    above this law (the shape, :data:`~meshtax.predict.ramp_price.RAMP_SHAPE`), the closed loop
    on it; a topology's sidecars at its closed loop have every client's request queued among
    them and batch as the profile's closed loop does. The queue factor this replaces maps a
    sidecar's share of the clients onto one hop's Little's-law queue at its fixed-rate runs,
    whose latency near the knee moved 2× between sittings."""
    top = closed_loop(mp)
    if top is None:
        return None
    rc, uc = top
    f = np.minimum(np.maximum(np.asarray(rates, dtype=np.float64), 1e-9) / rc, 1.0)
    return np.asarray(uc * f**exponent, dtype=np.float64)


def closed_loop(mp: ModeProfile) -> tuple[float, float] | None:
    """The capacity's fastest closed-loop run through the sidecar: (its rate R, the sidecar's
    CPU-µs a request there); None without one."""
    cap = mp.capacity
    closed = [p for p in cap.points if p.meshed and p.target <= 0 and p.achieved > 0] if cap else []
    if not closed:
        return None
    top = max(closed, key=lambda p: p.achieved)
    return top.achieved, top.sidecar_cpu / top.achieved * 1e6
