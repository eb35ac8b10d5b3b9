"""Predict sidecar overhead for a batch of call graphs (pure, vectorized).

For every invocation the request crosses the caller's sidecar outbound and the callee's
sidecar inbound; the response crosses them in reverse. Each crossing costs every component
of that sidecar's mode plus each filter of its chain (and TLS where mTLS is on), evaluated at
the message size and the invocation's rate. A tcp-mode sidecar forwarding a protocol its
profile measured on the wire (``ModeProfile.carried``: gRPC is several TCP writes per call)
is priced with those models. A call that opens a new connection (``new_connections``, the
share of calls that do) also pays, at each sidecar, what the profile measured per connection:
the mTLS handshake where mTLS is on, and filters that run once per connection (network RBAC).
CPU sums over all invocations and all crossings at their rates;
latency adds each invocation's crossings to its duration and recomputes the end-to-end
latency (:mod:`meshtax.predict.critical_path`).

Placement (``pod_cpus``): the critical path assumes every pod has CPUs of its own. When the
graph's pods share ``k`` CPUs, a request's added CPU work ``W`` (all its crossings) cannot
finish in less than ``W / k`` even if it sits off the critical path — parallel calls and the
work a sidecar does after forwarding queue behind each other. With one request in flight on
one shared CPU this bound is exact (measured here: latency overhead ÷ CPU overhead = 1.00 in
the http/grpc validation cases); with ``k`` CPUs the overhead is ``max(critical path, W / k)``.

Shared CPUs also change what a message costs: how warm the CPU is depends on all the traffic
on it, not the sidecar's own alone; :mod:`meshtax.predict.shared_cpu` says at which rate.

Idle sidecars: a proxy burns CPU with no traffic at all (timers, stats flushes: ~2 ms per
second for one Envoy here). A profile that measured it (``ModeProfile.idle_cpu_us_per_s``)
keeps it out of its per-message models, and every sidecar a graph crosses adds it once, per
second, to the graph's CPU (in Other) — a cost per sidecar, not per message, so ten sidecars
at 20 requests/s spend ten times what the one profiled sidecar's share of a message says.
Its own critical path does not include it; on shared CPUs the request's share of it (per
second ÷ the graph's rate) is part of the CPU work the latency is bounded by.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from meshtax.errors import PredictError
from meshtax.model.components import (
    BASE_COMPONENTS,
    OTHER,
    TLS,
    UNATTRIBUTED,
    Component,
    filter_component,
)
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.ecg import PROTOCOLS, EcgBatch, SidecarSpec
from meshtax.model.profile import ModeProfile, Profile, TlsModels
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.model.speed import Speed, speed_factor
from meshtax.model.transfer import key as transfer_key
from meshtax.predict.critical_path import Propagation, Structure, propagate, structure
from meshtax.predict.shared_cpu import shared_cpu_rates

FloatArray = npt.NDArray[np.float64]
Z95 = 1.959963984540054


class PredictionError(PredictError):
    """The profile cannot price a sidecar configuration of the graph (e.g. an unprofiled filter)."""


ProfileLookup = Callable[[str | None], Profile]


@dataclass(frozen=True)
class Costs:
    """Per-row, per-component costs of one batch (rows × components).

    ``latency`` in µs added to each invocation; ``cpu`` in CPU-µs per call (all crossings);
    ``*_caller``/``*_callee`` split them by whose sidecar they are spent in.
    ``latency_se`` is a per-row standard error, summed linearly over components and
    crossings (i.e. treated as fully correlated: a conservative interval).
    """

    components: tuple[Component, ...]
    latency_caller: FloatArray
    latency_callee: FloatArray
    cpu_caller: FloatArray
    cpu_callee: FloatArray
    latency_se: FloatArray
    cpu_se: FloatArray
    warnings: tuple[str, ...] = ()

    @property
    def latency(self) -> FloatArray:
        return self.latency_caller + self.latency_callee

    @property
    def cpu(self) -> FloatArray:
        return self.cpu_caller + self.cpu_callee


def spec_models(
    spec: SidecarSpec,
    profile: Profile,
    warnings: list[str],
    protocol: str = "",
    speed: Speed | None = None,
    *,
    cpu_as_latency: bool = False,
) -> dict[Component, tuple[CostModel, CostModel]]:
    """Latency and CPU model of every component a message crossing this sidecar pays, for an
    invocation speaking ``protocol`` (one of :data:`~meshtax.model.ecg.PROTOCOLS`); with
    ``speed`` (the machine's speed now) each component scaled by how much faster or slower
    its kind of work runs now than when the profile measured it; with the profile's
    :class:`~meshtax.model.transfer.Transfer` (measured on a calibration set) every component
    scaled by the factor of the cost model the message is priced with (the mode's, or the tcp
    mode's model of the protocol it carries): latency by its latency factor, CPU by its CPU
    factor — or, ``cpu_as_latency``, by the latency factor too (the CPU work a shared CPU bounds
    a request's latency with)."""
    models = _spec_models(spec, profile, warnings, protocol)
    k = _model_key(spec, profile, protocol)
    tr = profile.transfer
    t_lat = 1.0 if tr is None else tr.latency_factor(k)
    t_cpu = t_lat if cpu_as_latency else 1.0 if tr is None else tr.factor(k)
    then = profile.speed
    if speed is not None and then is None:
        warnings.append(
            f"profile {profile.name!r} recorded no machine speed: its costs are used as measured"
        )
        speed = None
    if speed is None and t_lat == 1.0 and t_cpu == 1.0:
        return models
    out = {}
    for c, (lat, cpu) in models.items():
        f = 1.0 if speed is None or then is None else speed_factor(c, speed, then)
        out[c] = (lat.scaled(t_lat * f), cpu.scaled(t_cpu * f))
    return out


def _model_key(spec: SidecarSpec, profile: Profile, protocol: str) -> str:
    """Which of the profile's cost models prices the message (:func:`meshtax.model.transfer.key`)."""
    mode = spec.config.mode
    mp = profile.modes.get(mode)
    carried = protocol if mp is not None and mode is Mode.TCP and protocol in mp.carried else ""
    return transfer_key(mode, carried)


def _spec_models(
    spec: SidecarSpec, profile: Profile, warnings: list[str], protocol: str = ""
) -> dict[Component, tuple[CostModel, CostModel]]:
    try:
        mp = profile.mode(spec.config.mode)
    except KeyError as e:
        raise PredictionError(
            f"{e.args[0]}; profile that mode, or describe the service with a mode the profile has"
        ) from None
    models: dict[Component, tuple[CostModel, CostModel]] = {}
    for c, m in _base(mp, protocol, profile.name, warnings).items():
        models[c] = (m.latency, m.cpu)
    missing = []
    for f in spec.config.filters:
        fc = filter_component(f)
        if fc not in mp.components:
            missing.append(f)
            continue
        m = mp.components[fc]
        # a filter listed twice in a chain runs twice
        lat, cpu = models.get(fc, (None, None))
        models[fc] = (
            m.latency if lat is None else _sum(lat, m.latency),
            m.cpu if cpu is None else _sum(cpu, m.cpu),
        )
    if missing:
        have = ", ".join(mp.filters()) or "none"
        raise PredictionError(
            f"profile {profile.name!r} has no {spec.config.mode.value}-mode model for filter(s) {', '.join(missing)} "
            f"(profiled filters: {have}); profile them with `meshtax profile --filters ...` or "
            "remove them from the configuration"
        )
    if spec.config.mtls:
        tls = tls_models(mp, spec.config, profile.name, warnings)
        if tls is not None and tls.per_message is not None:
            models[TLS] = (tls.per_message.latency, tls.per_message.cpu)
        elif tls is not None:
            warnings.append(
                f"profile {profile.name!r} has no TLS model in {spec.config.mode.value} mode: mTLS cost is not counted"
            )
    return models


def tls_models(
    mp: ModeProfile, config: SidecarConfig, name: str, warnings: list[str]
) -> TlsModels | None:
    """The mTLS models of ``config``'s TLS version: the profile's primary ones (the ``tls``
    component and ``tls_handshake``) when no version is pinned or it is the primary's, else
    ``tls_by_version``. None (with a warning) when the profile did not measure that version —
    the other version's cost is not a stand-in (1.3 reconnects cost 2× what 1.2 ones do here)."""
    v = config.tls_version
    primary = mp.tls_version or "1.3"  # profiles before the version was recorded measured 1.3
    if v is None or (v == primary and TLS in mp.components):
        return TlsModels(primary, mp.components.get(TLS), mp.tls_handshake)
    if v in mp.tls_by_version:
        return mp.tls_by_version[v]
    have = (
        ", ".join(sorted({*mp.tls_by_version, *([primary] if TLS in mp.components else [])}))
        or "none"
    )
    warnings.append(
        f"profile {name!r} has no {config.mode.value}-mode models of TLS {v} (measured: {have}): "
        f"mTLS cost of those sidecars is not counted; `meshtax profile --mtls` measures 1.3 and 1.2"
    )
    return None


def connection_models(
    spec: SidecarSpec, profile: Profile, warnings: list[str]
) -> dict[Component, ComponentModel]:
    """Latency and CPU per new connection through this sidecar (intercepts), by component:
    the TLS handshake (as :data:`TLS`) with mTLS, and each filter of the chain the profile
    prices per connection. Missing models are warned about, not guessed."""
    mp = profile.mode(spec.config.mode)
    out: dict[Component, ComponentModel] = {}
    if spec.config.mtls:
        tls = tls_models(mp, spec.config, profile.name, warnings)
        if tls is not None and tls.handshake is not None:
            out[TLS] = tls.handshake
        elif tls is not None:
            warnings.append(
                f"profile {profile.name!r} has no {spec.config.mode.value}-mode TLS handshake "
                "model: new mTLS connections cost nothing extra"
            )
    for f in spec.config.filters:
        fc = filter_component(f)
        if fc in mp.per_connection:
            m = mp.per_connection[fc]
            prev = out.get(fc)
            out[fc] = (
                m
                if prev is None
                else ComponentModel(_sum(prev.latency, m.latency), _sum(prev.cpu, m.cpu))
            )
    return out


def _base(
    mp: ModeProfile, protocol: str, name: str, warnings: list[str]
) -> dict[Component, ComponentModel]:
    """The mode's own components, or those measured with ``protocol`` on the wire when the
    sidecar does not parse it (tcp mode) and the profile has them."""
    src = mp.components
    if protocol and mp.mode is Mode.TCP:
        if protocol in mp.carried:
            src = mp.carried[protocol].components
        elif protocol == "grpc":
            warnings.append(
                f"profile {name!r} has no tcp-mode model of gRPC on the wire: gRPC calls through tcp-mode sidecars "
                "are priced as one TCP message each way, which under-counts (a call is several writes each way)"
            )
    return {c: src[c] for c in (*BASE_COMPONENTS, UNATTRIBUTED) if c in src}


def _beyond_measured(
    models: Mapping[Component, tuple[CostModel, CostModel]],
    batch: EcgBatch,
    rows: npt.NDArray[np.bool_],
    spec: SidecarSpec,
    profile: Profile,
    warnings: list[str],
) -> None:
    """Warn when a message is larger than the largest size the profile measured (its models
    are then extrapolated)."""
    measured = [
        max(m.samples.sizes)
        for pair in models.values()
        for m in pair
        if m.samples and m.samples.sizes
    ]
    if not measured or not rows.any():
        return
    top = max(measured)
    biggest = float(max(batch.request_bytes[rows].max(), batch.response_bytes[rows].max()))
    if biggest > top:
        warnings.append(
            f"messages up to {biggest:.0f} B are larger than the largest size profile "
            f"{profile.name!r} measured in {spec.config.mode.value} mode ({top:.0f} B): their "
            "cost is extrapolated (`meshtax profile --sizes …` or `--large` measures larger ones)"
        )


def _sum(a: CostModel, b: CostModel) -> CostModel:
    if a.split_bytes != b.split_bytes or (a.rate_lo, a.rate_hi) != (b.rate_lo, b.rate_hi):
        raise PredictionError(
            "cannot add two models of one filter with different split sizes or rate ranges"
        )
    return CostModel(
        a.intercept + b.intercept,
        a.slope + b.slope,
        a.split_bytes,
        a.per_unit + b.per_unit,
        a.rate_coef + b.rate_coef,
        a.rate_lo,
        a.rate_hi,
        note="sum",
    )


def hop_costs(
    batch: EcgBatch,
    profiles: ProfileLookup,
    *,
    rates: FloatArray | tuple[FloatArray, FloatArray] | None = None,
    speed: Speed | None = None,
    cpu_as_latency: bool = False,
) -> Costs:
    """Evaluate every crossing of every invocation, per component; models with a rate term at
    ``rates`` (per row, or per row for the caller's and the callee's sidecar; default: each
    invocation's own rate); ``speed``: the machine's speed now, ``cpu_as_latency``: CPU at the
    latency transfer factors (see :func:`spec_models`). Messages larger than the largest size
    a profile measured are warned about."""
    warnings: list[str] = []
    n = batch.n_invocations
    proto = batch.protocol if batch.protocol is not None else np.zeros(n, dtype=np.int64)
    codes = [int(c) for c in np.unique(proto)] or [0]
    # models per (sidecar spec, protocol of the rows that use it)
    per: dict[tuple[int, int], dict[Component, tuple[CostModel, CostModel]]] = {}
    for s, spec in enumerate(batch.specs):
        used = (
            np.unique(proto[(batch.caller_spec == s) | (batch.callee_spec == s)])
            if n
            else np.zeros(0, dtype=np.int64)
        )
        for code in [int(c) for c in used] or codes[:1]:
            prof = profiles(spec.platform)
            per[s, code] = spec_models(
                spec, prof, warnings, PROTOCOLS[code], speed, cpu_as_latency=cpu_as_latency
            )
            rows = (batch.caller_spec == s) | (batch.callee_spec == s)
            if n:
                rows &= proto == code
            _beyond_measured(per[s, code], batch, rows, spec, prof, warnings)
    share = batch.new_connections
    conn = (
        {
            s: connection_models(spec, profiles(spec.platform), warnings)
            for s, spec in enumerate(batch.specs)
        }
        if share is not None
        else {}
    )
    comps = tuple(
        sorted({c for m in per.values() for c in m} | {c for m in conn.values() for c in m})
    )
    col = {c: k for k, c in enumerate(comps)}
    K = len(comps)
    out = {name: np.zeros((n, K)) for name in ("lc", "ld", "cc", "cd")}
    lse = np.zeros(n)
    cse = np.zeros(n)
    req, resp = batch.request_bytes, batch.response_bytes
    by_side = (
        (batch.rate, batch.rate)
        if rates is None
        else rates
        if isinstance(rates, tuple)
        else (rates, rates)
    )
    for spec_col, rate, lat_key, cpu_key in (
        (batch.caller_spec, by_side[0], "lc", "cc"),
        (batch.callee_spec, by_side[1], "ld", "cd"),
    ):
        for (s, code), models in per.items():
            rows = np.flatnonzero((spec_col == s) & (proto == code))
            if rows.size == 0:
                continue
            q, p, r = req[rows], resp[rows], rate[rows]
            for c, (lat, cpu) in models.items():
                k = col[c]
                out[lat_key][rows, k] += lat.predict(q, r) + lat.predict(p, r)
                out[cpu_key][rows, k] += cpu.predict(q, r) + cpu.predict(p, r)
                lse[rows] += lat.stderr_at(q, r) + lat.stderr_at(p, r)
                cse[rows] += cpu.stderr_at(q, r) + cpu.stderr_at(p, r)
        if (
            share is not None
        ):  # per new connection, once per sidecar, for the share of calls that open one
            for s, per_conn in conn.items():
                rows = np.flatnonzero((spec_col == s) & (share > 0))
                for c, m in per_conn.items():
                    out[lat_key][rows, col[c]] += share[rows] * m.latency.intercept
                    out[cpu_key][rows, col[c]] += share[rows] * m.cpu.intercept
    return Costs(
        comps, out["lc"], out["ld"], out["cc"], out["cd"], lse, cse, tuple(dict.fromkeys(warnings))
    )


@dataclass(frozen=True)
class BatchPrediction:
    """Predicted overhead of every graph of a batch, as arrays (graphs × …).

    Latency in µs, CPU in vCPU (CPU-seconds per second at the invocations' rates).
    ``*_lo``/``*_hi`` bound the estimate by moving every model to the edge of its 95 %
    interval together (conservative); equal to the estimate where models carry no uncertainty.
    ``latency_by_component`` sums each component over the new critical path; the part of that
    sum hidden by parallel calls is ``absorbed_us`` (so components − absorbed = overhead).
    ``pod_cpus``: the shared-CPU placement the latency was bounded for (None: CPUs of their own);
    ``cpu_bound`` marks the graphs whose overhead that bound set (their ``latency_by_component``
    is then the request's CPU by component ÷ ``pod_cpus``).
    """

    components: tuple[Component, ...]
    base_latency_us: FloatArray
    latency_overhead_us: FloatArray
    latency_lo_us: FloatArray
    latency_hi_us: FloatArray
    cpu_vcpu: FloatArray
    cpu_lo_vcpu: FloatArray
    cpu_hi_vcpu: FloatArray
    latency_by_component: FloatArray  # graphs × components
    absorbed_us: FloatArray
    cpu_by_component: FloatArray  # graphs × components
    critical: npt.NDArray[np.bool_]  # rows on the critical path with overhead
    critical_before: npt.NDArray[np.bool_]  # rows on the mesh-free critical path
    # per row (invocation): latency added and vCPU spent, split by whose sidecar spends it
    row_latency_caller_us: FloatArray
    row_latency_callee_us: FloatArray
    row_cpu_caller_vcpu: FloatArray
    row_cpu_callee_vcpu: FloatArray
    warnings: tuple[str, ...] = field(default=())
    pod_cpus: int | None = None
    cpu_bound: npt.NDArray[np.bool_] | None = None
    # vCPU of the idle sidecars, per graph (in ``cpu_vcpu`` and Other) and per service (the
    # service's own sidecar; in no row's CPU); None: no profile measured it
    idle_vcpu: FloatArray | None = None
    service_idle_vcpu: FloatArray | None = None

    @property
    def latency_overhead_pct(self) -> FloatArray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(
                self.base_latency_us > 0,
                100.0 * self.latency_overhead_us / self.base_latency_us,
                np.nan,
            )


def predict_batch(
    batch: EcgBatch,
    profiles: ProfileLookup,
    *,
    costs: Costs | None = None,
    shape: Structure | None = None,
    pod_cpus: int | None = None,
    speed: Speed | None = None,
    idle_override: tuple[FloatArray | None, FloatArray | None] | None = None,
) -> BatchPrediction:
    """Predict every graph of ``batch``; ``profiles(name)`` resolves a service's platform
    (``None`` → the profile chosen for this prediction). ``pod_cpus``: the number of CPUs the
    graph's pods share (None: every pod has its own; see the module docstring; their messages
    are priced at :func:`~meshtax.predict.shared_cpu.shared_cpu_rates`). ``speed``: the
    machine's speed now; each profile's costs are scaled from the speed it recorded (None: as
    measured). ``idle_override``: the idle proxies' vCPU (per service, per graph) when not the
    batch's sidecars' (:func:`idle_vcpu`; another architecture's proxies). On shared CPUs the
    work that bounds a request's latency is priced at the latency transfer factors where a
    profile has its own (:mod:`meshtax.model.transfer`; given ``costs``, at their CPU)."""
    if pod_cpus is not None and pod_cpus < 1:
        raise ValueError(f"pod_cpus must be at least 1, got {pod_cpus}")
    bound_costs: Costs | None = None
    if costs is None:
        rates = None if pod_cpus is None else shared_cpu_rates(batch, pod_cpus)
        costs = hop_costs(batch, profiles, rates=rates, speed=speed)
        if pod_cpus is not None and any(
            (t := profiles(sp.platform).transfer) and t.latency for sp in batch.specs
        ):
            bound_costs = hop_costs(batch, profiles, rates=rates, speed=speed, cpu_as_latency=True)
    bound_costs = bound_costs or costs
    shape = shape or structure(batch)
    lat = costs.latency
    extra = lat.sum(axis=1)
    prop: Propagation = propagate(shape, extra)
    if costs.latency_se.any():
        lo = propagate(shape, np.maximum(extra - Z95 * costs.latency_se, 0.0))
        hi = propagate(shape, extra + Z95 * costs.latency_se)
    else:  # no model carries uncertainty (e.g. published numbers): the bounds are the estimate
        lo = hi = prop
    before = propagate(shape, np.zeros_like(extra))
    g = batch.graph_of()
    G = batch.n_graphs
    crit = prop.critical

    def per_graph(values: FloatArray, mask: npt.NDArray[np.bool_] | None = None) -> FloatArray:
        w = values if mask is None else values * mask[:, None]
        out = np.zeros((G, values.shape[1]))
        for k in range(w.shape[1]):
            out[:, k] = np.bincount(g, weights=w[:, k], minlength=G)
        return out

    lat_comp = per_graph(lat, crit)
    cpu_rows = costs.cpu * batch.rate[:, None] * 1e-6
    cpu_comp = per_graph(cpu_rows)
    components = costs.components
    svc_idle, idle = idle_vcpu(batch, profiles) if idle_override is None else idle_override
    if idle is not None:
        if OTHER not in components:
            components = (*components, OTHER)
            lat_comp = np.column_stack([lat_comp, np.zeros(G)])
            cpu_comp = np.column_stack([cpu_comp, np.zeros(G)])
        cpu_comp[:, components.index(OTHER)] += idle
    cpu_total = cpu_comp.sum(axis=1)
    cpu_se = np.bincount(g, weights=costs.cpu_se * batch.rate * 1e-6, minlength=G)
    overhead, lo_us, hi_us = prop.overhead_us, lo.overhead_us, hi.overhead_us
    bound_mask: npt.NDArray[np.bool_] | None = None
    if pod_cpus is not None:
        # the request's added CPU work (CPU-µs per execution of the graph) over the shared
        # CPUs: every message's, and its share of the idle sidecars' (their CPU per second ÷
        # the graph's request rate): on one shared CPU the measured mean latency overhead is
        # the measured CPU overhead per request, the sidecars' idle CPU included (issue #14,
        # suite runs 4 and 5: median ratio 1.00, BENCHMARKS.md)
        work = per_graph(bound_costs.cpu)
        if idle is not None:
            if work.shape[1] < lat_comp.shape[1]:
                work = np.column_stack([work, np.zeros(G)])
            rate = batch.rate[batch.graph_ptr[:-1]] if G else np.zeros(0)
            with np.errstate(divide="ignore", invalid="ignore"):
                share = np.where(rate > 0, idle * 1e6 / rate, 0.0)
            work[:, components.index(OTHER)] += share
        work /= pod_cpus
        w = work.sum(axis=1)
        w_se = np.bincount(g, weights=bound_costs.cpu_se, minlength=G) / pod_cpus
        bound_mask = w > overhead
        overhead = np.maximum(overhead, w)
        lo_us = np.maximum(lo_us, np.maximum(w - Z95 * w_se, 0.0))
        hi_us = np.maximum(hi_us, w + Z95 * w_se)
        lat_comp = np.where(bound_mask[:, None], work, lat_comp)
    return BatchPrediction(
        components=components,
        base_latency_us=prop.base_us,
        latency_overhead_us=overhead,
        latency_lo_us=lo_us,
        latency_hi_us=hi_us,
        cpu_vcpu=cpu_total,
        cpu_lo_vcpu=np.maximum(cpu_total - Z95 * cpu_se, 0.0),
        cpu_hi_vcpu=cpu_total + Z95 * cpu_se,
        latency_by_component=lat_comp,
        absorbed_us=lat_comp.sum(axis=1) - overhead,
        cpu_by_component=cpu_comp,
        critical=crit,
        critical_before=before.critical,
        row_latency_caller_us=costs.latency_caller.sum(axis=1),
        row_latency_callee_us=costs.latency_callee.sum(axis=1),
        row_cpu_caller_vcpu=costs.cpu_caller.sum(axis=1) * batch.rate * 1e-6,
        row_cpu_callee_vcpu=costs.cpu_callee.sum(axis=1) * batch.rate * 1e-6,
        warnings=costs.warnings,
        pod_cpus=pod_cpus,
        cpu_bound=bound_mask,
        idle_vcpu=idle,
        service_idle_vcpu=svc_idle,
    )


def idle_vcpu(
    batch: EcgBatch, profiles: ProfileLookup
) -> tuple[FloatArray | None, FloatArray | None]:
    """(per service, per graph) vCPU of idle sidecars: each service's sidecar at its mode's
    ``idle_cpu_us_per_s``, and per graph the sum over the distinct services with a sidecar
    it crosses. (None, None) when no profile of the batch measured it."""
    per_spec = np.zeros(len(batch.specs))
    for s, spec in enumerate(batch.specs):
        try:
            v = profiles(spec.platform).mode(spec.config.mode).idle_cpu_us_per_s
        except KeyError:  # a mode the profile lacks: hop_costs says so
            v = None
        per_spec[s] = 0.0 if v is None else v * 1e-6
    if not per_spec.any():
        return None, None
    S, G = len(batch.services), batch.n_graphs
    svc = np.zeros(S)
    g = batch.graph_of()
    pairs = []
    for who, side in ((batch.caller, batch.caller_spec), (batch.callee, batch.callee_spec)):
        m = (side >= 0) & (who >= 0)
        svc[who[m]] = per_spec[side[m]]
        pairs.append(g[m] * S + who[m])
    seen = np.unique(np.concatenate(pairs))
    per_graph = np.bincount(seen // S, weights=svc[seen % S], minlength=G).astype(np.float64)
    return svc, per_graph


def single_profile(profile: Profile, others: Mapping[str, Profile] | None = None) -> ProfileLookup:
    """A lookup that answers ``profile`` for services without a platform, and ``others[name]``
    for services that name one."""

    def look(name: str | None) -> Profile:
        if name is None or name == profile.name:
            return profile
        if others and name in others:
            return others[name]
        raise PredictionError(
            f"a service runs on platform {name!r}, but no profile of that name was given"
        )

    return look
