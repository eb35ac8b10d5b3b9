"""Validation results: measured vs predicted overhead per case, errors, and the document (pure).

A *case* is one query of one topology under one sidecar mode. Its measurement is a list of
paired runs (no mesh, mesh) whose differences give the overhead; the prediction comes from the
no-mesh run's traces. The document is ``meshtax-validation/1`` as read by the report builder
(docs/report.md): ``{"format", "name", "cases": [{"name", "mode", "latency": {...}, "cpu":
{...}}]}``, with extra keys (p90, per-service CPU, the runs) the report ignores.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from meshtax.model.speed import Speed
from meshtax.model.stats import Estimate, estimate

__all__ = [
    "FAR",
    "FORMAT",
    "SATURATED",
    "SET_METRICS",
    "CaseResult",
    "Comparison",
    "Predicted",
    "RunSample",
    "ValidationResult",
    "compare",
    "error_stats",
    "overheads",
    "rel_error",
    "set_summary",
]

FORMAT = "meshtax-validation/1"


@dataclass(frozen=True)
class RunSample:
    """One fortio run against one deployment: client latencies (µs) and CPU of every pod.

    ``cpu_ns``: on-CPU ns per service during the run (app + sidecar of its pod);
    ``sidecar_cpu_ns``: the sidecars' part of it (0 without mesh).
    """

    p50_us: float
    p90_us: float
    mean_us: float
    count: int
    actual_qps: float
    duration_s: float
    cpu_ns: Mapping[str, int] = field(default_factory=dict)
    sidecar_cpu_ns: int = 0

    @property
    def cpu_us_per_request(self) -> float:
        return sum(self.cpu_ns.values()) * 1e-3 / self.count if self.count else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "p50_us": self.p50_us,
            "p90_us": self.p90_us,
            "mean_us": self.mean_us,
            "count": self.count,
            "actual_qps": self.actual_qps,
            "duration_s": self.duration_s,
            "cpu_ns": dict(self.cpu_ns),
            "sidecar_cpu_ns": self.sidecar_cpu_ns,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunSample:
        return cls(
            float(d["p50_us"]),
            float(d["p90_us"]),
            float(d["mean_us"]),
            int(d["count"]),
            float(d["actual_qps"]),
            float(d["duration_s"]),
            {str(k): int(v) for k, v in d.get("cpu_ns", {}).items()},
            int(d.get("sidecar_cpu_ns", 0)),
        )


def cpu_differences(pairs: Sequence[tuple[RunSample, RunSample]]) -> list[float]:
    """CPU-µs per request (all pods), mesh − no mesh, per pair."""
    return [m.cpu_us_per_request - b.cpu_us_per_request for b, m in pairs]


def overheads(pairs: Sequence[tuple[RunSample, RunSample]]) -> dict[str, Estimate]:
    """Median (with its 95 % order-statistic interval) over pairs of mesh − no mesh, for
    ``p50``, ``p90``, ``mean`` latency (µs) and ``cpu`` (CPU-µs per request, all pods)."""
    if not pairs:
        raise ValueError("no paired runs")
    return {
        "p50": estimate([m.p50_us - b.p50_us for b, m in pairs]),
        "p90": estimate([m.p90_us - b.p90_us for b, m in pairs]),
        "mean": estimate([m.mean_us - b.mean_us for b, m in pairs]),
        "cpu": estimate(cpu_differences(pairs)),
    }


def rel_error(predicted: float, measured: float) -> float:
    """(predicted − measured) / measured; NaN when nothing was measured."""
    return (predicted - measured) / measured if measured else math.nan


@dataclass(frozen=True)
class Predicted:
    """Predicted overhead of one case: latency (µs) at the client's p50/p90 and mean, CPU per
    request (CPU-µs, all sidecars), from ``graphs`` traced requests."""

    p50_us: float
    p90_us: float
    mean_us: float
    cpu_us_per_request: float
    graphs: int
    base_p50_us: float = math.nan
    by_component_cpu_us: Mapping[str, float] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "p50_us": self.p50_us,
            "p90_us": self.p90_us,
            "mean_us": self.mean_us,
            "cpu_us_per_request": self.cpu_us_per_request,
            "graphs": self.graphs,
            "base_p50_us": self.base_p50_us,
            "by_component_cpu_us": dict(self.by_component_cpu_us),
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Predicted:
        return cls(
            float(d["p50_us"]),
            float(d["p90_us"]),
            float(d["mean_us"]),
            float(d["cpu_us_per_request"]),
            int(d["graphs"]),
            float(d.get("base_p50_us", math.nan)),
            {str(k): float(v) for k, v in d.get("by_component_cpu_us", {}).items()},
            tuple(str(w) for w in d.get("warnings", ())),
        )


@dataclass(frozen=True)
class Comparison:
    """Predicted vs measured for one metric: the measurement's median and 95 % interval."""

    predicted: float
    measured: Estimate

    @property
    def error(self) -> float:
        return rel_error(self.predicted, self.measured.median)

    @property
    def within_interval(self) -> bool:
        return self.measured.lo <= self.predicted <= self.measured.hi

    def to_dict(self, scale: float = 1.0) -> dict[str, Any]:
        m = self.measured
        return {
            "predicted": self.predicted * scale,
            "measured": m.median * scale,
            "lo": m.lo * scale,
            "hi": m.hi * scale,
            "error": self.error,
            "n": m.n,
            "coverage": m.coverage,
        }


