"""Tail-latency results as document parts, text and CSV (:mod:`meshtax.predict.tail`).

``tail``: one rate — percentiles with and without the mesh per graph and over all graphs, the
overhead at each percentile with its interval, every station's load and where it saturates.
``tail_sweep``: the overhead percentiles against the request rate, with the knee (the first
station reaching the utilisation threshold) and the rate at which it saturates (ρ = 1).
Renderers read these dicts, never the model's objects.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from meshtax.predict.tail import TailPrediction
from meshtax.report import tables as T

__all__ = ["label", "pricing", "sweep_block", "tail_block", "tail_csv", "tail_text"]

#: graphs beyond this are left out of a tail block's per-graph list
MAX_GRAPHS = 200

MODEL = (
    "per crossing: the profile's latency sketch scaled to its mean cost, plus the wait at its "
    "station (the sidecar's workers, or the pods' shared CPUs) from a simulated G/G/c queue; "
    "composed over the critical path by Monte Carlo (meshtax.predict.tail)"
)


#: a tail prediction whose options did not ask for the ramp price
NOT_ASKED = {
    "used": False,
    "scale": 1.0,
    "note": "not asked: the sidecars keep the cost models' price × the load factor",
}


def pricing(tp: TailPrediction) -> dict[str, Any]:
    """How the sidecars' CPU was priced: from the profile's capacity ramp or not, and why."""
    return dict(NOT_ASKED) if tp.ramp is None else tp.ramp.to_dict()


def label(p: float) -> str:
    """``99.9`` → ``p99.9``, ``50.0`` → ``p50``."""
    return f"p{p:g}"


def _per(ps: Sequence[float], xs: Sequence[float] | np.ndarray[Any, Any]) -> dict[str, float]:
    return {label(p): float(x) for p, x in zip(ps, xs)}


def _saturation_rate(factor: float, rate: float) -> float:
    return factor * rate if math.isfinite(factor) else math.inf


def tail_block(
    tp: TailPrediction,
    graph_names: Sequence[str],
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``tail`` part of a prediction document."""
    ps = tp.percentiles
    first = tp.first_to_saturate
    return {
        "model": MODEL,
        "pricing": pricing(tp),
        "queue_bound": tp.queue_bound or "not asked",
        "options": dict(options),
        "percentiles": list(ps),
        "request_rate": tp.request_rate,
        "samples_per_graph": tp.samples,
        "pooled": {
            "base_us": _per(ps, tp.pooled_base_us),
            "with_mesh_us": _per(ps, tp.pooled_new_us),
            "overhead_us": _per(ps, tp.pooled_overhead_us),
            "lo_us": _per(ps, tp.pooled_lo_us),
            "hi_us": _per(ps, tp.pooled_hi_us),
        },
        "graphs": [
            {
                "name": graph_names[g],
                "base_us": float(tp.base_us[g]),
                "with_mesh_us": _per(ps, tp.new_us[g]),
                "overhead_us": _per(ps, tp.overhead_us[g]),
                "lo_us": _per(ps, tp.overhead_lo_us[g]),
                "hi_us": _per(ps, tp.overhead_hi_us[g]),
            }
            for g in range(min(len(graph_names), MAX_GRAPHS))
        ],
        "stations": [
            {
                "name": s.name,
                "mode": s.mode,
                "servers": s.servers,
                "jobs_per_s": s.jobs_per_s,
                "mean_service_us": s.mean_service_us,
                "utilisation": s.utilisation,
                "busy_vcpu": s.busy_vcpu,
                "needed_vcpu": s.needed_vcpu,
                "threshold_rate": _saturation_rate(s.saturation_factor, tp.request_rate),
                "saturation_rate": _saturation_rate(s.full_factor, tp.request_rate),
                "mean_wait_us": s.mean_wait_us,
                "p99_wait_us": s.p99_wait_us,
                "saturated": s.saturated,
            }
            for s in tp.stations
        ],
        "saturation": {
            "threshold": tp.threshold,
            "first": None if first is None else first.name,
            "rate": tp.saturation_rate,
            "saturated_now": [s.name for s in tp.stations if s.saturated],
            "needed_vcpu": float(sum(s.needed_vcpu for s in tp.stations)),
        },
        "warnings": list(tp.warnings),
    }


