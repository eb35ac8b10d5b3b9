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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import numpy.typing as npt

from meshtax.model.capacity import LatencySketch
from meshtax.model.ecg import DEFAULT_MESSAGE_BYTES, EcgBatch
from meshtax.model.profile import Profile
from meshtax.model.speed import Speed
from meshtax.predict.critical_path import Structure, propagate, structure
from meshtax.predict.engine import Costs, ProfileLookup, hop_costs, priced_rates, side_alphas
from meshtax.predict.queueing import SaturatedError, ServiceMix, Shape, Station, waiting_times

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Z95 = 1.959963984540054
BATCHES = 10

__all__ = [
    "StationLoad",
    "TailOptions",
    "TailPrediction",
    "latency_shape",
    "predict_tail",
    "tiled",
]


@dataclass(frozen=True)
class TailOptions:
    """What a tail prediction assumes; see the module docstring.

    ``samples``: draws per graph (fewer for large batches: at most ``max_rows`` rows are
    propagated per run); ``arrivals``: squared coefficient of variation of each station's
    interarrival times (1: Poisson, independent clients; 0: evenly spaced);
    ``service``: the shape of a job's service time — ``latency`` (the latency shape's, so its
    variability includes wake-up stalls), or ``constant`` (its mean: per-message CPU work that
    does not vary); ``workers``: worker threads per sidecar (None: the profile's measured
    capacity's, else 1, the profiler's Envoy); ``app_cpu_us``: on shared CPUs, the
    applications' CPU-µs per request without the mesh (0: their own waits are not counted).
    """

    percentiles: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)
    samples: int = 4000
    seed: int = 0
    threshold: float = 0.8
    arrivals: float = 1.0
    service: Literal["latency", "constant"] = "constant"
    workers: int | None = None
    pod_cpus: int | None = None
    app_cpu_us: float = 0.0
    load: Literal["graphs", "pairs"] = "graphs"
    queue_jobs: int = 200_000
    max_rows: int = 2_000_000
    alpha: float | None = None
    speed: Speed | None = None

    def __post_init__(self) -> None:
        if not all(0 < p < 100 for p in self.percentiles) or not self.percentiles:
            raise ValueError(f"percentiles must be within (0, 100), got {self.percentiles}")
        if self.samples < 20 or not 0 < self.threshold < 1 or self.arrivals < 0:
            raise ValueError("need samples ≥ 20, 0 < threshold < 1 and arrivals (SCV) ≥ 0")
        if (self.workers is not None and self.workers < 1) or self.app_cpu_us < 0:
            raise ValueError("workers must be ≥ 1 and app_cpu_us ≥ 0")
        if self.pod_cpus is not None and self.pod_cpus < 1:
            raise ValueError(f"pod_cpus must be at least 1, got {self.pod_cpus}")


@dataclass(frozen=True)
class StationLoad:
    """One queue: a sidecar's workers (``name`` = the service) or the pods' shared CPUs
    (``name`` = ``"shared CPUs"``). ``jobs_per_s`` crossings (on shared CPUs: requests) per
    second, ``mean_service_us`` each, ``utilisation`` ρ per server, ``busy_vcpu`` = ρ ×
    servers; ``saturation_factor``/``full_factor``: the factor on every call's rate at which ρ
    reaches the threshold / 1 (inf: never); ``needed_vcpu``: CPUs to stay under the threshold
    at these rates; waits (µs) of a job: mean and p99 (inf when saturated; 0 for a sidecar's
    workers on shared CPUs, which wait for the CPUs instead)."""

    name: str
    mode: str
    servers: int
    jobs_per_s: float
    mean_service_us: float
    utilisation: float
    saturation_factor: float
    full_factor: float
    needed_vcpu: float
    mean_wait_us: float
    p99_wait_us: float

    @property
    def busy_vcpu(self) -> float:
        return self.utilisation * self.servers

    @property
    def saturated(self) -> bool:
        return self.utilisation >= 1.0


