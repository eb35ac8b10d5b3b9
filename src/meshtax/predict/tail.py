"""Tail latency under load: percentiles of end-to-end latency with and without the mesh, and
where sidecars saturate (pure, vectorized; an addition to :mod:`meshtax.predict.engine`,
whose mean path is unchanged).

Each crossing of a sidecar costs what the engine prices (latency and CPU per message, from
the profile's cost models at the message's size and rate) — but as a random variable:

* **the crossing itself**: the latency one side of a call adds (request and response through
  one sidecar, the unit the profiler measures) is its mean × a draw of the mode's *latency
  shape*, the profile's per-request overhead quantiles at the nearest message size
  (:class:`~meshtax.model.capacity.LatencySketch`: meshed − direct quantiles of one request
  in flight, normalised to mean 1; without a sketch, the mean);
* **waiting for a worker** (pods on CPUs of their own): each crossing is a job at its
  sidecar's *station*, the worker threads (``servers``: the profile's measured sidecar's, 1
  without, or ``workers``). A job's service time is its CPU cost × a draw of the *service
  shape*; arrivals are every crossing of that sidecar at the calls' rates (``load="graphs"``:
  each graph is an API and the rates of all graphs add up; ``"pairs"``: graphs are samples of
  one traffic mix, as traces are, and a caller→callee pair's rate counts once). Each
  station's waiting-time distribution comes from :func:`~meshtax.predict.queueing.waiting_times`
  (G/G/c by direct simulation: see there why not a closed form); waits of different crossings
  are drawn independently (Jackson's approximation: the queues of a network as if fed by
  independent streams);
* **waiting for shared CPUs** (``pod_cpus``): every sidecar and application of the pods runs
  on the same CPUs, so the CPUs are the queue and the workers never wait on their own. A
  request's work there — all its crossings' CPU and the applications' own (``app_cpu_us``,
  their CPU per request without the mesh) — is one job: its visits follow one another
  through the call graph, each woken by the previous, so a request waits for the work ahead
  of it once rather than once per visit (both give the same mean for a single CPU; the
  once-per-request wait has the heavier tail). The request adds the difference between its
  wait with the sidecars' work and without it (the applications alone), at the same rank of
  the two waiting-time distributions (the same request on a busier CPU); it also takes at
  least its sidecar CPU work ÷ ``pod_cpus`` (the engine's placement bound).

For each of ``samples`` draws per graph the crossings are added to the invocations and the
end-to-end latency is recomputed with the engine's critical-path kernel
(:func:`~meshtax.predict.critical_path.propagate`, one call over all draws). The no-mesh
latency of a graph is its recorded end-to-end latency (its own waits included); several
graphs of one API give its distribution.

Overhead at percentile p = p-th percentile with the mesh − p-th percentile without (what a
client-side percentile difference measures). Intervals: the cost models' 95 % bounds moved
together (as the engine's), widened by the Monte Carlo error (1.96 standard errors over ten
batches of the draws), with common random numbers for the three runs.

Saturation: each station's utilisation ρ at the given rates; the rate factor at which it
reaches ``threshold`` (default 0.8; solved with the cost models re-priced at the scaled rates)
— the first station to get there saturates first; the vCPU each needs at the given rates to
stay under the threshold. A station at ρ ≥ 1 has no stationary queue: latencies through it
are infinite (reported as saturated).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from meshtax.model.ecg import EcgBatch
from meshtax.predict.critical_path import Structure, propagate, structure
from meshtax.predict.engine import ProfileLookup
from meshtax.predict.queueing import SaturatedError, ServiceMix, Shape, Station, waiting_times
from meshtax.predict.ramp_price import RampPrice, ramp_price
from meshtax.predict.ramp_queue import RampQueue, queue_form, ramp_queue
from meshtax.predict.saturation import factors, loads
from meshtax.predict.stations import (
    Crossings,
    StationLoad,
    Stations,
    TailOptions,
    crossings,
    latency_shape,
    request_rate,
    station_mix,
    stations,
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Z95 = 1.959963984540054
BATCHES = 10

__all__ = [
    "RampPrice",
    "StationLoad",
    "TailOptions",
    "TailPrediction",
    "latency_shape",
    "predict_tail",
    "request_rate",
    "tiled",
]


@dataclass(frozen=True)
class TailPrediction:
    """Percentiles (``percentiles``) of end-to-end latency per graph and over all graphs.

    Per graph: ``base_us`` (no mesh), ``new_us`` and ``overhead_us`` (graphs × percentiles)
    with ``overhead_lo_us``/``overhead_hi_us``; pooled over the graphs (each graph one
    request of the mix): ``pooled_base_us``, ``pooled_new_us``, ``pooled_overhead_us`` and
    its bounds. Saturated graphs hold inf. ``request_rate``: requests/s entering the graphs
    (their root calls, under the ``load`` rule), the unit of saturation rates.
    ``served_utilisation``: the busiest station's utilisation at the service its simulated
    jobs were given (with ``relief``, below the priced one once a queue builds).
    ``ramp``: whether the sidecars were priced from the capacity ramp, and why not (None: the
    options did not ask, ``TailOptions.ramp_price``). ``queue_bound``: whether the shared
    CPUs' wait was bounded by the ramp's queue, and why not ("": not asked,
    ``TailOptions.ramp_queue``).
    """

    percentiles: tuple[float, ...]
    base_us: FloatArray
    new_us: FloatArray
    overhead_us: FloatArray
    overhead_lo_us: FloatArray
    overhead_hi_us: FloatArray
    pooled_base_us: FloatArray
    pooled_new_us: FloatArray
    pooled_overhead_us: FloatArray
    pooled_lo_us: FloatArray
    pooled_hi_us: FloatArray
    stations: tuple[StationLoad, ...]
    request_rate: float
    samples: int
    threshold: float
    warnings: tuple[str, ...] = field(default=())
    served_utilisation: float = math.nan
    ramp: RampPrice | None = None
    queue_bound: str = ""

    @property
    def first_to_saturate(self) -> StationLoad | None:
        """The station whose utilisation reaches the threshold at the lowest rate."""
        finite = [s for s in self.stations if math.isfinite(s.saturation_factor)]
        return min(finite, key=lambda s: s.saturation_factor) if finite else None

    @property
    def saturation_rate(self) -> float:
        """Requests/s at which the first station reaches the threshold (inf: none does)."""
        s = self.first_to_saturate
        return math.inf if s is None else s.saturation_factor * self.request_rate


# ---- Monte Carlo over the critical path -----------------------------------------------------


def tiled(s: Structure, copies: int) -> Structure:
    """``copies`` independent copies of a batch's structure, copy-major (copy c holds rows
    ``c·n …`` and graphs ``c·G …``), for one :func:`propagate` over many draws."""
    n = s.start.shape[0]
    G = s.graph_ptr.shape[0] - 1
    counts = np.diff(s.child_ptr)
    ptr = np.zeros(copies * (n + G) + 1, dtype=np.int64)
    np.cumsum(
        np.concatenate([np.tile(counts[:n], copies), np.tile(counts[n:], copies)]), out=ptr[1:]
    )
    off = (np.arange(copies, dtype=np.int64) * n)[:, None]
    cut = int(s.child_ptr[n])  # members of the rows' groups, then of the graphs' roots
    gptr = np.concatenate([(s.graph_ptr[:-1][None, :] + off).ravel(), [copies * n]])

    def members(ix: IntArray) -> IntArray:
        rows_part = (ix[:cut][None, :] + off).ravel()
        root_part = (ix[cut:][None, :] + off).ravel()
        return np.concatenate([rows_part, root_part]).astype(np.int64)

    # a row's position in the tiled child_idx: its copy's block of the rows' part or the roots'
    c = np.arange(copies, dtype=np.int64)[:, None]
    p = s.pos[None, :]
    pos = np.where(p < cut, c * cut + p, copies * cut + c * (n - cut) + (p - cut))
    return Structure(
        ptr,
        members(s.child_idx),
        gptr.astype(np.int64),
        np.tile(s.start, copies),
        np.tile(s.end, copies),
        members(s.end_idx),
        pos.ravel().astype(np.int64),
    )


@dataclass(frozen=True)
class _Run:
    """One Monte Carlo run: draws × graphs of latency with the mesh, station summaries."""

    new: FloatArray  # samples × graphs
    rho: FloatArray
    mean_wait: FloatArray
    p99_wait: FloatArray
    served_rho: FloatArray


def _simulate(
    batch: EcgBatch,
    cx: Crossings,
    sts: Stations,
    shape: Structure,
    tile: Structure,
    lat_shapes: tuple[IntArray, tuple[Shape, ...]],
    m: int,
    opts: TailOptions,
    sign: float,
    cap: Callable[[FloatArray], FloatArray] | None = None,
) -> _Run:
    """Draw ``m`` samples of every graph with costs moved ``sign`` × 1.96 standard errors;
    ``cap``: on shared CPUs, the most a request at rank ``u`` waits more with the mesh (µs)."""
    rng = np.random.default_rng(opts.seed)
    n = batch.n_invocations
    lat = np.maximum(cx.lat + sign * Z95 * cx.lse, 0.0)
    scale = max(1.0 + sign * Z95 * _rel_se(cx), 0.0)
    S = len(sts.names)
    # with a waking client (wakeup_us): a response reaches it after the request's unloaded
    # latency, the median without the mesh (+ the crossings' mean latency, with it)
    alone_us = float(np.median(shape_base(shape))) if opts.wakeup_us else 0.0
    mesh_us = alone_us + float(lat.sum()) / max(batch.n_graphs, 1) if opts.wakeup_us else 0.0
    waits: list[FloatArray | None] = []
    rho = np.zeros(S)
    served_rho = np.zeros(S)
    for k in range(S):
        got = station_mix(sts, k, scale)
        if got is None:
            waits.append(np.zeros(1))
            continue
        relief = sts.relief if k == sts.shared else None
        st = Station(
            got[0],
            sts.servers[k],
            got[1],
            opts.arrivals,
            opts.clients,
            opts.jitter_us,
            relief,
            opts.wakeup_us,
            mesh_us if k == sts.shared else 0.0,
        )
        rho[k] = st.utilisation
        if sts.shared >= 0 and k != sts.shared:
            waits.append(np.zeros(1))  # on shared CPUs a worker waits for the CPUs
            continue
        served: list[float] = []
        try:
            waits.append(
                waiting_times(st, opts.queue_jobs, seed=opts.seed + 7 * k + 1, served=served)
            )
        except SaturatedError:
            waits.append(None)
        if served:
            served_rho[k] = got[0] * served[0] * 1e-6 / sts.servers[k]
    extra = np.zeros((m, n))
    side_of, shapes = lat_shapes
    for side in (0, 1):
        u = rng.random((m, n))
        x = np.ones((m, n))
        for j, sh in enumerate(shapes):
            cols = np.flatnonzero(side_of[:, side] == j)
            x[:, cols] = sh.quantile(u[:, cols])
        extra += lat[:, side][None, :] * x
        if sts.shared < 0:
            for _ in range(2):  # request and response crossing: a job each
                extra += _draw_waits(sts.of_side[:, side], waits, rng, m)
    # a call through a saturated station never ends, nor does any graph that waits for it
    stuck = ~np.isfinite(extra)
    prop = propagate(tile, np.where(stuck, 0.0, extra).ravel())
    new = prop.new_us.reshape(m, -1)
    if stuck.any():
        g = batch.graph_of()
        hit = np.stack([np.bincount(g, weights=row, minlength=batch.n_graphs) for row in stuck])
        new = np.where(hit > 0, np.inf, new)
    if sts.shared >= 0:
        # the request's sidecar CPU work cannot finish faster than on all shared CPUs at once
        work = (cx.cpu_req + cx.cpu_resp).sum(axis=1) * scale
        per_graph = np.bincount(batch.graph_of(), weights=work, minlength=batch.n_graphs)
        cpus = sts.servers[sts.shared]
        new = np.maximum(new, shape_base(shape)[None, :] + per_graph[None, :] / cpus)
        base = shape_base(shape)
        u = _base_ranks(base, rng, m)
        more = _shared_wait(sts, waits[sts.shared], cpus, opts, u, alone_us)
        if opts.stalls:  # the drain at the utilisation as served (with relief: lower)
            busy = served_rho[sts.shared] or rho[sts.shared]
            more = more + _stall_backlog(base, sts, busy, cpus, u)
        new = new + (more if cap is None else np.minimum(more, cap(u)))
    mean_w = np.array([np.inf if w is None else float(w.mean()) for w in waits])
    p99_w = np.array([np.inf if w is None else float(np.quantile(w, 0.99)) for w in waits])
    return _Run(new, rho, mean_w, p99_w, served_rho)


def _ramp_cap(
    batch: EcgBatch,
    profiles: ProfileLookup,
    opts: TailOptions,
    sts: Stations,
    full: Sequence[float],
) -> tuple[Callable[[FloatArray], FloatArray] | None, str]:
    """On shared CPUs, the queue the profile's ramp showed at the CPUs' load fraction (their
    rate ÷ their saturation rate, ``full``: each station's factor at ρ = 1), in their times
    per request (:mod:`~meshtax.predict.ramp_queue`), and a sentence saying so or why not
    (no shared CPUs, no saturation in sight, several modes, no ramp with quantiles)."""
    k = sts.shared
    if k < 0:
        return None, "not used: the pods do not share CPUs"
    if not 0 < full[k] < math.inf:
        return None, "not used: the shared CPUs do not saturate at any rate"
    used = {
        (spec.platform, spec.config.mode)
        for s, spec in enumerate(batch.specs)
        if spec.config.meshed and bool(((batch.caller_spec == s) | (batch.callee_spec == s)).any())
    }
    if len(used) != 1:
        return None, "not used: the sidecars run in several modes (one ramp per mode)"
    platform, mode = used.pop()
    mp = profiles(platform).modes.get(mode)
    rq = ramp_queue(mp, opts.ramp_repeats) if mp is not None else None
    if rq is None:
        return None, (
            f"not used: the profile has no capacity ramp with latency quantiles for "
            f"{mode.value} mode"
        )
    repeated = max(rq.draws, default=1) > 1
    form = queue_form(mp) if opts.ramp_form else None
    if form is not None:
        rq, repeated = form.ramp(), False
    elif opts.ramp_pooled is not None and not repeated:
        rq = RampQueue.from_table(opts.ramp_pooled)
    rate = request_rate(batch, opts.load)
    saturates = rate * full[k]  # requests/s at ρ = 1
    if opts.ramp_own_bed and mp is not None and mp.capacity is not None:
        saturates = mp.capacity.requests_per_s  # the bed's measured closed loop
    fraction, unit_us = rate / saturates, 1e6 / saturates

    def cap(u: FloatArray) -> FloatArray:
        return rq.at(fraction, u, opts.ramp_heavy) * unit_us

    p99 = float(cap(np.array([0.99]))[0])
    if form is not None:
        ramp = (
            f"the profile's own queue form ({form.k:.2f} × f/(1 − f) × −ln(1 − u) requests, "
            f"fitted on its {form.draws} ramp runs at ≥ half its closed loop)"
        )
    elif repeated:
        ramp = f"the profile's capacity ramp (the median of up to {max(rq.draws)} runs a rate)"
    elif opts.ramp_pooled:
        ramp = "the profiles' pooled capacity ramps"
    else:
        ramp = "the profile's capacity ramp"
    return cap, (
        f"used: the shared CPUs at {fraction:.0%} of their saturation rate wait at most what "
        f"{ramp} queued there ({p99:.0f} µs at p99)"
    )


def _base_ranks(base: FloatArray, rng: np.random.Generator, m: int) -> FloatArray:
    """Per draw (m × graphs), a rank in (0, 1) within the graph's share of the pooled no-mesh
    latencies: the graph's order among them, jittered inside its slot (ties share one)."""
    n = base.size
    ordered = np.sort(base)
    lo = np.searchsorted(ordered, base, side="left")
    hi = np.searchsorted(ordered, base, side="right")
    return np.asarray((lo + (hi - lo) * rng.random((m, n))) / n, dtype=np.float64)


def _shared_wait(
    sts: Stations,
    mesh: FloatArray | None,
    cpus: int,
    opts: TailOptions,
    u: FloatArray,
    response_us: float = 0.0,
) -> FloatArray:
    """What a request waits on the shared CPUs more than it would without the sidecars: the
    two waiting times at the rank ``u`` of its latency without the mesh (the same request on
    a busier CPU: one that waited long without the sidecars waits long with them)."""
    if mesh is None:
        return np.full(u.shape, np.inf)
    out = _pick(mesh, u)
    if sts.app_mean_us > 0 and sts.base_rate > 0:
        app = ServiceMix((sts.app_mean_us,), (1.0,))
        alone = Station(
            sts.base_rate,
            cpus,
            app,
            opts.arrivals,
            opts.clients,
            opts.jitter_us,
            wakeup_us=opts.wakeup_us,
            response_us=response_us,
        )
        try:
            out = out - _pick(waiting_times(alone, opts.queue_jobs, seed=opts.seed + 3), u)
        except SaturatedError:
            pass  # the application alone saturates its CPUs: so does it with the mesh
    return np.maximum(out, 0.0)


def _stall_backlog(
    base: FloatArray, sts: Stations, rho_mesh: float, cpus: int, u: FloatArray
) -> FloatArray:
    """What the backlog of a CPU stall adds with the mesh, at the rank ``u`` of a request's
    no-mesh latency (``base``: one per graph, the no-mesh distribution).

    While the shared CPUs are taken (by another process, the host, a long interrupt) requests
    keep arriving and queue; once the CPUs return, the backlog drains at 1 − ρ of their
    capacity. With evenly spaced arrivals and a stall of length D, the k-th request waits
    D − k·a·(1 − ρ) (``a`` the spacing): the waits are spread evenly over (0, D) whatever ρ
    is, but as many requests as D / (a·(1 − ρ)) get one. A busier CPU (the sidecars' work)
    leaves the stalls as they are and lengthens each drain: P(wait > w) is multiplied by
    κ = (1 − ρ₀)/(1 − ρ₁), ρ₀ the applications' utilisation alone, ρ₁ with the sidecars.
    The no-mesh latencies carry the stalls (their tail): a request at rank u with the mesh
    sits where rank 1 − (1 − u)/κ sits without it."""
    r0 = sts.base_rate * sts.app_mean_us * 1e-6 / cpus
    if not 0 <= r0 < rho_mesh < 1:
        return np.zeros(u.shape)
    kappa = (1.0 - r0) / (1.0 - rho_mesh)
    ordered = np.sort(base)
    q = np.arange(ordered.size, dtype=np.float64) / max(ordered.size - 1, 1)
    up = np.interp(1.0 - (1.0 - u) / kappa, q, ordered)
    return np.asarray(np.maximum(up - np.interp(u, q, ordered), 0.0), dtype=np.float64)


def shape_base(s: Structure) -> FloatArray:
    """Mesh-free end-to-end latency of every graph of a structure."""
    return propagate(s, np.zeros_like(s.start)).base_us


def _rel_se(cx: Crossings) -> float:
    """The CPU costs' standard error relative to their total (moved together)."""
    tot = float((cx.cpu_req + cx.cpu_resp).sum())
    return float(cx.cse.sum()) / tot if tot > 0 else 0.0


def _pick(sorted_waits: FloatArray, u: FloatArray) -> FloatArray:
    idx = np.minimum((u * sorted_waits.size).astype(np.int64), sorted_waits.size - 1)
    return np.asarray(sorted_waits[idx], dtype=np.float64)


def _draw_waits(
    of_side: IntArray, waits: Sequence[FloatArray | None], rng: np.random.Generator, m: int
) -> FloatArray:
    out = np.zeros((m, of_side.size))
    u = rng.random((m, of_side.size))
    for k, w in enumerate(waits):
        cols = np.flatnonzero(of_side == k)
        if cols.size == 0:
            continue
        out[:, cols] = np.inf if w is None else _pick(w, u[:, cols])
    return out


def _lat_shapes(
    batch: EcgBatch, profiles: ProfileLookup, cx: Crossings, warnings: list[str]
) -> tuple[IntArray, tuple[Shape, ...]]:
    """Per row and side, the index of its latency shape (the sketch nearest its messages)."""
    shapes: list[Shape] = []
    seen: dict[tuple[int, int], int] = {}
    out = np.full((batch.n_invocations, 2), -1, dtype=np.int64)
    size = np.sqrt(np.maximum(batch.request_bytes, 1.0) * np.maximum(batch.response_bytes, 1.0))
    missing: set[str] = set()
    for side, specs in ((0, batch.caller_spec), (1, batch.callee_spec)):
        for i in np.flatnonzero(cx.station[:, side] >= 0).tolist():
            spec = batch.specs[int(specs[i])]
            mp = profiles(spec.platform).modes.get(spec.config.mode)
            sk = mp.latency_sketches if mp is not None else {}
            if not sk:
                missing.add(spec.config.mode.value)
                continue
            k = min(sk, key=lambda s: abs(math.log(max(s, 1) / size[i])))
            key = (int(specs[i]), k)
            if key not in seen:
                seen[key] = len(shapes)
                shapes.append(Shape.from_quantiles(sk[k].probs, sk[k].overhead_us()))
            out[i, side] = seen[key]
    if missing:
        warnings.append(
            f"the profile has no latency distribution for {', '.join(sorted(missing))} mode "
            "(`meshtax profile` records one): those crossings vary only by their waits"
        )
    return out, tuple(shapes)


#: stands for an infinite latency inside percentile interpolation (inf − inf is NaN)
_HUGE = 1e300


def _quantiles(x: FloatArray, ps: Sequence[float], axis: int = 0) -> FloatArray:
    q = np.percentile(np.where(np.isinf(x), _HUGE, x), ps, axis=axis)
    return np.asarray(np.where(q >= _HUGE / 10, np.inf, q), dtype=np.float64)


def _mc_error(new: FloatArray, ps: Sequence[float]) -> FloatArray:
    """Standard error of each graph's percentiles over the draws (batch means)."""
    m = new.shape[0]
    b = max(2, min(BATCHES, m // 20))
    parts = np.array_split(new, b, axis=0)
    q = np.stack([_quantiles(p, ps) for p in parts])  # batches × P × G
    with np.errstate(invalid="ignore"):
        se = q.std(axis=0, ddof=1) / math.sqrt(b)
    return np.asarray(np.nan_to_num(se, nan=0.0, posinf=0.0), dtype=np.float64)


def predict_tail(batch: EcgBatch, profiles: ProfileLookup, opts: TailOptions) -> TailPrediction:
    """Percentiles with and without the mesh, per graph and pooled, and each station's load
    (see the module docstring)."""
    if batch.n_graphs == 0:
        raise ValueError("no call graphs to predict")
    warnings: list[str] = []
    ramp = ramp_price(batch, profiles, opts) if opts.ramp_price else None
    if ramp is not None:
        opts = replace(opts, cost_scale=opts.cost_scale * ramp.scale)
    cx = crossings(batch, profiles, opts)
    warnings += cx.warnings
    sts = stations(batch, profiles, cx, opts)
    lat_shapes = _lat_shapes(batch, profiles, cx, warnings)
    shape = structure(batch)
    m = int(max(20, min(opts.samples, opts.max_rows // max(batch.n_invocations, 1))))
    tile = tiled(shape, m)
    # saturation is the profile's own: the closed loop's maximum is priced at its queue state
    # by the capacity runs, which a cost scale fitted at a fixed rate does not measure
    sat_opts = replace(opts, cost_scale=1.0)
    at = factors(batch, profiles, sat_opts, sts)
    cap, bound = _ramp_cap(batch, profiles, opts, sts, at[1.0]) if opts.ramp_queue else (None, "")
    runs = [
        _simulate(batch, cx, sts, shape, tile, lat_shapes, m, opts, s, cap)
        for s in (0.0, -1.0, 1.0)
    ]
    base = shape_base(shape)
    ps = opts.percentiles
    mid, lo, hi = runs
    q = _quantiles(mid.new, ps).T  # graphs × P
    err = _mc_error(mid.new, ps).T
    q_lo = np.minimum(_quantiles(lo.new, ps).T, q) - Z95 * err
    q_hi = np.maximum(_quantiles(hi.new, ps).T, q) + Z95 * err
    pooled = [_quantiles(r.new.ravel(), ps) for r in runs]
    pb = _quantiles(np.tile(base, m), ps)  # weighted as the draws are: m per graph
    pe = _mc_error(mid.new.reshape(-1, 1), ps)[:, 0]
    rate = request_rate(batch, opts.load)
    found = loads(batch, profiles, sat_opts, sts, (mid.rho, mid.mean_wait, mid.p99_wait), at)
    for st in found:
        if st.saturated and opts.clients is None:
            warnings.append(
                f"{st.name}: utilisation {st.utilisation:.2f} ≥ 1 at these rates — its queue "
                "grows without bound, so latencies through it are infinite (saturated)"
            )
        elif st.saturated:
            warnings.append(
                f"{st.name}: utilisation {st.utilisation:.2f} ≥ 1 at these rates — saturated: "
                f"the {opts.clients} clients keep at most that many requests queued and get "
                "less than the asked rate"
            )
    if opts.pod_cpus is not None and opts.app_cpu_us == 0:
        warnings.append(
            "the applications' CPU per request on the shared CPUs is not given (app_cpu_us): "
            "only the sidecars load them, and the applications' own waits are not counted"
        )
    return TailPrediction(
        percentiles=tuple(ps),
        base_us=base,
        new_us=q,
        overhead_us=q - base[:, None],
        overhead_lo_us=np.maximum(q_lo - base[:, None], 0.0),
        overhead_hi_us=q_hi - base[:, None],
        pooled_base_us=pb,
        pooled_new_us=pooled[0],
        pooled_overhead_us=pooled[0] - pb,
        pooled_lo_us=np.minimum(pooled[1], pooled[0]) - Z95 * pe - pb,
        pooled_hi_us=np.maximum(pooled[2], pooled[0]) + Z95 * pe - pb,
        stations=found,
        request_rate=rate,
        samples=m,
        threshold=opts.threshold,
        warnings=tuple(dict.fromkeys(warnings)),
        served_utilisation=float(np.max(np.where(mid.served_rho > 0, mid.served_rho, mid.rho))),
        ramp=ramp,
        queue_bound=bound,
    )