def sweep_block(
    points: Sequence[tuple[float, TailPrediction]],
    knee: tuple[str | None, float, float],
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``tail_sweep`` part: pooled overhead per percentile at each request rate; ``knee``:
    (the first station to reach the threshold, that rate, the rate where it reaches ρ = 1)."""
    ps = points[0][1].percentiles if points else ()
    first, at, full = knee
    return {
        "options": dict(options),
        "percentiles": list(ps),
        "rates": [r for r, _ in points],
        "overhead_us": {
            label(p): [float(t.pooled_overhead_us[i]) for _, t in points] for i, p in enumerate(ps)
        },
        "lo_us": {
            label(p): [float(t.pooled_lo_us[i]) for _, t in points] for i, p in enumerate(ps)
        },
        "hi_us": {
            label(p): [float(t.pooled_hi_us[i]) for _, t in points] for i, p in enumerate(ps)
        },
        "base_us": {
            label(p): [float(t.pooled_base_us[i]) for _, t in points] for i, p in enumerate(ps)
        },
        "utilisation_max": [
            max((s.utilisation for s in t.stations), default=0.0) for _, t in points
        ],
        # the ramp's price depends on each sidecar's rate: its factor per swept rate
        "ramp_scale": [pricing(t)["scale"] for _, t in points],
        "knee": {
            "station": first,
            "rate": at,
            "threshold": options.get("threshold"),
            "saturation_rate": full,
        },
    }


def _us(x: float) -> str:
    return "saturated" if not math.isfinite(x) else f"{x:.0f}"


def tail_text(doc: Mapping[str, Any]) -> str:
    """The tail parts of a prediction document as plain text (empty without them)."""
    lines: list[str] = []
    t = doc.get("tail")
    if t:
        ps = [label(p) for p in t["percentiles"]]
        lines += [
            "",
            f"Tail latency at {t['request_rate']:.0f} requests/s ({t['samples_per_graph']} draws "
            "per graph; µs, 95 % interval):",
            f"  {'':<24}" + "".join(f"{p:>22}" for p in ps),
        ]
        pooled = t["pooled"]
        for name, key in (("without mesh", "base_us"), ("with mesh", "with_mesh_us")):
            lines.append(f"  {name:<24}" + "".join(f"{_us(pooled[key][p]):>22}" for p in ps))
        o, lo, hi = pooled["overhead_us"], pooled["lo_us"], pooled["hi_us"]
        cells = [
            f"{_us(o[p])} [{_us(lo[p])}, {_us(hi[p])}]" if math.isfinite(o[p]) else "saturated"
            for p in ps
        ]
        lines.append(f"  {'overhead':<24}" + "".join(f"{c:>22}" for c in cells))
        lines += [f"  {x}" for x in T.tail_pricing_lines({"tail": t})]
        lines.append(
            "  Sidecars under load (utilisation at this rate; where it reaches the threshold):"
        )
        for s in t["stations"]:
            lines.append(
                f"    {s['name']:<20} {s['mode'] or 'cpus':<5} ρ {s['utilisation']:.2f} on "
                f"{s['servers']} server(s), {s['jobs_per_s']:.0f} jobs/s × "
                f"{s['mean_service_us']:.1f} µs; "
                f"wait mean {_us(s['mean_wait_us'])} µs, p99 {_us(s['p99_wait_us'])} µs; "
                f"ρ = {t['saturation']['threshold']:g} at {_us(s['threshold_rate'])}/s, "
                f"saturated at {_us(s['saturation_rate'])}/s; "
                f"needs {s['needed_vcpu']:.2f} vCPU"
            )
        sat = t["saturation"]
        if sat["first"] is not None:
            lines.append(
                f"  First to saturate: {sat['first']} at {_us(sat['rate'])} requests/s "
                f"(utilisation {sat['threshold']:g})."
            )
        for w in t.get("warnings") or []:
            lines.append(f"  warning: {w}")
    s = doc.get("tail_sweep")
    if s:
        ps = [label(p) for p in s["percentiles"]]
        knee = s["knee"]
        lines += ["", "Overhead against load (µs, pooled over the graphs):"]
        lines.append(f"  {'requests/s':>12} {'max ρ':>6}" + "".join(f"{p:>12}" for p in ps))
        for i, r in enumerate(s["rates"]):
            mark = (
                "  ← knee"
                if knee["rate"] is not None and _first_at_or_above(s["rates"], knee["rate"]) == i
                else ""
            )
            lines.append(
                f"  {r:>12.0f} {s['utilisation_max'][i]:>6.2f}"
                + "".join(f"{_us(s['overhead_us'][p][i]):>12}" for p in ps)
                + mark
            )
        if knee["station"] is not None:
            lines.append(
                f"  Knee: {knee['station']} reaches utilisation {knee['threshold']:g} at "
                f"{_us(knee['rate'])} requests/s and saturates at {_us(knee['saturation_rate'])}."
            )
        lines += [f"  {x}" for x in T.tail_pricing_lines({"tail_sweep": s})]
    return "\n".join(lines) + ("\n" if lines else "")


def _first_at_or_above(rates: Sequence[float], x: float) -> int:
    for i, r in enumerate(rates):
        if r >= x:
            return i
    return -1


def tail_csv(doc: Mapping[str, Any]) -> str:
    """CSV of the tail parts: one row per graph (and ``*`` for all) and percentile, then one
    row per swept rate and percentile."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")

    def f(v: Any) -> Any:
        return ("" if not math.isfinite(v) else f"{v:.6g}") if isinstance(v, float) else v

    t = doc.get("tail")
    if t:
        out.writerow(
            [
                "graph",
                "percentile",
                "rate",
                "base_us",
                "with_mesh_us",
                "overhead_us",
                "lo_us",
                "hi_us",
            ]
        )
        rows = [("*", t["pooled"]), *((g["name"], g) for g in t["graphs"])]
        for name, g in rows:
            for p in map(label, t["percentiles"]):
                base = g["base_us"][p] if isinstance(g["base_us"], Mapping) else g["base_us"]
                out.writerow(
                    [
                        name,
                        p,
                        f(t["request_rate"]),
                        f(float(base)),
                        f(g["with_mesh_us"][p]),
                        f(g["overhead_us"][p]),
                        f(g["lo_us"][p]),
                        f(g["hi_us"][p]),
                    ]
                )
    s = doc.get("tail_sweep")
    if s:
        out.writerow(
            ["rate", "percentile", "overhead_us", "lo_us", "hi_us", "utilisation_max", "knee"]
        )
        knee = s["knee"]["rate"]
        at = _first_at_or_above(s["rates"], knee) if knee is not None else -1
        for i, r in enumerate(s["rates"]):
            for p in map(label, s["percentiles"]):
                out.writerow(
                    [
                        f(float(r)),
                        p,
                        f(s["overhead_us"][p][i]),
                        f(s["lo_us"][p][i]),
                        f(s["hi_us"][p][i]),
                        f(s["utilisation_max"][i]),
                        int(i == at),
                    ]
                )
    return buf.getvalue()
