"""The load side of the tail model (:mod:`meshtax.predict.tail`): what each crossing costs at
the rates the engine prices it at, the queues (*stations*) those costs load — each sidecar's
workers, and the pods' shared CPUs when they share some — and where each queue saturates.

Saturation (where each queue reaches the threshold and 1): :mod:`meshtax.predict.saturation`;
the rates (rows' weights, each sidecar's and graph's): :mod:`meshtax.predict.rates`; a
topology's sidecars priced from the capacity ramp: :mod:`meshtax.predict.ramp_price`. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import numpy.typing as npt

from meshtax.model.capacity import LatencySketch
from meshtax.model.ecg import DEFAULT_MESSAGE_BYTES, EcgBatch
from meshtax.model.profile import Profile
from meshtax.model.speed import Speed
from meshtax.predict.engine import Costs, ProfileLookup, hop_costs
from meshtax.predict.load_factor import (
    BASE,
    load_factor,
    queue_factor,
    queue_relief,
    queued_factor,
)
from meshtax.predict.queueing import ServiceMix, Shape
from meshtax.predict.rates import graph_rates, request_rate, row_weights, sidecar_rates
from meshtax.predict.shared_cpu import shared_cpu_rates

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

__all__ = [
    "SHARED",
    "Crossings",
    "StationLoad",
    "Stations",
    "TailOptions",
    "at_load",
    "crossings",
    "graph_rates",
    "latency_shape",
    "load_factor",
    "queue_factor",
    "queued_factor",
    "queued_requests",
    "request_rate",
    "row_weights",
    "sidecar_rates",
    "station_mix",
    "stations",
]


@dataclass(frozen=True)
class TailOptions:
    """What a tail prediction assumes; see the module docstring.

    ``samples``: draws per graph (fewer for large batches: at most ``max_rows`` rows are
    propagated per run); ``arrivals``: squared coefficient of variation of each station's
    interarrival times (1: Poisson, independent clients; 0: evenly spaced);
    ``service``: the shape of a sidecar's job's service time — ``latency`` (the latency
    shape's, so its variability includes wake-up stalls), or ``constant`` (its mean:
    per-message CPU work that does not vary); ``shared_scv``: the squared coefficient of
    variation of a request's work on shared CPUs (1: exponential; 0: constant);
    ``workers``: worker threads per sidecar (None: the profile's measured capacity's, else 1,
    the profiler's Envoy); ``app_cpu_us``: on shared CPUs, the applications' CPU-µs per
    request without the mesh (0: their own waits are not counted); ``clients``: at most that
    many requests in flight (a load generator's connections; None: open arrivals);
    ``jitter_us``: arrivals on a paced schedule, each late by an exponential lag of this mean
    (fortio ``-uniform`` at a fixed rate; :class:`~meshtax.predict.queueing.Station`),
    instead of ``arrivals``; ``wakeup_us`` (with ``clients``): the load generator sends only
    when awake — on a response, else every ``wakeup_us`` when idle (Go's netpoller: 1 000 µs;
    :class:`~meshtax.predict.queueing.Station`); ``stalls``: add the stall backlog (see
    ``predict.tail``);
    ``relief`` (shared CPUs with ``clients``): a request's sidecar work cheaper as the queue
    grows (:func:`~meshtax.predict.load_factor.queue_relief`), with ``batching`` only from one
    request in the system on;
    ``cost_scale``: every crossing's latency and CPU × this — a topology's calibration, the
    mesh's CPU per request measured ÷ priced at a load level that is not predicted
    (``validate.tail.cost_calibration``; 1: the profile alone);
    ``ramp_price`` (shared CPUs): the cost scale ×
    :func:`~meshtax.predict.ramp_price.ramp_price`'s scale — a request's sidecar work what the
    profile's capacity ramp measured its sidecar using at each sidecar's own rate (a
    topology's: :func:`~meshtax.predict.ramp_price.priced_from_ramp` turns it on for
    ``meshtax predict`` and the validation's topologies; issue #20, set 11);
    ``ramp_queue`` (shared CPUs): what a request waits more with the mesh at most the queue
    the profile's capacity ramp showed at the same load fraction, in the station's times per
    request (:mod:`~meshtax.predict.ramp_queue`; held on set 12, on through
    :func:`~meshtax.predict.ramp_queue.bounded_by_ramp`).
    ``ramp_shape`` (with ``ramp_price``): (coefficient, exponent) — the ramp's sidecar CPU per
    request below a quarter of its closed loop's rate read from this power law of the rate's
    fraction of the closed loop's, × the closed loop's own CPU per request, instead of the
    ramp's runs there (:func:`~meshtax.predict.load_factor.ramp_sidecar_us`; None: the runs).
    ``closed_shape`` (with ``ramp_price`` and ``ramp_shape``, shared CPUs): at the closed
    loop's maximum (ρ = 1) each sidecar costs u_R × (rate ÷ R)^exponent — the shape's power law
    through the profile's own closed loop (rate R, CPU-µs a request u_R) — instead of the
    models' price × the queue factor (:func:`~meshtax.predict.ramp_price.closed_loop_scale`).
    ``shared_shape`` (shared CPUs): a request's work there varies as this shape (mean 1)
    instead of a gamma of ``shared_scv`` (an experiment's: issue #20, set 15).
    ``ramp_heavy`` (with ``ramp_queue``): the ramp's queue between two runs interpolated in
    1 ÷ (1 − load fraction) instead of the fraction; ``ramp_own_bed`` (with ``ramp_queue``):
    the shared CPUs are the profile's own bed (one hop), so the load fraction and the unit
    are its closed loop's measured maximum instead of the predicted saturation rate
    (experiments' options: issue #20, set 16). ``ramp_plateau``: the load factor's capacity
    runs at ≥ 3/4 of the closed loop's rate priced at their plateau's busy CPU (the mean of
    their CPU-seconds a second) ÷ each one's rate (:func:`load_factor`; issue #20, set 17).
    ``ramp_pooled`` (with ``ramp_queue``): the ramp's queue read from this table — (load
    fractions, one row of requests' worth per fraction at ``SKETCH_PROBS``), pooled over
    profiles' ramps (:func:`~meshtax.predict.ramp_queue.pooled_queue`) — instead of the
    profile's own single runs (an experiment's: issue #20, set 18). ``ramp_repeats`` (with
    ``ramp_queue``): a profile whose ramp measured its top rates more than once
    (``Capacity.repeats``) bounds with the median of its own draws there, ahead of
    ``ramp_pooled``, which stays the bound of a profile without repeats (an experiment's: issue
    #20, registered before set 19 as ``s19-own-repeats``, not held there).
    ``ramp_own_shape`` (with ``ramp_price`` and ``ramp_shape``): below a quarter of the closed
    loop's rate each mode's ramp price reads the profile's own shape, fitted on its ramp's runs
    there (:func:`~meshtax.predict.ramp_price.own_shape`), ``ramp_shape`` only for a profile
    without enough of them (issue #20, registered before set 20 as ``s20-own-shape`` and held
    there; :func:`~meshtax.predict.ramp_price.priced_from_ramp` turns it on).
    ``ramp_form`` (with ``ramp_queue``): the bound is the profile's own queue form, one constant
    fitted on all its ramp's draws at ≥ half the closed loop
    (:func:`~meshtax.predict.ramp_queue.queue_form`), ahead of ``ramp_pooled``, which stays the
    bound of a profile without enough draws (an experiment's: issue #20, registered before set
    21 as ``s21-queue-form``, not held there).
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
    shared_scv: float = 1.0
    clients: int | None = None
    jitter_us: float | None = None
    wakeup_us: float | None = None
    stalls: bool = False
    cost_scale: float = 1.0
    ramp_price: bool = False
    ramp_queue: bool = False
    ramp_shape: tuple[float, float] | None = None
    closed_shape: bool = False
    shared_shape: Shape | None = None
    ramp_heavy: bool = False
    ramp_own_bed: bool = False
    ramp_plateau: bool = False
    ramp_pooled: tuple[tuple[float, ...], tuple[tuple[float, ...], ...]] | None = None
    ramp_repeats: bool = False
    ramp_own_shape: bool = False
    ramp_form: bool = False
    relief: bool = True
    batching: bool = True
    load: Literal["graphs", "pairs"] = "graphs"
    queue_jobs: int = 200_000
    max_rows: int = 2_000_000
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
        if (self.clients is not None and self.clients < 1) or self.shared_scv < 0:
            raise ValueError("clients must be at least 1 and shared_scv ≥ 0")
        if self.jitter_us is not None and not 0 <= self.jitter_us < math.inf:
            raise ValueError(f"jitter_us must be finite and ≥ 0, got {self.jitter_us}")
        if self.wakeup_us is not None and (
            not 0 < self.wakeup_us < math.inf or self.clients is None
        ):
            raise ValueError(f"wakeup_us must be finite, > 0 and with clients: {self.wakeup_us}")
        if not 0 < self.cost_scale < math.inf:
            raise ValueError(f"cost_scale must be finite and > 0, got {self.cost_scale}")
        if self.ramp_shape is not None and not (
            0 < self.ramp_shape[0] < math.inf and -math.inf < self.ramp_shape[1] <= 0
        ):
            raise ValueError(
                f"ramp_shape must be (coefficient > 0, exponent ≤ 0): {self.ramp_shape}"
            )


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


# ---- shapes and costs per crossing ----------------------------------------------------------


def latency_shape(sketches: Mapping[int, LatencySketch], size: float) -> Shape | None:
    """The overhead shape of the sketch nearest to ``size`` in log size (None: no sketch)."""
    if not sketches:
        return None
    k = min(sketches, key=lambda s: abs(math.log(max(s, 1) / max(size, 1.0))))
    sk = sketches[k]
    return Shape.from_quantiles(sk.probs, sk.overhead_us())


@dataclass(frozen=True)
class Crossings:
    """Per row and side (0 caller, 1 callee): latency of the side's two crossings (µs), its
    standard error, the CPU of the request and the response crossing (CPU-µs), the station."""

    lat: FloatArray  # rows × 2
    lse: FloatArray  # rows × 2
    cpu_req: FloatArray  # rows × 2
    cpu_resp: FloatArray  # rows × 2
    cse: FloatArray  # rows × 2 (both crossings)
    station: IntArray  # rows × 2, -1: no sidecar
    warnings: tuple[str, ...]


def crossings(
    batch: EcgBatch,
    profiles: ProfileLookup,
    opts: TailOptions,
    split: bool = True,
    queued: bool = False,
) -> Crossings:
    """Costs per row and side at the rates the engine prices them at; ``split``: the request
    and the response crossing apart (else each half of the side's total, enough for loads);
    ``queued``: a closed loop at its maximum — each sidecar with its share of the clients'
    requests queued (:func:`queued_requests`, :func:`queue_factor`)."""
    b = batch
    rates = None if opts.pod_cpus is None else shared_cpu_rates(b, opts.pod_cpus)
    at = sidecar_rates(b, opts.load)
    plain = hop_costs(b, profiles, rates=rates, speed=opts.speed)
    queue = queued_requests(b, profiles, plain, opts) if queued else None
    top = opts.ramp_plateau
    full = at_load(plain, b, profiles, at, queue, top)
    if split:
        req = hop_costs(replace(b, response_bytes=b.request_bytes), profiles, rates=rates)
        resp = hop_costs(replace(b, request_bytes=b.response_bytes), profiles, rates=rates)
        req = at_load(req, b, profiles, at, queue, top)
        resp = at_load(resp, b, profiles, at, queue, top)
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
    k = opts.cost_scale
    return Crossings(
        sides(full, "lat") * k,
        np.where(station >= 0, se, 0.0) * k,
        sides(req, "cpu") / 2 * k,
        sides(resp, "cpu") / 2 * k,
        np.where(station >= 0, cse, 0.0) * k,
        station.astype(np.int64),
        full.warnings,
    )


#: the components a capacity run's CPU stands for (a plain sidecar: no filters, no TLS)
def queued_requests(
    batch: EcgBatch, profiles: ProfileLookup, plain: Costs, opts: TailOptions
) -> FloatArray:
    """Per row and side, the requests queued at that side's sidecar when a closed loop of
    clients is at its maximum: all ``clients`` (else the profile's capacity connections) are
    in the system, and on shared CPUs they wait at each sidecar in proportion to its share of
    a request's CPU work there (the sidecars' at the CPU models' price, plus ``app_cpu_us``);
    a sidecar on CPUs of its own has them all. One hop: nearly all clients at its sidecar;
    Bookinfo's five: a few each (issue #20, set 2: one hop's closed-loop cost per crossing,
    0.29 of one client's, made Bookinfo's maximum 12 % early in one sitting and 45 % in
    another; its sidecars cost 0.43–0.8 there)."""
    n = batch.n_invocations
    out = np.zeros((n, 2))
    if n == 0:
        return out
    svc = np.stack([batch.caller, batch.callee], axis=1)
    meshed = np.stack([batch.caller_spec >= 0, batch.callee_spec >= 0], axis=1) & (svc >= 0)
    clients = opts.clients
    if clients is None:
        caps = [
            mp.capacity.connections
            for spec in batch.specs
            if (mp := profiles(spec.platform).modes.get(spec.config.mode)) is not None
            and mp.capacity is not None
        ]
        clients = max(caps, default=1)
    if opts.pod_cpus is None:
        out[meshed] = float(clients)
        return out
    w = row_weights(batch, opts.load) * batch.rate
    cpu = np.stack([plain.cpu_caller.sum(axis=1), plain.cpu_callee.sum(axis=1)], axis=1)
    cpu = cpu * opts.cost_scale
    per = np.bincount(
        svc[meshed], weights=(cpu * w[:, None])[meshed], minlength=len(batch.services)
    )
    total = per.sum() + opts.app_cpu_us * request_rate(batch, opts.load)
    if total <= 0:
        return out
    out[meshed] = clients * per[svc[meshed]] / total
    return out


def at_load(
    costs: Costs,
    batch: EcgBatch,
    profiles: ProfileLookup,
    rates: FloatArray,
    queued: FloatArray | None = None,
    plateau: bool = False,
) -> Costs:
    """``costs`` with each side's base CPU × :func:`load_factor` of its mode at ``rates`` (per
    row, or per row and side as :func:`sidecar_rates` gives; ``plateau``: its runs near the
    closed loop at their plateau); ``queued`` (rows × 2, requests queued at each side's
    sidecar): × the mode's :func:`queue_factor` there instead, where the profile has one."""
    cols = [k for k, c in enumerate(costs.components) if c in BASE]
    out = {}
    r2 = rates if rates.ndim == 2 else np.repeat(rates[:, None], 2, axis=1)
    for side, (name, specs) in enumerate(
        (("cpu_caller", batch.caller_spec), ("cpu_callee", batch.callee_spec))
    ):
        f = np.ones(batch.n_invocations)
        for s, spec in enumerate(batch.specs):
            rows = np.flatnonzero(specs == s)
            mp = profiles(spec.platform).modes.get(spec.config.mode) if rows.size else None
            if mp is not None:
                q = None if queued is None else queue_factor(mp, queued[rows, side])
                f[rows] = q if q is not None else load_factor(mp, r2[rows, side], plateau)
        c = getattr(costs, name).copy()
        c[:, cols] *= f[:, None]
        out[name] = c
    return replace(costs, **out)


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


# ---- stations ---------------------------------------------------------------------------


SHARED = "shared CPUs"


@dataclass(frozen=True)
class Stations:
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
    relief: tuple[float, ...] | None = None


def _spec_of_service(batch: EcgBatch) -> dict[int, int]:
    out: dict[int, int] = {}
    for svc, spec in ((batch.caller, batch.caller_spec), (batch.callee, batch.callee_spec)):
        for s, k in zip(svc.tolist(), spec.tolist()):
            if s >= 0 and k >= 0:
                out[s] = k
    return out


def stations(
    batch: EcgBatch, profiles: ProfileLookup, cx: Crossings, opts: TailOptions
) -> Stations:
    spec_of = _spec_of_service(batch)
    svcs = sorted(spec_of)
    mode_names = sorted({batch.specs[k].config.mode.value for k in spec_of.values()})
    shape_ix = {m: i for i, m in enumerate(mode_names)}
    shapes = tuple(_service_shape(batch, profiles, m, opts) for m in mode_names)
    work_shape = opts.shared_shape or Shape.gamma(opts.shared_scv)
    shapes = (*shapes, work_shape)  # the last: a request's on shared CPUs
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
    w = row_weights(batch, opts.load) * batch.rate
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
        gr = graph_rates(batch, opts.load)
        st.append(np.full(batch.n_graphs, shared))
        rate.append(gr)
        mean.append(work + opts.app_cpu_us)
        shp.append(np.full(batch.n_graphs, len(shapes) - 1))
        base_rate = float(gr.sum())
    relief = _relief(batch, profiles, cx, opts) if shared >= 0 else None
    cat = np.concatenate
    return Stations(
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
        relief,
    )


def _relief(
    batch: EcgBatch, profiles: ProfileLookup, cx: Crossings, opts: TailOptions
) -> tuple[float, ...] | None:
    """The shared CPUs' service factor by the requests in the system (index 0…clients): a
    request's sidecar work × each sidecar's :func:`queue_relief` at its share of them (its
    share of the sidecars' CPU per request: one hop's sidecar has them all), its
    applications' work unchanged. None: no ``clients``, no ``relief``, no sidecar work, or a
    single sidecar — one hop is the profile's own bed: at a rate, its queue is the one the
    capacity run at that rate had, so the rate's price holds (issue #20, sets 1–3: one hop's
    CPU per request followed the rate whatever its queue — 60 µs with 9 requests in the system
    at 50 % load against the ramp's 62.5 with 3 — and relief cut its p90 by 40–50 %).
    Several sidecars on shared CPUs hold queues the one-hop ramp never had at their rates:
    Bookinfo's mesh CPU per request fell 25 % from 75 to 90 % load with the CPU full, its
    sidecars' rates rising 20 %."""
    if not opts.relief or opts.clients is None:
        return None
    rr = request_rate(batch, opts.load)
    spec_of = _spec_of_service(batch)
    w = row_weights(batch, opts.load) * batch.rate
    svc = np.stack([batch.caller, batch.callee], axis=1)
    rates = sidecar_rates(batch, opts.load)
    work = (cx.cpu_req + cx.cpu_resp) * w[:, None]
    per, at = {}, {}
    for s in spec_of:
        sel = (svc == s) & (cx.station >= 0)
        if sel.any() and rr > 0:
            per[s] = float(work[sel].sum()) / rr
            at[s] = float(rates[sel].max())
    total = sum(per.values())
    if total <= 0 or len(per) < 2:
        return None
    q = np.arange(opts.clients + 1, dtype=np.float64)
    mesh = np.zeros_like(q)
    for s, m in per.items():
        spec = batch.specs[spec_of[s]]
        mp = profiles(spec.platform).modes.get(spec.config.mode)
        h = np.ones_like(q) if mp is None else queue_relief(mp, at[s], q * m / total, opts.batching)
        mesh += m * h
    out = (opts.app_cpu_us + mesh) / (opts.app_cpu_us + total)
    return tuple(float(x) for x in np.clip(out, 1e-6, 1.0))


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


def station_mix(sts: Stations, k: int, scale: float) -> tuple[float, ServiceMix] | None:
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
