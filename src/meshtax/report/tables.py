"""Report data: the numbers every report view shows, computed from documents only.

Figures (:mod:`meshtax.report.figures`), Markdown and HTML all read these rows, so a table and
the figure beside it can never disagree. Inputs are the plain documents of predictions
(``meshtax-prediction/1``), profiles (``Profile.to_dict``), validations and studies; outputs are
plain dataclasses and lists.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from meshtax.model.components import Component, Kind
from meshtax.model.costmodel import CostModel
from meshtax.report.result import GraphList

#: Conditions of the paper's Table 2: one request (request + response) through one sidecar.
TABLE_BYTES = 100.0
TABLE_RATE = 30_000.0
#: Order of components in stacked bars and tables (bottom to top, as in the paper).
KIND_ORDER = (
    Kind.IPC,
    Kind.READ,
    Kind.WRITE,
    Kind.NOTIFICATION,
    Kind.PARSING,
    Kind.TLS,
    Kind.OTHER,
    Kind.UNATTRIBUTED,
    Kind.FILTER,
)

FloatArray = npt.NDArray[np.float64]


def component_sort_key(key: str) -> tuple[int, str]:
    c = Component.parse(key)
    return KIND_ORDER.index(c.kind), c.name


def label(key: str) -> str:
    """``ipc`` → ``IPC``, ``filter:lua`` → ``Filter(lua)``; unknown keys pass through."""
    try:
        return Component.parse(key).label
    except ValueError:
        return key


def is_filter(key: str) -> bool:
    return key.startswith("filter:")


# ---- profiles ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One request (request + response) through one sidecar: value and 95 % half-width."""

    value: float
    half: float = 0.0


@dataclass(frozen=True)
class ModeBreakdown:
    """The paper's Table 2 column pair for one mode (plus Table 3 rows for its filters)."""

    mode: str
    latency_us: dict[str, Cell]  # component key → cell (filters included)
    cpu_vcpu: dict[str, Cell]
    closure: Mapping[str, Any] | None = None
    carried: str | None = None  # the application protocol of a mode's carried models ("grpc")

    def base_components(self) -> list[str]:
        return [k for k in self.latency_us if not is_filter(k)]

    def filters(self) -> list[str]:
        return [k for k in self.latency_us if is_filter(k)]

    def total(self, metric: str) -> Cell:
        """Sum of the non-filter components; half-widths add in quadrature (independent fits)."""
        cells = self.latency_us if metric == "latency" else self.cpu_vcpu
        base = [cells[k] for k in self.base_components()]
        return Cell(sum(c.value for c in base), math.sqrt(sum(c.half**2 for c in base)))


def cost_model(d: Mapping[str, Any]) -> CostModel:
    return CostModel.from_dict(dict(d))


def breakdown(
    profile_doc: Mapping[str, Any], size: float = TABLE_BYTES, rate: float = TABLE_RATE
) -> list[ModeBreakdown]:
    """Per mode and component: latency (µs) and CPU (vCPU at ``rate``) of one request of ``size``
    bytes through one sidecar — two messages, as in the paper's Table 2 and :func:`profile_text`.
    A mode's carried models follow it as their own entry, ``mode+protocol`` (e.g. ``tcp+grpc``)."""
    s = np.array([size])
    out = []

    def one(name: str, mp: Mapping[str, Any], carried: str | None) -> ModeBreakdown:
        lat: dict[str, Cell] = {}
        cpu: dict[str, Cell] = {}
        for key in sorted(mp["components"], key=component_sort_key):
            cm = mp["components"][key]
            lm, cmod = cost_model(cm["latency"]), cost_model(cm["cpu"])
            lat[key] = Cell(2 * float(lm.predict(s)[0]), 1.96 * 2 * float(lm.stderr_at(s)[0]))
            cpu[key] = Cell(
                2 * float(cmod.predict(s)[0]) * rate * 1e-6,
                1.96 * 2 * float(cmod.stderr_at(s)[0]) * rate * 1e-6,
            )
        return ModeBreakdown(name, lat, cpu, mp.get("closure"), carried)

    for mode, mp in profile_doc["modes"].items():
        out.append(one(str(mode), mp, None))
        # a mode's carried models (gRPC through a tcp-mode sidecar) right after it, as
        # "tcp+grpc" (the name `meshtax profiles show` uses); older documents have none
        for proto, cm in sorted((mp.get("carried") or {}).items()):
            out.append(one(f"{mode}+{proto}", cm, str(proto)))
    return out


@dataclass(frozen=True)
class SampleSeries:
    """Samples of one component's model in one mode, with the fitted line through them."""

    mode: str
    component: str
    metric: str  # "latency" | "cpu"
    sizes: FloatArray
    values: FloatArray
    rates: FloatArray | None
    model: CostModel