def compare(pred: Predicted, pairs: Sequence[tuple[RunSample, RunSample]]) -> dict[str, Comparison]:
    """Every metric of a case side by side: ``latency`` (p50), ``p90``, ``mean``, ``cpu``."""
    o = overheads(pairs)
    return {
        "latency": Comparison(pred.p50_us, o["p50"]),
        "p90": Comparison(pred.p90_us, o["p90"]),
        "mean": Comparison(pred.mean_us, o["mean"]),
        "cpu": Comparison(pred.cpu_us_per_request, o["cpu"]),
    }


@dataclass(frozen=True)
class CaseResult:
    """One case: topology query × mode; ``error`` set (and no numbers) when it could not run."""

    topology: str
    query: str
    mode: str
    rate: float
    pairs: tuple[tuple[RunSample, RunSample], ...] = ()
    predicted: Predicted | None = None
    sidecar_modes: Mapping[str, str] = field(default_factory=dict)
    error: str | None = None
    wall_s: float = 0.0
    speed: Speed | None = None  # the machine's speed measured for the prediction, if it was

    @property
    def name(self) -> str:
        return f"{self.topology}/{self.query}"

    @property
    def comparisons(self) -> dict[str, Comparison]:
        if self.predicted is None or not self.pairs:
            return {}
        return compare(self.predicted, self.pairs)

    @property
    def pod_load(self) -> float:
        """CPU-seconds per second all pods burn with the mesh (median over the pairs): how busy
        the CPUs they share are; the CPU error follows it (:meth:`ValidationResult.summary`)."""
        xs = [m.cpu_us_per_request * self.rate * 1e-6 for _, m in self.pairs if m.count]
        return statistics.median(xs) if xs else math.nan

    @property
    def mesh_rate_share(self) -> float:
        """The rate the meshed copy reached over the rate asked (median over the pairs; NaN
        in closed loop or without runs)."""
        xs = [m.actual_qps / self.rate for _, m in self.pairs if self.rate > 0]
        return statistics.median(xs) if xs else math.nan

    @property
    def saturated(self) -> bool:
        """The meshed copy fell short of the rate asked (below :data:`SATURATED`): its CPUs
        could not keep up, so the run measured another regime than the one predicted."""
        return self.mesh_rate_share < SATURATED

    def factors(self, metric: str) -> list[str]:
        """What the data say about this case's ``metric`` error (``latency`` or ``cpu``), for a
        report to explain a large one: a wide measured interval, a prediction inside it, a busy
        shared CPU, a latency error that is the CPU error (on shared CPUs the latency overhead
        is the request's CPU work). Empty when none applies: the error is unexplained."""
        k = self.comparisons
        if metric not in k:
            return []
        c = k[metric]
        m = c.measured
        out = []
        if m.median > 0 and (m.hi - m.lo) / 2 > WIDE_INTERVAL * m.median:
            out.append(
                f"the measurement is uncertain: its 95 % interval [{m.lo:.0f}, {m.hi:.0f}] is "
                f"±{(m.hi - m.lo) / 2 / m.median:.0%} of the median"
            )
        if c.within_interval:
            out.append("the prediction lies inside the measured 95 % interval")
        if self.saturated:
            out.append(
                f"the meshed copy reached only {self.mesh_rate_share:.0%} of the "
                f"{self.rate:g} requests/s asked: its shared CPU was saturated, so the case "
                "ran at another rate than the one predicted"
            )
        if self.pod_load >= BUSY_LOAD:
            out.append(
                f"the pods keep their shared CPU busy ({self.pod_load:.2f} CPU-s/s): co-located "
                "working sets and queueing, "
                "which one-hop models do not see"
            )
        if metric != "cpu":
            e, cpu = c.error, k["cpu"].error
            if e * cpu > 0 and abs(cpu) >= abs(e) / 2:
                out.append(
                    f"it follows the CPU error ({cpu:+.0%}): on shared CPUs a request's latency "
                    "overhead is its CPU work"
                )
        return out

    def per_service_cpu_us(self) -> dict[str, float]:
        """Median over pairs of each pod's CPU-µs per request, mesh − no mesh."""
        if not self.pairs:
            return {}
        names = sorted({s for _, m in self.pairs for s in m.cpu_ns})
        out: dict[str, float] = {}
        for s in names:
            d = [
                m.cpu_ns.get(s, 0) * 1e-3 / m.count - b.cpu_ns.get(s, 0) * 1e-3 / b.count
                for b, m in self.pairs
                if b.count and m.count
            ]
            out[s] = statistics.median(d) if d else math.nan
        return out

    def to_case(self) -> dict[str, Any]:
        """The case as the report reads it: latency in µs, CPU in vCPU at the case's rate."""
        doc: dict[str, Any] = {
            "name": self.name,
            "mode": self.mode,
            "rate": self.rate,
            "sidecar_modes": dict(self.sidecar_modes),
            "wall_s": self.wall_s,
        }
        if self.speed is not None:
            doc["speed_now"] = self.speed.to_dict()
        if self.error is not None:
            doc["error_message"] = self.error
            return doc
        c = self.comparisons
        doc["latency"] = c["latency"].to_dict()
        doc["cpu"] = {**c["cpu"].to_dict(self.rate * 1e-6), "per_request_us": c["cpu"].to_dict()}
        doc["latency_p90"] = c["p90"].to_dict()
        doc["latency_mean"] = c["mean"].to_dict()
        base = [b for b, _ in self.pairs]
        doc["no_mesh"] = {
            "p50_us": statistics.median(b.p50_us for b in base),
            "p90_us": statistics.median(b.p90_us for b in base),
            "cpu_us_per_request": statistics.median(b.cpu_us_per_request for b in base),
        }
        doc["cpu_by_service_us_per_request"] = self.per_service_cpu_us()
        doc["sidecar_cpu_us_per_request"] = statistics.median(
            m.sidecar_cpu_ns * 1e-3 / m.count for _, m in self.pairs if m.count
        )
        assert self.predicted is not None
        doc["prediction"] = self.predicted.to_dict()
        doc["runs"] = [{"no_mesh": b.to_dict(), "mesh": m.to_dict()} for b, m in self.pairs]
        return doc

    @classmethod
    def measured_from_case(cls, doc: Mapping[str, Any]) -> CaseResult:
        """The measured side of a case document (:meth:`to_case`), without its prediction: to
        predict the same runs again (another profile or model)."""
        topology, query = str(doc["name"]).split("/", 1)
        pairs = tuple(
            (RunSample.from_dict(r["no_mesh"]), RunSample.from_dict(r["mesh"]))
            for r in doc.get("runs", ())
        )
        return cls(
            topology,
            query,
            str(doc["mode"]),
            float(doc["rate"]),
            pairs,
            None,
            dict(doc.get("sidecar_modes", {})),
            doc.get("error_message"),
            float(doc.get("wall_s", 0.0)),
            Speed.from_dict(doc["speed_now"]) if doc.get("speed_now") else None,
        )

    @classmethod
    def from_case(cls, doc: Mapping[str, Any]) -> CaseResult:
        """A case document (:meth:`to_case`) read back whole, its prediction included."""
        measured = cls.measured_from_case(doc)
        pred = doc.get("prediction")
        return replace(measured, predicted=None if pred is None else Predicted.from_dict(pred))


