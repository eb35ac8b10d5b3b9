"""The prediction result document (format ``meshtax-prediction/1``): self-describing data.

It carries the tool version, the profile (name, platform, provenance) and whether that
platform is this host, the options, warnings, every graph's numbers with their intervals,
the distribution over graphs, and an optional what-if comparison. Exporters and plots read
this document, never internal objects.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from meshtax._version import __version__
from meshtax.model.ecg import EcgBatch
from meshtax.model.profile import Platform, Profile
from meshtax.predict.engine import BatchPrediction

FORMAT = "meshtax-prediction/1"
PERCENTILES = (50, 90, 99)
MAX_DETAILED_GRAPHS = 200  # beyond this, per-graph detail (paths, services, rows) is left out


def _est(v: float, lo: float, hi: float) -> dict[str, float]:
    return {"value": float(v), "lo": float(lo), "hi": float(hi)}


def _dist(x: np.ndarray[Any, Any]) -> dict[str, float]:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"mean": float("nan"), **{f"p{p}": float("nan") for p in PERCENTILES}}
    return {"mean": float(x.mean()), **{f"p{p}": float(np.percentile(x, p)) for p in PERCENTILES}}


def _label(batch: EcgBatch, r: int) -> str:
    caller = "client" if batch.caller[r] < 0 else batch.services[batch.caller[r]]
    callee = batch.services[batch.callee[r]]
    return f"{caller}→{callee}"


def _graph(
    batch: EcgBatch, bp: BatchPrediction, g: int, detailed: bool, pct: np.ndarray[Any, Any]
) -> dict[str, Any]:
    comps = [c.key for c in bp.components]
    out: dict[str, Any] = {
        "name": batch.graph_names[g],
        "base_latency_us": float(bp.base_latency_us[g]),
        "latency_overhead_us": _est(
            bp.latency_overhead_us[g], bp.latency_lo_us[g], bp.latency_hi_us[g]
        ),
        "latency_overhead_pct": float(pct[g]),
        "cpu_vcpu": _est(bp.cpu_vcpu[g], bp.cpu_lo_vcpu[g], bp.cpu_hi_vcpu[g]),
        "latency_by_component_us": dict(zip(comps, map(float, bp.latency_by_component[g]))),
        "absorbed_us": float(bp.absorbed_us[g]),
        "cpu_by_component_vcpu": dict(zip(comps, map(float, bp.cpu_by_component[g]))),
    }
    if not detailed:
        return out
    lo, hi = int(batch.graph_ptr[g]), int(batch.graph_ptr[g + 1])
    rows = range(lo, hi)
    svc_lat: dict[str, float] = {}
    svc_cpu: dict[str, float] = {}
    bound = bp.cpu_bound is not None and bool(bp.cpu_bound[g])
    for r in rows:
        for side, lat, cpu in (
            (batch.caller[r], bp.row_latency_caller_us[r], bp.row_cpu_caller_vcpu[r]),
            (batch.callee[r], bp.row_latency_callee_us[r], bp.row_cpu_callee_vcpu[r]),
        ):
            if side < 0:
                continue
            name = batch.services[side]
            if bound:  # the request's CPU work queued on the shared CPUs sets the latency
                on_path = (
                    float(cpu) / float(batch.rate[r]) * 1e6 / (bp.pod_cpus or 1)
                    if batch.rate[r] > 0
                    else 0.0
                )
            else:
                on_path = float(lat) if bp.critical[r] else 0.0
            svc_lat[name] = svc_lat.get(name, 0.0) + on_path
            svc_cpu[name] = svc_cpu.get(name, 0.0) + float(cpu)
    out["by_service"] = [
        {"service": s, "latency_on_path_us": svc_lat.get(s, 0.0), "cpu_vcpu": svc_cpu[s]}
        for s in sorted(svc_cpu, key=lambda k: -svc_cpu[k])
    ]
    ids = batch.row_ids
    out["critical_path"] = [_label(batch, r) for r in rows if bp.critical[r]]
    out["critical_path_before"] = [_label(batch, r) for r in rows if bp.critical_before[r]]
    out["critical_path_changed"] = out["critical_path"] != out["critical_path_before"]
    out["invocations"] = [
        {
            "id": ids[r] if ids else str(r - lo),
            "hop": _label(batch, r),
            "parent": None
            if batch.parent[r] < 0
            else (ids[batch.parent[r]] if ids else str(batch.parent[r] - lo)),
            "start_us": float(batch.start_us[r]),
            "duration_us": float(batch.duration_us[r]),
            "request_bytes": float(batch.request_bytes[r]),
            "response_bytes": float(batch.response_bytes[r]),
            "rate_rps": float(batch.rate[r]),
            "latency_added_us": float(bp.row_latency_caller_us[r] + bp.row_latency_callee_us[r]),
            "cpu_vcpu": float(bp.row_cpu_caller_vcpu[r] + bp.row_cpu_callee_vcpu[r]),
            "critical": bool(bp.critical[r]),
        }
        for r in rows
    ]
    return out


def profile_block(profile: Profile, host: Platform | None) -> dict[str, Any]:
    return {
        "name": profile.name,
        "source": profile.provenance.source,
        "by": profile.provenance.by,
        "created": profile.provenance.created,
        "platform": profile.platform.to_dict(),
        "platform_is_this_host": bool(host is not None and profile.platform.same_host(host)),
        "notes": list(profile.provenance.notes),
        "quality": profile.quality(),
    }


def summary(bp: BatchPrediction) -> dict[str, Any]:
    """Totals and distributions over all graphs of a prediction."""
    comps = [c.key for c in bp.components]
    return {
        "graphs": int(bp.base_latency_us.size),
        "latency_overhead_us": _dist(bp.latency_overhead_us),
        "latency_overhead_pct": _dist(bp.latency_overhead_pct),
        "cpu_vcpu": _dist(bp.cpu_vcpu),
        "cpu_vcpu_total": float(bp.cpu_vcpu.sum()),
        "latency_by_component_us_mean": dict(
            zip(comps, map(float, bp.latency_by_component.mean(axis=0)))
        ),
        "cpu_by_component_vcpu_mean": dict(
            zip(comps, map(float, bp.cpu_by_component.mean(axis=0)))
        ),
    }


def prediction_document(
    batch: EcgBatch,
    bp: BatchPrediction,
    profile: Profile,
    *,
    host: Platform | None,
    options: Mapping[str, Any],
    warnings: Sequence[str] = (),
    whatif: tuple[str, BatchPrediction, Profile] | None = None,
    created: str | None = None,
) -> dict[str, Any]:
    """Build the result document. ``whatif``: (speedup description, prediction after, profile after)."""
    detailed = batch.n_graphs <= MAX_DETAILED_GRAPHS
    pct = bp.latency_overhead_pct  # a property computed per access: once, not once per graph
    doc: dict[str, Any] = {
        "format": FORMAT,
        "tool": {"name": "meshtax", "version": __version__},
        "created": created or _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "profile": profile_block(profile, host),
        "options": dict(options),
        "warnings": list(dict.fromkeys([*warnings, *bp.warnings])),
        "components": [c.key for c in bp.components],
        "graphs": [_graph(batch, bp, g, detailed, pct) for g in range(batch.n_graphs)],
        "summary": summary(bp),
    }
    if bp.pod_cpus is not None and bp.cpu_bound is not None:
        doc["placement"] = {
            "pod_cpus": bp.pod_cpus,
            "graphs_bound_by_cpu": int(bp.cpu_bound.sum()),
            "rule": "latency overhead = max(critical path, the request's sidecar CPU work ÷ pod_cpus)",
        }
    if not detailed:
        doc["warnings"].append(
            f"{batch.n_graphs} graphs: per-graph paths, services and invocations are left out "
            f"beyond {MAX_DETAILED_GRAPHS}"
        )
    if whatif is not None:
        desc, after, prof_after = whatif
        before_s, after_s = summary(bp), summary(after)
        doc["whatif"] = {
            "speedup": desc,
            "profile_after": prof_after.name,
            "before": before_s,
            "after": after_s,
            "saving": {
                "latency_overhead_us_mean": before_s["latency_overhead_us"]["mean"]
                - after_s["latency_overhead_us"]["mean"],
                "latency_overhead_pct_points_mean": before_s["latency_overhead_pct"]["mean"]
                - after_s["latency_overhead_pct"]["mean"],
                "cpu_vcpu_total": before_s["cpu_vcpu_total"] - after_s["cpu_vcpu_total"],
                "cpu_saving_fraction": (
                    (before_s["cpu_vcpu_total"] - after_s["cpu_vcpu_total"])
                    / before_s["cpu_vcpu_total"]
                    if before_s["cpu_vcpu_total"]
                    else 0.0
                ),
            },
            "per_graph_after": [
                {
                    "name": batch.graph_names[g],
                    "latency_overhead_us": float(after.latency_overhead_us[g]),
                    "cpu_vcpu": float(after.cpu_vcpu[g]),
                }
                for g in range(batch.n_graphs)
            ]
            if detailed
            else [],
        }
    return doc