def sample_series(profile_doc: Mapping[str, Any], metric: str) -> list[SampleSeries]:
    """Every component model of ``metric`` that carries samples (measured profiles do)."""
    out = []
    for mode, mp in profile_doc["modes"].items():
        for key in sorted(mp["components"], key=component_sort_key):
            m = cost_model(mp["components"][key][metric])
            if m.samples is None or not m.samples.sizes:
                continue
            rates = (
                None if m.samples.rates is None else np.asarray(m.samples.rates, dtype=np.float64)
            )
            out.append(
                SampleSeries(
                    str(mode),
                    key,
                    metric,
                    np.asarray(m.samples.sizes, dtype=np.float64),
                    np.asarray(m.samples.values, dtype=np.float64),
                    rates,
                    m,
                )
            )
    return out


@dataclass(frozen=True)
class ComparisonRow:
    mode: str
    component: str  # a component key, or "total" (sum of the non-filter components)
    latency_a: float | None
    latency_b: float | None
    cpu_a: float | None
    cpu_b: float | None

    @staticmethod
    def _diff(a: float | None, b: float | None) -> tuple[float | None, float | None]:
        if a is None or b is None:
            return None, None
        return b - a, ((b - a) / a * 100.0 if a else None)

    @property
    def latency_diff(self) -> tuple[float | None, float | None]:
        """(B − A, percent of A)."""
        return self._diff(self.latency_a, self.latency_b)

    @property
    def cpu_diff(self) -> tuple[float | None, float | None]:
        return self._diff(self.cpu_a, self.cpu_b)


@dataclass(frozen=True)
class Comparison:
    """Two profiles side by side at one size and rate, per mode and component."""

    a: str
    b: str
    a_platform: str
    b_platform: str
    size_bytes: float
    rate_rps: float
    rows: list[ComparisonRow] = field(default_factory=list)


def platform_text(profile_doc: Mapping[str, Any]) -> str:
    p = profile_doc["platform"]
    proxy = f"{p.get('proxy', '')} {p.get('proxy_version', '')}".strip()
    return f"{p['cpu_model']}, {p['cores']} cores, Linux {p['kernel']}, {proxy}"


def compare_profiles(
    a: Mapping[str, Any], b: Mapping[str, Any], size: float = TABLE_BYTES, rate: float = TABLE_RATE
) -> Comparison:
    """Per-component differences B − A. Modes of either profile appear; a component one profile
    lacks shows as None (e.g. a published profile with only per-mode totals), the totals compare."""
    ba = {m.mode: m for m in breakdown(a, size, rate)}
    bb = {m.mode: m for m in breakdown(b, size, rate)}
    rows = []
    for mode in list(dict.fromkeys([*ba, *bb])):
        ma, mb = ba.get(mode), bb.get(mode)
        keys = sorted(
            {*(ma.latency_us if ma else {}), *(mb.latency_us if mb else {})}, key=component_sort_key
        )

        def get(m: ModeBreakdown | None, metric: str, key: str) -> float | None:
            if m is None:
                return None
            if key == "total":
                return m.total(metric).value
            cells = m.latency_us if metric == "latency" else m.cpu_vcpu
            return cells[key].value if key in cells else None

        for key in [
            *(k for k in keys if not is_filter(k)),
            "total",
            *(k for k in keys if is_filter(k)),
        ]:
            rows.append(
                ComparisonRow(
                    mode,
                    key,
                    get(ma, "latency", key),
                    get(mb, "latency", key),
                    get(ma, "cpu", key),
                    get(mb, "cpu", key),
                )
            )
    return Comparison(
        str(a["name"]), str(b["name"]), platform_text(a), platform_text(b), size, rate, rows
    )


# ---- predictions -------------------------------------------------------------------------------


def doc_label(doc: Mapping[str, Any], taken: Iterable[str] = ()) -> str:
    """A prediction's name in legends: its ``label`` (set by the caller, e.g. the file stem),
    else ``options.label``, else the profile name; made unique against ``taken``."""
    base = str(
        doc.get("label") or (doc.get("options") or {}).get("label") or doc["profile"]["name"]
    )
    taken = set(taken)
    name, n = base, 2
    while name in taken:
        name, n = f"{base} #{n}", n + 1
    return name


@dataclass(frozen=True)
class Distribution:
    """Per-graph overheads of one configuration: the input of a CDF (the paper's Figure 12)."""

    label: str
    latency_pct: FloatArray
    cpu_vcpu: FloatArray


def _finite(x: Sequence[Any] | FloatArray) -> FloatArray:
    if isinstance(x, np.ndarray):
        return x[np.isfinite(x)]
    a = np.asarray([np.nan if v is None else v for v in x], dtype=np.float64)
    return a[np.isfinite(a)]