#: edges (CPU-s/s of all pods with the mesh) of the load bands the CPU error is reported in
LOAD_BANDS = (0.25, 0.5)
#: a measured 95 % interval wider than ± this share of its median makes the measurement the
#: uncertain side of an error
WIDE_INTERVAL = 0.15
#: CPU-s/s of the pods from which the shared CPU counts as busy (``ValidationResult.cpu_by_load``)
BUSY_LOAD = LOAD_BANDS[-1]
#: a meshed copy that reaches less than this share of the rate asked was saturated
SATURATED = 0.95


def _median_abs(xs: Sequence[float]) -> float:
    ys = [abs(x) for x in xs if not math.isnan(x)]
    return statistics.median(ys) if ys else math.nan


#: a case whose relative error is beyond this is counted as far off
FAR = 0.30


def error_stats(errors: Sequence[float], far: float = FAR) -> dict[str, float | int]:
    """Relative errors (predicted − measured) / measured of several cases (NaN dropped): their
    number ``n``, ``median_abs_error``, ``mean_error`` (signed: the bias), ``p90_abs_error``
    (nearest rank: the ⌈0.9 n⌉-th smallest \\|e\\|), ``beyond`` (how many \\|e\\| > ``far``) and
    ``beyond_share``. No errors: n = 0 and NaN for the rest."""
    ys = [x for x in errors if not math.isnan(x)]
    if not ys:
        nan = math.nan
        return {"n": 0, "median_abs_error": nan, "mean_error": nan, "p90_abs_error": nan}
    a = sorted(abs(x) for x in ys)
    beyond = sum(x > far for x in a)
    return {
        "n": len(ys),
        "median_abs_error": statistics.median(a),
        "mean_error": statistics.fmean(ys),
        "p90_abs_error": a[math.ceil(0.9 * len(a)) - 1],
        "beyond": beyond,
        "beyond_share": beyond / len(ys),
    }


