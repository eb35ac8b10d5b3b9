"""Predict sidecar overhead for a batch of call graphs (pure, vectorized).

For every invocation the request crosses the caller's sidecar outbound and the callee's
sidecar inbound; the response crosses them in reverse. Each crossing costs every component
of that sidecar's mode plus each filter of its chain (and TLS where mTLS is on), evaluated at
the message size. CPU sums over all invocations and all crossings at their rates; latency adds
each invocation's crossings to its duration and recomputes the end-to-end latency
(:mod:`meshtax.predict.critical_path`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from meshtax.model.components import BASE_COMPONENTS, TLS, UNATTRIBUTED, Component, filter_component
from meshtax.model.costmodel import CostModel
from meshtax.model.ecg import EcgBatch, SidecarSpec
from meshtax.model.profile import Profile
from meshtax.predict.critical_path import Propagation, Structure, propagate, structure

FloatArray = npt.NDArray[np.float64]
Z95 = 1.959963984540054


class PredictionError(ValueError):
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


def spec_models(spec: SidecarSpec, profile: Profile, warnings: list[str]) -> dict[Component, tuple[CostModel, CostModel]]:
    """Latency and CPU model of every component a message crossing this sidecar pays."""
    try:
        mp = profile.mode(spec.config.mode)
    except KeyError as e:
        raise PredictionError(f"{e.args[0]}; profile that mode, or describe the service with a mode the profile has") from None
    models: dict[Component, tuple[CostModel, CostModel]] = {}
    for c in (*BASE_COMPONENTS, UNATTRIBUTED):
        if c in mp.components:
            m = mp.components[c]
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
        models[fc] = (m.latency if lat is None else _sum(lat, m.latency), m.cpu if cpu is None else _sum(cpu, m.cpu))
    if missing:
        have = ", ".join(mp.filters()) or "none"
        raise PredictionError(
            f"profile {profile.name!r} has no {spec.config.mode.value}-mode model for filter(s) {', '.join(missing)} "
            f"(profiled filters: {have}); profile them with `meshtax profile --filters ...` or remove them from the configuration"
        )
    if spec.config.mtls:
        if TLS in mp.components:
            m = mp.components[TLS]
            models[TLS] = (m.latency, m.cpu)
        else:
            warnings.append(f"profile {profile.name!r} has no TLS model in {spec.config.mode.value} mode: mTLS cost is not counted")
    return models


def _sum(a: CostModel, b: CostModel) -> CostModel:
    if a.split_bytes != b.split_bytes:
        raise PredictionError("cannot add two models of one filter with different split sizes")
    return CostModel(a.intercept + b.intercept, a.slope + b.slope, a.split_bytes, a.per_unit + b.per_unit, note="sum")


def hop_costs(batch: EcgBatch, profiles: ProfileLookup) -> Costs:
    """Evaluate every crossing of every invocation, per component."""
    warnings: list[str] = []
    per_spec = [spec_models(s, profiles(s.platform), warnings) for s in batch.specs]
    comps = tuple(sorted({c for m in per_spec for c in m}))
    col = {c: k for k, c in enumerate(comps)}
    n, K = batch.n_invocations, len(comps)
    out = {name: np.zeros((n, K)) for name in ("lc", "ld", "cc", "cd")}
    lse = np.zeros(n)
    cse = np.zeros(n)
    req, resp = batch.request_bytes, batch.response_bytes
    for side, spec_col, lat_key, cpu_key in (("caller", batch.caller_spec, "lc", "cc"), ("callee", batch.callee_spec, "ld", "cd")):
        for s, models in enumerate(per_spec):
            rows = np.flatnonzero(spec_col == s)
            if rows.size == 0:
                continue
            q, p = req[rows], resp[rows]
            for c, (lat, cpu) in models.items():
                k = col[c]
                out[lat_key][rows, k] += lat.predict(q) + lat.predict(p)
                out[cpu_key][rows, k] += cpu.predict(q) + cpu.predict(p)
                lse[rows] += lat.stderr_at(q) + lat.stderr_at(p)
                cse[rows] += cpu.stderr_at(q) + cpu.stderr_at(p)
    return Costs(comps, out["lc"], out["ld"], out["cc"], out["cd"], lse, cse, tuple(dict.fromkeys(warnings)))


@dataclass(frozen=True)
class BatchPrediction:
    """Predicted overhead of every graph of a batch, as arrays (graphs × …).

    Latency in µs, CPU in vCPU (CPU-seconds per second at the invocations' rates).
    ``*_lo``/``*_hi`` bound the estimate by moving every model to the edge of its 95 %
    interval together (conservative); equal to the estimate where models carry no uncertainty.
    ``latency_by_component`` sums each component over the new critical path; the part of that
    sum hidden by parallel calls is ``absorbed_us`` (so components − absorbed = overhead).
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

    @property
    def latency_overhead_pct(self) -> FloatArray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.base_latency_us > 0, 100.0 * self.latency_overhead_us / self.base_latency_us, np.nan)


def predict_batch(batch: EcgBatch, profiles: ProfileLookup, *, costs: Costs | None = None, shape: Structure | None = None) -> BatchPrediction:
    """Predict every graph of ``batch``; ``profiles(name)`` resolves a service's platform
    (``None`` → the profile chosen for this prediction)."""
    costs = costs or hop_costs(batch, profiles)
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
    cpu_total = cpu_comp.sum(axis=1)
    cpu_se = np.bincount(g, weights=costs.cpu_se * batch.rate * 1e-6, minlength=G)
    overhead = prop.overhead_us
    return BatchPrediction(
        components=costs.components,
        base_latency_us=prop.base_us,
        latency_overhead_us=overhead,
        latency_lo_us=lo.overhead_us,
        latency_hi_us=hi.overhead_us,
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
    )


def single_profile(profile: Profile, others: Mapping[str, Profile] | None = None) -> ProfileLookup:
    """A lookup that answers ``profile`` for services without a platform, and ``others[name]``
    for services that name one."""

    def look(name: str | None) -> Profile:
        if name is None or name == profile.name:
            return profile
        if others and name in others:
            return others[name]
        raise PredictionError(f"a service runs on platform {name!r}, but no profile of that name was given")

    return look