@dataclass(frozen=True)
class TailPrediction:
    """Percentiles (``percentiles``) of end-to-end latency per graph and over all graphs.

    Per graph: ``base_us`` (no mesh), ``new_us`` and ``overhead_us`` (graphs × percentiles)
    with ``overhead_lo_us``/``overhead_hi_us``; pooled over the graphs (each graph one
    request of the mix): ``pooled_base_us``, ``pooled_new_us``, ``pooled_overhead_us`` and
    its bounds. Saturated graphs hold inf. ``request_rate``: requests/s entering the graphs
    (their root calls, under the ``load`` rule), the unit of saturation rates.
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


# ---- shapes and costs per crossing ----------------------------------------------------------


def latency_shape(sketches: Mapping[int, LatencySketch], size: float) -> Shape | None:
    """The overhead shape of the sketch nearest to ``size`` in log size (None: no sketch)."""
    if not sketches:
        return None
    k = min(sketches, key=lambda s: abs(math.log(max(s, 1) / max(size, 1.0))))
    sk = sketches[k]
    return Shape.from_quantiles(sk.probs, sk.overhead_us())


@dataclass(frozen=True)
class _Crossings:
    """Per row and side (0 caller, 1 callee): latency of the side's two crossings (µs), its
    standard error, the CPU of the request and the response crossing (CPU-µs), the station."""

    lat: FloatArray  # rows × 2
    lse: FloatArray  # rows × 2
    cpu_req: FloatArray  # rows × 2
    cpu_resp: FloatArray  # rows × 2
    cse: FloatArray  # rows × 2 (both crossings)
    station: IntArray  # rows × 2, -1: no sidecar
    warnings: tuple[str, ...]


def _crossings(
    batch: EcgBatch, profiles: ProfileLookup, opts: TailOptions, split: bool = True
) -> _Crossings:
    """Costs per row and side at the rates the engine prices them at; ``split``: the request
    and the response crossing apart (else each half of the side's total, enough for loads)."""
    b = batch
    rates = None
    if opts.pod_cpus is not None:
        alpha = side_alphas(b, profiles) if opts.alpha is None else opts.alpha
        rates = priced_rates(b, opts.pod_cpus, alpha)
    full = hop_costs(b, profiles, rates=rates, speed=opts.speed)
    if split:
        req = hop_costs(replace(b, response_bytes=b.request_bytes), profiles, rates=rates)
        resp = hop_costs(replace(b, request_bytes=b.response_bytes), profiles, rates=rates)
        if opts.speed is not None:  # the halves only split the full costs: keep their ratio
            req, resp = _rescale(req, resp, full)
    else:
        req = resp = full

    def sides(c: Costs, what: str) -> FloatArray:
        a = c.latency_caller if what == "lat" else c.cpu_caller
        d = c.latency_callee if what == "lat" else c.cpu_callee
        return np.stack([a.sum(axis=1), d.sum(axis=1)], axis=1)

    n = batch.n_invocations
    station = np.stack([batch.caller, batch.callee], axis=1)
    meshed = np.stack([batch.caller_spec >= 0, batch.callee_spec >= 0], axis=1)
    station = np.where(meshed & (station >= 0), station, -1)
    se = np.repeat(full.latency_se[:, None] / 2, 2, axis=1) if n else np.zeros((0, 2))
    cse = np.repeat(full.cpu_se[:, None] / 2, 2, axis=1) if n else np.zeros((0, 2))
    return _Crossings(
        sides(full, "lat"),
        np.where(station >= 0, se, 0.0),
        sides(req, "cpu") / 2,
        sides(resp, "cpu") / 2,
        np.where(station >= 0, cse, 0.0),
        station.astype(np.int64),
        full.warnings,
    )


def _rescale(req: Costs, resp: Costs, full: Costs) -> tuple[Costs, Costs]:
    """Request and response halves scaled so they add up to ``full`` (its speed scaling)."""
    out = []
    tot_c = req.cpu_caller + resp.cpu_caller
    tot_d = req.cpu_callee + resp.cpu_callee
    with np.errstate(divide="ignore", invalid="ignore"):
        fc = np.where(tot_c > 0, 2 * full.cpu_caller / tot_c, 1.0)
        fd = np.where(tot_d > 0, 2 * full.cpu_callee / tot_d, 1.0)
    for c in (req, resp):
        out.append(replace(c, cpu_caller=c.cpu_caller * fc, cpu_callee=c.cpu_callee * fd))
    return out[0], out[1]


def _row_weights(batch: EcgBatch, load: str) -> FloatArray:
    """How much of its rate each row adds to the load: 1 (``graphs``), or 1 / the number of
    rows of its caller→callee pair (``pairs``: the rate is the pair's, counted once)."""
    n = batch.n_invocations
    if load == "graphs" or n == 0:
        return np.ones(n)
    key = (batch.caller + 1) * (len(batch.services) + 1) + batch.callee
    _, inv, counts = np.unique(key, return_inverse=True, return_counts=True)
    return np.asarray(1.0 / counts[inv], dtype=np.float64)


# ---- stations ---------------------------------------------------------------------------


SHARED = "shared CPUs"


@dataclass(frozen=True)
class _Stations:
    """The queues of a batch: ``names``/``modes``/``servers`` per station — each sidecar's
    workers (by service index), then the shared CPUs if the pods share some (``shared``, its
    index; -1: none). ``of_side``: rows × 2 → the sidecar's station (-1: no sidecar). Jobs as
    (station, rate, mean CPU-µs, shape index): a sidecar's crossings; on the shared CPUs, one
    job per request of each graph (all its sidecar work and ``app_mean_us`` of its own).
    ``base_*``: the shared CPUs without the mesh (the applications' work alone)."""

    names: tuple[str, ...]
    modes: tuple[str, ...]
    servers: tuple[int, ...]
    of_side: IntArray
    job_station: IntArray
    job_rate: FloatArray
    job_mean: FloatArray
    job_shape: IntArray
    shapes: tuple[Shape, ...]
    shared: int
    app_mean_us: float
    base_rate: float


def _spec_of_service(batch: EcgBatch) -> dict[int, int]:
    out: dict[int, int] = {}
    for svc, spec in ((batch.caller, batch.caller_spec), (batch.callee, batch.callee_spec)):
        for s, k in zip(svc.tolist(), spec.tolist()):
            if s >= 0 and k >= 0:
                out[s] = k
    return out


def request_rate(batch: EcgBatch, load: str) -> float:
    """Requests/s entering the graphs: their root calls' rates (``pairs``: once per pair)."""
    return float(_graph_rates(batch, load).sum())


def _graph_rates(batch: EcgBatch, load: str) -> FloatArray:
    """Requests/s of each graph (its root calls): under ``pairs`` the graphs are samples of
    one mix and share its request rate equally."""
    roots = batch.parent < 0
    w = (_row_weights(batch, load) * batch.rate)[roots]
    g = batch.graph_of()[roots]
    return np.asarray(np.bincount(g, weights=w, minlength=batch.n_graphs), dtype=np.float64)


def _stations(
    batch: EcgBatch, profiles: ProfileLookup, cx: _Crossings, opts: TailOptions
) -> _Stations:
    spec_of = _spec_of_service(batch)
    svcs = sorted(spec_of)
    mode_names = sorted({batch.specs[k].config.mode.value for k in spec_of.values()})
    shape_ix = {m: i for i, m in enumerate(mode_names)}
    shapes = tuple(_service_shape(batch, profiles, m, opts) for m in mode_names)
    shapes = (*shapes, Shape.constant())  # the last: a request's work on shared CPUs
    names = [batch.services[s] for s in svcs]
    modes = [batch.specs[spec_of[s]].config.mode.value for s in svcs]
    servers = [
        opts.workers
        or _profile_workers(profiles(batch.specs[spec_of[s]].platform), spec_of[s], batch)
        for s in svcs
    ]
    lut = np.full(len(batch.services) + 1, -1, dtype=np.int64)
    lut[svcs] = np.arange(len(svcs))
    of_side = np.where(cx.station >= 0, lut[np.maximum(cx.station, 0)], -1)
    w = _row_weights(batch, opts.load) * batch.rate
    st, rate, mean, shp = [], [], [], []
    for side in (0, 1):
        rows = np.flatnonzero(of_side[:, side] >= 0)
        row_specs = (batch.caller_spec if side == 0 else batch.callee_spec)[rows]
        mode_ix = np.array(
            [shape_ix[batch.specs[k].config.mode.value] for k in row_specs.tolist()],
            dtype=np.int64,
        )
        for cpu in (cx.cpu_req, cx.cpu_resp):
            st.append(of_side[rows, side])
            rate.append(w[rows])
            mean.append(cpu[rows, side])
            shp.append(mode_ix)
    shared = -1
    base_rate = 0.0
    if opts.pod_cpus is not None:
        shared = len(names)
        names.append(SHARED)
        modes.append("")
        servers.append(opts.pod_cpus)
        work = np.bincount(
            batch.graph_of(),
            weights=(cx.cpu_req + cx.cpu_resp).sum(axis=1),
            minlength=batch.n_graphs,
        )
        gr = _graph_rates(batch, opts.load)
        st.append(np.full(batch.n_graphs, shared))
        rate.append(gr)
        mean.append(work + opts.app_cpu_us)
        shp.append(np.full(batch.n_graphs, len(shapes) - 1))
        base_rate = float(gr.sum())
    cat = np.concatenate
    return _Stations(
        tuple(names),
        tuple(modes),
        tuple(servers),
        of_side.astype(np.int64),
        cat(st).astype(np.int64) if st else np.zeros(0, dtype=np.int64),
        cat(rate) if rate else np.zeros(0),
        cat(mean) if mean else np.zeros(0),
        cat(shp).astype(np.int64) if shp else np.zeros(0, dtype=np.int64),
        shapes,
        shared,
        opts.app_cpu_us,
        base_rate,
    )


def _profile_workers(profile: Profile, spec: int, batch: EcgBatch) -> int:
    mp = profile.modes.get(batch.specs[spec].config.mode)
    return mp.capacity.workers if mp is not None and mp.capacity is not None else 1


def _service_shape(batch: EcgBatch, profiles: ProfileLookup, mode: str, opts: TailOptions) -> Shape:
    if opts.service == "constant":
        return Shape.constant()
    spec = next(s for s in batch.specs if s.config.mode.value == mode)
    mp = profiles(spec.platform).modes.get(spec.config.mode)
    shape = None if mp is None else latency_shape(mp.latency_sketches, DEFAULT_MESSAGE_BYTES)
    return shape or Shape.constant()


def _station_mix(sts: _Stations, k: int, scale: float) -> tuple[float, ServiceMix] | None:
    """Arrival rate and service mix of station ``k`` (sidecar CPU × ``scale``; None: idle)."""
    sel = (sts.job_station == k) & (sts.job_rate > 0)
    means = sts.job_mean[sel]
    if k == sts.shared:  # a request's sidecar work scales, its application work does not
        means = (means - sts.app_mean_us) * scale + sts.app_mean_us
    else:
        means = means * scale
    rates = sts.job_rate[sel]
    if rates.sum() <= 0 or not (means > 0).any():
        return None
    # identical classes (same mean and shape) merge: traces repeat the same calls many times
    key = np.stack([np.round(means, 6), sts.job_shape[sel].astype(np.float64)], axis=1)
    uniq, inv = np.unique(key, axis=0, return_inverse=True)
    w = np.bincount(inv.ravel(), weights=rates, minlength=len(uniq))
    of = tuple(int(x) for x in uniq[:, 1])
    mix = ServiceMix(tuple(uniq[:, 0].tolist()), tuple(w.tolist()), sts.shapes, of)
    return float(rates.sum()), mix


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
    rows_part = s.child_idx[: s.child_ptr[n]]
    root_part = s.child_idx[s.child_ptr[n] :]
    idx = np.concatenate([(rows_part[None, :] + off).ravel(), (root_part[None, :] + off).ravel()])
    gptr = np.concatenate([(s.graph_ptr[:-1][None, :] + off).ravel(), [copies * n]])
    return Structure(
        ptr,
        idx.astype(np.int64),
        gptr.astype(np.int64),
        np.tile(s.start, copies),
        np.tile(s.end, copies),
    )


@dataclass(frozen=True)
class _Run:
    """One Monte Carlo run: draws × graphs of latency with the mesh, station summaries."""

    new: FloatArray  # samples × graphs
    rho: FloatArray
    mean_wait: FloatArray
    p99_wait: FloatArray


def _simulate(
    batch: EcgBatch,
    cx: _Crossings,
    sts: _Stations,
    shape: Structure,
    tile: Structure,
    lat_shapes: tuple[IntArray, tuple[Shape, ...]],
    m: int,
    opts: TailOptions,
    sign: float,
) -> _Run:
    """Draw ``m`` samples of every graph with costs moved ``sign`` × 1.96 standard errors."""
    rng = np.random.default_rng(opts.seed)
    n = batch.n_invocations
    lat = np.maximum(cx.lat + sign * Z95 * cx.lse, 0.0)
    scale = max(1.0 + sign * Z95 * _rel_se(cx), 0.0)
    S = len(sts.names)
    waits: list[FloatArray | None] = []
    rho = np.zeros(S)
    for k in range(S):
        got = _station_mix(sts, k, scale)
        if got is None:
            waits.append(np.zeros(1))
            continue
        st = Station(got[0], sts.servers[k], got[1], opts.arrivals)
        rho[k] = st.utilisation
        if sts.shared >= 0 and k != sts.shared:
            waits.append(np.zeros(1))  # on shared CPUs a worker waits for the CPUs
            continue
        try:
            waits.append(waiting_times(st, opts.queue_jobs, seed=opts.seed + 7 * k + 1))
        except SaturatedError:
            waits.append(None)
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
        new = new + _shared_wait(sts, waits[sts.shared], cpus, opts, rng, new.shape)
    mean_w = np.array([np.inf if w is None else float(w.mean()) for w in waits])
    p99_w = np.array([np.inf if w is None else float(np.quantile(w, 0.99)) for w in waits])
    return _Run(new, rho, mean_w, p99_w)


def _shared_wait(
    sts: _Stations,
    mesh: FloatArray | None,
    cpus: int,
    opts: TailOptions,
    rng: np.random.Generator,
    shape: tuple[int, ...],
) -> FloatArray:
    """What a request waits on the shared CPUs more than it would without the sidecars: the
    two waiting times at one rank (the same request on a busier CPU)."""
    if mesh is None:
        return np.full(shape, np.inf)
    u = rng.random(shape)
    out = _pick(mesh, u)
    if sts.app_mean_us > 0 and sts.base_rate > 0:
        app = ServiceMix((sts.app_mean_us,), (1.0,))
        alone = Station(sts.base_rate, cpus, app, opts.arrivals)
        try:
            out = out - _pick(waiting_times(alone, opts.queue_jobs, seed=opts.seed + 3), u)
        except SaturatedError:
            pass  # the application alone saturates its CPUs: so does it with the mesh
    return np.maximum(out, 0.0)


def shape_base(s: Structure) -> FloatArray:
    """Mesh-free end-to-end latency of every graph of a structure."""
    return propagate(s, np.zeros_like(s.start)).base_us


def _rel_se(cx: _Crossings) -> float:
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
    batch: EcgBatch, profiles: ProfileLookup, cx: _Crossings, warnings: list[str]
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
    cx = _crossings(batch, profiles, opts)
    warnings += cx.warnings
    sts = _stations(batch, profiles, cx, opts)
    lat_shapes = _lat_shapes(batch, profiles, cx, warnings)
    shape = structure(batch)
    m = int(max(20, min(opts.samples, opts.max_rows // max(batch.n_invocations, 1))))
    tile = tiled(shape, m)
    runs = [
        _simulate(batch, cx, sts, shape, tile, lat_shapes, m, opts, s) for s in (0.0, -1.0, 1.0)
    ]
    base = shape_base(shape)
    ps = opts.percentiles
    mid, lo, hi = runs
    q = _quantiles(mid.new, ps).T  # graphs × P
    err = _mc_error(mid.new, ps).T
    q_lo = np.minimum(_quantiles(lo.new, ps).T, q) - Z95 * err
    q_hi = np.maximum(_quantiles(hi.new, ps).T, q) + Z95 * err
    pooled = [_quantiles(r.new.ravel(), ps) for r in runs]
    pb = _quantiles(base, ps)
    pe = _mc_error(mid.new.reshape(-1, 1), ps)[:, 0]
    rate = request_rate(batch, opts.load)
    loads = _loads(batch, profiles, opts, sts, mid)
    for st in loads:
        if st.saturated:
            warnings.append(
                f"{st.name}: utilisation {st.utilisation:.2f} ≥ 1 at these rates — its queue "
                "grows without bound, so latencies through it are infinite (saturated)"
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
        stations=loads,
        request_rate=rate,
        samples=m,
        threshold=opts.threshold,
        warnings=tuple(dict.fromkeys(warnings)),
    )


# ---- saturation -------------------------------------------------------------------------


#: rate factors the utilisation is evaluated at to find where it crosses the threshold
FACTORS = np.logspace(-3, 3, 25)


def _rho_at(batch: EcgBatch, profiles: ProfileLookup, opts: TailOptions, f: float) -> FloatArray:
    scaled = replace(batch, rate=batch.rate * f)
    cx = _crossings(scaled, profiles, opts, split=False)
    sts = _stations(scaled, profiles, cx, opts)
    out = np.zeros(len(sts.names))
    for k in range(len(sts.names)):
        got = _station_mix(sts, k, 1.0)
        if got is not None:
            out[k] = got[0] * got[1].mean() * 1e-6 / sts.servers[k]
    return out


def _crossing(grid: FloatArray, level: float) -> float:
    """The rate factor at which a utilisation curve on :data:`FACTORS` reaches ``level``
    (log–log interpolation between the grid points around it; inf: never)."""
    above = np.flatnonzero(grid >= level)
    if grid.max() <= 0 or above.size == 0:
        return math.inf
    j = int(above[0])
    if j == 0:
        return float(FACTORS[0] * level / grid[0])
    x0, x1 = math.log(FACTORS[j - 1]), math.log(FACTORS[j])
    y0, y1 = math.log(max(grid[j - 1], 1e-300)), math.log(grid[j])
    t = (math.log(level) - y0) / (y1 - y0) if y1 != y0 else 1.0
    return float(math.exp(x0 + t * (x1 - x0)))


def _loads(
    batch: EcgBatch, profiles: ProfileLookup, opts: TailOptions, sts: _Stations, run: _Run
) -> tuple[StationLoad, ...]:
    """Each station's load, and the rate factors at which it reaches the threshold and
    saturates (the utilisation on a log grid of factors, interpolated in log–log: ρ is a rate
    times a cost that varies with log rate)."""
    grid = np.stack([_rho_at(batch, profiles, opts, float(f)) for f in FACTORS])  # F × S
    out = []
    for k, name in enumerate(sts.names):
        rho = float(run.rho[k])
        out.append(
            StationLoad(
                name,
                sts.modes[k],
                sts.servers[k],
                float(sts.job_rate[sts.job_station == k].sum()),
                _mean_service(sts, k),
                rho,
                _crossing(grid[:, k], opts.threshold),
                _crossing(grid[:, k], 1.0),
                rho * sts.servers[k] / opts.threshold,
                float(run.mean_wait[k]),
                float(run.p99_wait[k]),
            )
        )
    return tuple(out)


def _mean_service(sts: _Stations, k: int) -> float:
    got = _station_mix(sts, k, 1.0)
    return 0.0 if got is None else got[1].mean()