#: the metrics of a case summarized per set: latency p50, latency p90, CPU per request
SET_METRICS = ("latency", "p90", "cpu")


def set_summary(cases: Sequence[CaseResult], far: float = FAR) -> dict[str, Any]:
    """One set of cases (e.g. a suite's calibration or hold-out set): per metric of
    :data:`SET_METRICS` the :func:`error_stats` of the measured cases, the cases beyond
    ``far`` and the worst; the same per sidecar mode; how many cases failed."""
    ok = [c for c in cases if c.comparisons]
    out: dict[str, Any] = {
        "cases": len(cases),
        "measured": len(ok),
        "failed": [f"{c.name} ({c.mode})" for c in cases if c.error is not None],
        "saturated": [f"{c.name} ({c.mode})" for c in ok if c.saturated],
    }
    for metric in SET_METRICS:
        errs = [(c, c.comparisons[metric].error) for c in ok]
        worst = max(
            ((c, e) for c, e in errs if not math.isnan(e)), key=lambda x: abs(x[1]), default=None
        )
        out[metric] = {
            **error_stats([e for _, e in errs], far),
            "beyond_cases": [f"{c.name} ({c.mode})" for c, e in errs if abs(e) > far],
            "worst": None
            if worst is None
            else {"case": f"{worst[0].name} ({worst[0].mode})", "error": worst[1]},
        }
    modes = dict.fromkeys(c.mode for c in ok)
    out["by_mode"] = {
        m: {
            metric: error_stats([c.comparisons[metric].error for c in ok if c.mode == m], far)
            for metric in SET_METRICS
        }
        for m in modes
    }
    return out


