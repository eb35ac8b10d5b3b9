"""The prediction side of a validation case, exactly as a user would make it (pure but for
reading the trace file).

Traces of the no-mesh run → :func:`meshtax.traces.load_traces` (OTLP, sizes from the span
attributes, every call at the load generator's rate, a sidecar configuration per service) →
:func:`meshtax.predict.engine.predict_batch` with one profile. One graph per traced request;
the latency prediction at a percentile is that percentile of (no-mesh latency + overhead) over
the graphs minus the same percentile of the no-mesh latency, which is what a client-side
percentile difference measures.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from meshtax.model.ecg import EXTERNAL, EcgBatch, Invocation, Service, to_batch, validate
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Architecture, SidecarConfig
from meshtax.model.speed import Speed, describe_scaling
from meshtax.predict.architecture import predict_architecture
from meshtax.predict.engine import BatchPrediction, predict_batch, single_profile
from meshtax.traces import SpanOptions, load_traces
from meshtax.validate.result import Predicted

__all__ = ["one_hop", "placed", "predict_traces", "summarize"]


def summarize(bp: BatchPrediction, rate: float, warnings: tuple[str, ...] = ()) -> Predicted:
    """Percentile overheads over the graphs and mean CPU per request (CPU-µs)."""
    base = bp.base_latency_us
    new = base + bp.latency_overhead_us
    n = len(base)
    if n == 0:
        raise ValueError("no call graphs to predict")

    def pct_gap(q: float) -> float:
        return float(np.percentile(new, q) - np.percentile(base, q))

    # cpu_vcpu is CPU-seconds per second at the graph's rate: back to CPU-µs per request
    per_req = bp.cpu_vcpu / rate * 1e6
    comp = {
        c.key: float(bp.cpu_by_component[:, k].mean() / rate * 1e6)
        for k, c in enumerate(bp.components)
    }
    return Predicted(
        p50_us=pct_gap(50.0),
        p90_us=pct_gap(90.0),
        mean_us=float(bp.latency_overhead_us.mean()),
        cpu_us_per_request=float(per_req.mean()),
        graphs=n,
        base_p50_us=float(np.percentile(base, 50.0)),
        by_component_cpu_us=comp,
        warnings=tuple(dict.fromkeys((*warnings, *bp.warnings))),
    )


def predict_traces(
    trace_file: str | os.PathLike[str],
    profile: Profile,
    sidecars: Mapping[str, SidecarConfig],
    rate: float,
    *,
    default_sidecar: SidecarConfig | None = None,
    pod_cpus: int | None = None,
    speed: Speed | None = None,
    architecture: Architecture = Architecture.SIDECAR,
    nodes: Mapping[str, str] | None = None,
    roles: Mapping[Architecture, Profile] | None = None,
) -> Predicted:
    """Import OTLP/JSON traces with every call at ``rate`` and predict with ``profile``
    (``pod_cpus``: the CPUs the pods share; ``speed``: the machine's speed now, see
    :func:`~meshtax.predict.engine.predict_batch`) in ``architecture``, services on
    ``nodes`` (by name), node proxies and waypoints priced from ``roles`` when given
    (:func:`~meshtax.predict.architecture.predict_architecture`)."""
    if rate <= 0 or math.isnan(rate):
        raise ValueError("rate must be positive")
    opts = SpanOptions(
        rate=rate, sidecars=dict(sidecars), default_sidecar=default_sidecar or SidecarConfig()
    )
    res = load_traces(trace_file, "otlp", opts)
    if res.batch.n_graphs == 0:
        raise ValueError(f"{trace_file}: no usable call graph:\n{res.report.summary()}")
    if architecture is Architecture.SIDECAR:
        bp = predict_batch(res.batch, single_profile(profile), pod_cpus=pod_cpus, speed=speed)
    else:
        roles = roles or {}
        look = single_profile(profile, {p.name: p for p in roles.values()})
        _, bp = predict_architecture(
            placed(res.batch, nodes or {}),
            look,
            architecture,
            pod_cpus=pod_cpus,
            speed=speed,
            roles={a: p.name for a, p in roles.items()},
        )
    notes = (describe_scaling(speed, profile.speed),) if speed and profile.speed else ()
    return summarize(bp, rate, notes)


def placed(batch: EcgBatch, nodes: Mapping[str, str]) -> EcgBatch:
    """``batch`` with every service named in ``nodes`` on that node."""
    names = tuple(dict.fromkeys(nodes.values()))
    where = np.asarray(
        [names.index(nodes[s]) if s in nodes else -1 for s in batch.services], dtype=np.int64
    )
    return replace(batch, service_node=where, node_names=names)


def one_hop(
    profile: Profile,
    sidecar: SidecarConfig,
    size_bytes: int,
    rate: float,
    base_us: float = 100.0,
    pod_cpus: int | None = None,
) -> Predicted:
    """A client outside the mesh calling one service with ``sidecar``: request and response
    of ``size_bytes`` (the sweeps' echo)."""
    inv = Invocation(
        "0", EXTERNAL, "echo", float(size_bytes), float(size_bytes), rate, 0.0, base_us
    )
    ecg = validate("one-hop", {"echo": Service("echo", sidecar)}, [inv])
    bp = predict_batch(to_batch([ecg]), single_profile(profile), pod_cpus=pod_cpus)
    return summarize(bp, rate)