def prediction_distributions(label_: str, doc: Mapping[str, Any]) -> list[Distribution]:
    """The configuration of a prediction, and its what-if "after" when the document has one."""
    gs = doc["graphs"]
    if isinstance(gs, GraphList):  # its columns, not a dict per graph
        dist = Distribution(
            label_, _finite(gs.columns.pct()), _finite(gs.columns.joined(("cpu_vcpu",))["cpu_vcpu"])
        )
    else:
        dist = Distribution(
            label_,
            _finite([g["latency_overhead_pct"] for g in gs]),
            _finite([g["cpu_vcpu"]["value"] for g in gs]),
        )
    out = [dist]
    w = doc.get("whatif")
    if w and len(w.get("per_graph_after") or []) == len(gs):
        base = {g["name"]: g["base_latency_us"] for g in gs}
        after = w["per_graph_after"]
        pct = [
            100.0 * a["latency_overhead_us"] / base[a["name"]] if base.get(a["name"]) else None
            for a in after
        ]
        out.append(
            Distribution(
                f"{label_} after {w['speedup']}",
                _finite(pct),
                _finite([a["cpu_vcpu"] for a in after]),
            )
        )
    return out


def study_distributions(study: Mapping[str, Any]) -> list[Distribution]:
    """Distributions of a study summary: ``{"configurations": {name: {"latency_overhead_pct": [...],
    "cpu_vcpu": [...]}}}`` (per-graph values) — see docs/report.md."""
    out = []
    for name, c in (study.get("configurations") or {}).items():
        out.append(
            Distribution(
                str(name),
                _finite(c.get("latency_overhead_pct") or []),
                _finite(c.get("cpu_vcpu") or []),
            )
        )
    return out


def cdf(x: FloatArray, points: int = 400) -> tuple[FloatArray, FloatArray]:
    """Empirical CDF, thinned to at most ``points`` steps so a million graphs stay a small SVG."""
    xs = np.sort(x)
    p = np.arange(1, xs.size + 1, dtype=np.float64) / max(xs.size, 1)
    if xs.size > points:
        idx = np.unique(np.linspace(0, xs.size - 1, points).round().astype(np.int64))
        xs, p = xs[idx], p[idx]
    return xs, p


# ---- validation --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ValidationCase:
    """Predicted vs measured overhead of one case (application query × mode) and metric."""

    name: str
    metric: str  # "latency" (µs) | "cpu" (vCPU)
    predicted: float
    measured: float
    measured_lo: float | None = None
    measured_hi: float | None = None

    @property
    def error_pct(self) -> float:
        return (
            (self.predicted - self.measured) / self.measured * 100.0
            if self.measured
            else float("nan")
        )


def validation_cases(doc: Mapping[str, Any]) -> list[ValidationCase]:
    """Read a validation document's ``cases``. Each case is either flat (``metric``, ``predicted``,
    ``measured``, optional ``measured_lo``/``measured_hi``) or nested per metric
    (``latency: {predicted, measured, lo, hi}``, ``cpu: {...}``); see docs/report.md."""
    out = []
    for c in doc.get("cases") or []:
        name = str(c.get("name") or c.get("case") or "?")
        if "mode" in c and str(c["mode"]) not in name:
            name = f"{name} ({c['mode']})"
        nested = [(m, c[m]) for m in ("latency", "cpu") if isinstance(c.get(m), Mapping)]
        if nested:
            for metric, v in nested:
                out.append(
                    ValidationCase(
                        name,
                        metric,
                        float(v["predicted"]),
                        float(v["measured"]),
                        _opt(v.get("measured_lo", v.get("lo"))),
                        _opt(v.get("measured_hi", v.get("hi"))),
                    )
                )
        elif "predicted" in c and "measured" in c:
            out.append(
                ValidationCase(
                    name,
                    str(c.get("metric", "latency")),
                    float(c["predicted"]),
                    float(c["measured"]),
                    _opt(c.get("measured_lo")),
                    _opt(c.get("measured_hi")),
                )
            )
    return out


def _opt(v: Any) -> float | None:
    return None if v is None else float(v)


def tail_pricing_lines(doc: Mapping[str, Any]) -> list[str]:
    """How a prediction's tail priced the sidecars on shared CPUs, one sentence per part that
    has a tail (the one rate, the sweep): whether the capacity ramp's price was used and why
    not (the text, Markdown and HTML reports all say it the same way)."""
    out = []
    t = doc.get("tail")
    if t and "pricing" in t:
        out.append(f"Ramp price {t['pricing']['note']}.")
    if t and t.get("queue_bound", "not asked") != "not asked":
        out.append(f"Queue bound {t['queue_bound']}.")
    s = doc.get("tail_sweep")
    scales = [float(x) for x in (s or {}).get("ramp_scale") or []]
    if scales and any(x != 1.0 for x in scales):
        out.append(
            "Load sweep: the sidecars priced from the capacity ramp, × "
            f"{min(scales):.2f}–{max(scales):.2f} the cost models' price over the swept rates."
        )
    elif scales:
        out.append("Load sweep: the sidecars keep the cost models' price at every swept rate.")
    return out