@dataclass(frozen=True)
class ValidationResult:
    """All cases of one ``meshtax validate`` run, with what produced them."""

    name: str
    cases: tuple[CaseResult, ...]
    profile: str
    machine: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def errors(self, metric: str) -> list[float]:
        return [c.comparisons[metric].error for c in self.cases if c.comparisons]

    def summary(self) -> dict[str, Any]:
        """Median absolute error per metric, the worst case, and cases beyond 30 %."""
        out: dict[str, Any] = {
            "cases": len(self.cases),
            "failed": sum(c.error is not None for c in self.cases),
        }
        for metric in ("latency", "p90", "mean", "cpu"):
            errs = self.errors(metric)
            ok = [c for c in self.cases if c.comparisons]
            worst = max(ok, key=lambda c: abs(c.comparisons[metric].error), default=None)
            out[metric] = {
                "median_abs_error": _median_abs(errs),
                "mean_error": statistics.fmean(errs) if errs else math.nan,  # sign: the bias
                "worst": None
                if worst is None
                else {
                    "case": f"{worst.name} ({worst.mode})",
                    "error": worst.comparisons[metric].error,
                },
                "beyond_30pct": [
                    f"{c.name} ({c.mode})" for c in ok if abs(c.comparisons[metric].error) > 0.30
                ],
            }
        out["cpu_by_load"] = self.cpu_by_load()
        out["beyond_30pct_factors"] = {
            f"{c.name} ({c.mode}) {metric}": c.factors(metric)
            for c in self.cases
            if c.comparisons
            for metric in ("latency", "cpu")
            if abs(c.comparisons[metric].error) > 0.30
        }
        return out

    def cpu_by_load(self, edges: Sequence[float] = LOAD_BANDS) -> list[dict[str, Any]]:
        """CPU error per band of :attr:`CaseResult.pod_load` (``[lo, hi)`` CPU-s/s): the
        per-message models come from a one-hop testbed, so the error moves with how busy the
        shared CPU is (colder below, co-located working sets and queueing above)."""
        ok = [c for c in self.cases if c.comparisons]
        bounds = [0.0, *edges, math.inf]
        out: list[dict[str, Any]] = []
        for lo, hi in zip(bounds, bounds[1:]):
            errs = [c.comparisons["cpu"].error for c in ok if lo <= c.pod_load < hi]
            if errs:
                out.append(
                    {
                        "load_lo": lo,
                        "load_hi": hi,
                        "cases": len(errs),
                        "median_abs_error": _median_abs(errs),
                        "mean_error": statistics.fmean(errs),
                    }
                )
        return out

    def to_document(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "profile": self.profile,
            "machine": dict(self.machine),
            "options": dict(self.options),
            "notes": list(self.notes),
            "summary": self.summary(),
            "cases": [c.to_case() for c in self.cases],
        }

    def table(self) -> str:
        """A Markdown table: one row per case, measured [interval] vs predicted, error."""
        rows = [
            "| case | mode | latency p50 overhead µs: measured [95 % CI] | predicted | error | p90 "
            "measured | p90 predicted | p90 error | CPU µs/req measured [95 % CI] | predicted | error |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for c in self.cases:
            if not c.comparisons:
                rows.append(f"| {c.name} | {c.mode} | failed: {c.error} | | | | | | | | |")
                continue
            k = c.comparisons

            def cell(x: Comparison) -> str:
                return f"{x.measured.median:.0f} [{x.measured.lo:.0f}, {x.measured.hi:.0f}]"

            rows.append(
                f"| {c.name} | {c.mode} | {cell(k['latency'])} | {k['latency'].predicted:.0f} | "
                f"{k['latency'].error:+.0%} "
                f"| {k['p90'].measured.median:.0f} | {k['p90'].predicted:.0f} | {k['p90'].error:+.0%} "
                f"| {cell(k['cpu'])} | {k['cpu'].predicted:.0f} | {k['cpu'].error:+.0%} |"
            )
        s = self.summary()
        rows.append("")
        rows.append(
            f"Median absolute error: latency p50 {s['latency']['median_abs_error']:.1%}, p90 "
            f"{s['p90']['median_abs_error']:.1%}, "
            f"CPU {s['cpu']['median_abs_error']:.1%}; mean signed error (bias): latency "
            f"{s['latency']['mean_error']:+.1%}, CPU {s['cpu']['mean_error']:+.1%}."
        )
        bands = [
            f"{b['load_lo']:g}–{b['load_hi']:g}: {b['mean_error']:+.0%} ({b['cases']})"
            if math.isfinite(b["load_hi"])
            else f"≥ {b['load_lo']:g}: {b['mean_error']:+.0%} ({b['cases']})"
            for b in s["cpu_by_load"]
        ]
        if bands:
            rows.append(
                f"CPU bias by the pods' CPU load (CPU-s/s with the mesh; cases): {'; '.join(bands)}."
            )
        far = s["beyond_30pct_factors"]
        if far:
            rows += ["", "Beyond 30 %, and what the data say about it:"]
            rows += [
                f"- {key}: {'; '.join(why) if why else 'unexplained'}" for key, why in far.items()
            ]
        said = dict.fromkeys(w for c in self.cases if c.predicted for w in c.predicted.warnings)
        if said:
            rows += ["", "The predictions' warnings:"] + [f"- {w}" for w in said]
        return "\n".join(rows)
