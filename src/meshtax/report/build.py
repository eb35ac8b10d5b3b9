"""Build the HTML report from result documents: predictions, profiles, validations, studies.

Library entry points for ``meshtax report`` and ``--report PATH``:

- :func:`build_report` — documents in, one self-contained HTML file out;
- :func:`report_from_files` — result files (JSON, or study Parquet) classified by their format;
- :func:`render_report` — the same without writing, returning the HTML and the figures drawn.
"""

from __future__ import annotations

import datetime as _dt
import json
import webbrowser
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from meshtax.model.microarch import Microarch
from meshtax.report import architectures as A
from meshtax.report import figures as F
from meshtax.report import graph_figures as G
from meshtax.report import html as H
from meshtax.report import tables as T
from meshtax.report import tail_figures as TF
from meshtax.report import whatif as W
from meshtax.report.markdown import interval
from meshtax.report.microarch import microarch_html
from meshtax.report.result import MAX_DETAILED_GRAPHS

#: Per-graph call-graph figures drawn per prediction (the rest are in the exports).
MAX_CALLGRAPHS = 8


@dataclass(frozen=True)
class ReportInputs:
    """Optional inputs beyond predictions and profiles.

    ``validations``: validation documents (``cases`` of predicted vs measured, see docs/report.md);
    ``studies``: study summaries (``configurations`` of per-graph values);
    ``whatif_studies``: what-if studies of measured optimizations (:mod:`meshtax.report.whatif`);
    ``compare``: two profile documents shown side by side (A, B);
    ``title``/``created``: page title and a fixed timestamp (tests, reproducible reports).
    """

    validations: Sequence[Mapping[str, Any]] = ()
    studies: Sequence[Mapping[str, Any]] = ()
    whatif_studies: Sequence[Mapping[str, Any]] = ()
    compare: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None
    title: str = "meshtax report"
    created: str | None = None


@dataclass(frozen=True)
class Report:
    html: str
    charts: list[F.Chart] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # figures that could not be drawn, and why


def _prediction_section(
    label: str, doc: Mapping[str, Any], charts: list[F.Chart], notes: list[str], sid: str
) -> H.Section:
    sec = H.Section(sid, f"Prediction: {label}")
    p = doc["profile"]
    s = doc["summary"]
    where = "this host" if p["platform_is_this_host"] else "NOT this host"
    pl = p["platform"]
    sec.blocks.append(
        H.para(
            f"Profile {p['name']} ({p['source']}; {pl['cpu_model']}, {pl['cores']} cores, Linux {pl['kernel']}, "
            f"{pl['proxy']} {pl['proxy_version']} — {where}). {s['graphs']} call graph(s)."
        )
    )
    for w in doc.get("warnings") or []:
        sec.blocks.append(H.para(f"warning: {w}", "warn"))
    items = [
        (f"{s['latency_overhead_us']['mean']:.0f} µs", "mean latency overhead"),
        (f"{s['latency_overhead_pct']['mean']:.1f} %", "of mesh-free latency (mean)"),
        (f"{s['cpu_vcpu_total']:.2f} vCPU", "CPU over all sidecars"),
    ]
    if s["graphs"] > 1:
        items.insert(1, (f"{s['latency_overhead_us']['p90']:.0f} µs", "p90 latency overhead"))
    w = doc.get("whatif")
    if w:
        items.append(
            (f"−{100 * w['saving']['cpu_saving_fraction']:.0f} % CPU", f"what-if: {w['speedup']}")
        )
    sec.blocks.append(H.cards(items))
    gs = doc["graphs"]  # a list, or a GraphList read graph by graph
    rows = [
        [
            g["name"],
            f"{g['base_latency_us']:.0f}",
            interval(g["latency_overhead_us"]),
            f"{g['latency_overhead_pct']:.1f}",
            interval(g["cpu_vcpu"], "{:.3f}"),
        ]
        for g in gs[:50]
    ]
    sec.blocks.append(
        H.table(
            [
                "graph",
                "mesh-free latency (µs)",
                "latency overhead (µs) [95%]",
                "latency overhead (%)",
                "CPU (vCPU)",
            ],
            rows,
        )
    )
    if len(gs) > 50:
        sec.blocks.append(H.para(f"… {len(gs) - 50} more graphs in the JSON and CSV exports."))

    def add(c: F.Chart | None, what: str) -> None:
        if c is None:
            notes.append(what)
            sec.blocks.append(H.missing(what))
            return
        charts.append(c)
        sec.blocks.append(H.figure(c.id, c.kind, c.title, c.caption, c.svg))

    add(G.overview_chart(label, doc), f"{label}: no graphs to draw")
    # only documents of at most MAX_DETAILED_GRAPHS graphs carry invocations
    detailed = [g for g in gs[:MAX_DETAILED_GRAPHS] if g.get("invocations")]
    if detailed:
        sec.blocks.append("<h3>Call graphs and critical paths</h3>")
        for g in detailed[:MAX_CALLGRAPHS]:
            add(G.callgraph_chart(label, g), f"{label}/{g['name']}: no invocations")
        if len(detailed) > MAX_CALLGRAPHS:
            sec.blocks.append(
                H.para(
                    f"… {len(detailed) - MAX_CALLGRAPHS} more call graphs (see the JSON export)."
                )
            )
    else:
        sec.blocks.append(
            H.missing(
                "Per-invocation detail is not in this document (too many graphs), so no call-graph figures."
            )
        )
    if w:
        sec.blocks.append("<h3>What-if</h3>")
        add(G.whatif_chart(label, doc), f"{label}: no what-if data")
    if doc.get("architectures"):
        sec.blocks.append("<h3>Architectures</h3>")
        add(A.architecture_chart(label, doc), f"{label}: no architecture comparison")
    pricing = T.tail_pricing_lines(doc)
    if doc.get("tail") and not doc.get("tail_sweep"):
        sec.blocks.append("<h3>Tail latency under load</h3>")
    if doc.get("tail_sweep"):
        sec.blocks.append("<h3>Latency against load</h3>")
        add(TF.load_chart(label, doc), f"{label}: no load sweep")
    sec.blocks += [H.para(x) for x in pricing]
    return sec


def _profile_section(
    doc: Mapping[str, Any], charts: list[F.Chart], notes: list[str], sid: str
) -> H.Section:
    name = str(doc["name"])
    pv = doc["provenance"]
    sec = H.Section(sid, f"Profile: {name}")
    sec.blocks.append(
        H.para(
            f"{pv['source']} by {pv['by']} on {pv['created']}. Platform: {T.platform_text(doc)}."
        )
    )
    for n in pv.get("notes") or []:
        sec.blocks.append(H.para(f"note: {n}", "warn"))
    modes = T.breakdown(doc)
    head = ["component", *(f"{m.mode} {x}" for m in modes for x in ("latency (µs)", "CPU (vCPU)"))]
    keys = sorted({k for m in modes for k in m.latency_us}, key=T.component_sort_key)
    rows = []
    for k in [
        *(k for k in keys if not T.is_filter(k)),
        "total",
        *(k for k in keys if T.is_filter(k)),
    ]:
        r = ["total (without filters)" if k == "total" else T.label(k)]
        for m in modes:
            if k == "total":
                r += [f"{m.total('latency').value:.2f}", f"{m.total('cpu').value:.2f}"]
            elif k in m.latency_us:
                r += [_cell(m.latency_us[k], "{:.2f}"), _cell(m.cpu_vcpu[k], "{:.2f}")]
            else:
                r += ["—", "—"]
        rows.append(r)
    sec.blocks.append(H.table(head, rows))
    clos = [(m.mode, m.closure) for m in modes if m.closure]
    if clos:
        crow = []
        for mode, c in clos:
            assert c is not None
            err = (
                (c["components_us"] - c["measured_us"]) / c["measured_us"]
                if c["measured_us"]
                else float("inf")
            )
            crow.append(
                [
                    mode,
                    f"{c['components_us']:.1f}",
                    f"{c['measured_us']:.1f} [{c['measured_lo_us']:.1f}, {c['measured_hi_us']:.1f}]",
                    f"{100 * err:+.1f}%",
                    "closes"
                    if abs(err) <= c["tolerance"]
                    else f"does NOT close (±{100 * c['tolerance']:.0f}%)",
                ]
            )
        sec.blocks.append(
            H.table(["closure", "sum of components (µs)", "measured (µs)", "error", ""], crow)
        )
    for chart, what in (
        (F.breakdown_chart(doc), f"{name}: no components"),
        (
            F.filters_chart(doc),
            f"{name}: no filter costs in this profile (profile filters to see the paper's Table 3)",
        ),
        (
            F.latency_size_chart(doc),
            f"{name}: no latency samples (a published profile carries only fitted numbers), so no "
            "latency-vs-size figure",
        ),
        (F.cpu_chart(doc), f"{name}: no CPU samples, so no CPU-vs-size-and-rate figure"),
    ):
        if chart is None:
            notes.append(what)
            sec.blocks.append(H.missing(what))
        else:
            charts.append(chart)
            sec.blocks.append(H.figure(chart.id, chart.kind, chart.title, chart.caption, chart.svg))
    if doc.get("microarch"):
        sec.blocks += microarch_html(Microarch.from_dict(doc["microarch"]))
    return sec


def _cell(c: T.Cell, fmt: str) -> str:
    return fmt.format(c.value) if c.half == 0 else f"{fmt.format(c.value)} ± {fmt.format(c.half)}"


def _sign(v: float | None) -> str:
    return "" if v is None or v == 0 else ("pos" if v > 0 else "neg")


def comparison_section(
    a: Mapping[str, Any], b: Mapping[str, Any], charts: list[F.Chart], notes: list[str]
) -> H.Section:
    cmp = T.compare_profiles(a, b)
    sec = H.Section("comparison", f"Comparison: {cmp.a} vs {cmp.b}")
    sec.blocks.append(
        H.para(
            f"A = {cmp.a}: {cmp.a_platform}. B = {cmp.b}: {cmp.b_platform}. One request ({cmp.size_bytes:g} B) "
            f"through one sidecar, CPU at {cmp.rate_rps:g} requests/s; Δ is B − A (red: B costs more)."
        )
    )
    rows, classes = [], []
    for r in cmp.rows:
        ld, lp = r.latency_diff
        cd, cp = r.cpu_diff

        def f(v: float | None, fmt: str) -> str:
            return "—" if v is None else fmt.format(v)

        rows.append(
            [
                r.mode,
                "total" if r.component == "total" else T.label(r.component),
                f(r.latency_a, "{:.2f}"),
                f(r.latency_b, "{:.2f}"),
                f(ld, "{:+.2f}"),
                f(lp, "{:+.0f}%"),
                f(r.cpu_a, "{:.3f}"),
                f(r.cpu_b, "{:.3f}"),
                f(cd, "{:+.3f}"),
                f(cp, "{:+.0f}%"),
            ]
        )
        classes.append(["", "", "", "", _sign(ld), _sign(ld), "", "", _sign(cd), _sign(cd)])
    sec.blocks.append(
        H.table(
            [
                "mode",
                "component",
                "latency A (µs)",
                "latency B (µs)",
                "Δ (µs)",
                "Δ %",
                "CPU A",
                "CPU B",
                "Δ (vCPU)",
                "Δ %",
            ],
            rows,
            classes,
        )
    )
    c = F.comparison_chart(cmp)
    if c is None:
        notes.append("comparison: no components")
    else:
        charts.append(c)
        sec.blocks.append(H.figure(c.id, c.kind, c.title, c.caption, c.svg))
    return sec


def _labelled(docs: Sequence[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    out: list[tuple[str, Mapping[str, Any]]] = []
    for d in docs:
        out.append((T.doc_label(d, [lab for lab, _ in out]), d))
    return out


def render_report(
    prediction_docs: Sequence[Mapping[str, Any]] = (),
    profile_docs: Sequence[Mapping[str, Any]] = (),
    extra: ReportInputs | None = None,
) -> Report:
    """The report page and the figures in it (nothing written)."""
    extra = extra or ReportInputs()
    charts: list[F.Chart] = []
    notes: list[str] = []
    sections: list[H.Section] = []
    preds = _labelled(prediction_docs)
    dists = [
        d
        for lab, doc in preds
        if len(doc["graphs"]) > 1
        for d in T.prediction_distributions(lab, doc)
    ]
    for st in extra.studies:
        dists += T.study_distributions(st)
    for i, (lab, doc) in enumerate(preds):
        sections.append(_prediction_section(lab, doc, charts, notes, f"prediction-{i + 1}"))
    if dists:
        sec = H.Section("distributions", "Overhead across call graphs")
        c = G.cdf_chart(dists)
        if c is not None:
            charts.append(c)
            sec.blocks.append(H.figure(c.id, c.kind, c.title, c.caption, c.svg))
        rows = []
        for d in dists:
            for name, x, fmt in (
                ("latency overhead (%)", d.latency_pct, "{:.1f}"),
                ("CPU (vCPU)", d.cpu_vcpu, "{:.3f}"),
            ):
                if x.size:
                    rows.append(
                        [
                            d.label,
                            name,
                            str(x.size),
                            *(fmt.format(float(np.percentile(x, q))) for q in (50, 90, 99)),
                        ]
                    )
        sec.blocks.append(H.table(["configuration", "metric", "graphs", "p50", "p90", "p99"], rows))
        sections.append(sec)
    for i, v in enumerate(extra.validations):
        cases = T.validation_cases(v)
        name = str(v.get("name") or f"validation {i + 1}")
        sec = H.Section(f"validation-{i + 1}", f"Validation: {name}")
        if cases:
            rows = [
                [
                    c.name,
                    c.metric,
                    f"{c.measured:.4g}",
                    f"{c.predicted:.4g}",
                    f"{c.error_pct:+.1f}%",
                ]
                for c in cases
            ]
            sec.blocks.append(H.table(["case", "metric", "measured", "predicted", "error"], rows))
            for c in (G.validation_chart(cases, name), TF.tail_validation_chart(v)):
                if c is not None:
                    charts.append(c)
                    sec.blocks.append(H.figure(c.id, c.kind, c.title, c.caption, c.svg))
        else:
            notes.append(f"{name}: no cases")
            sec.blocks.append(H.missing("This validation document has no cases."))
        sections.append(sec)
    for i, w in enumerate(extra.whatif_studies):
        sections.append(W.whatif_study_section(w, charts, notes, f"whatif-study-{i + 1}"))
    for i, p in enumerate(profile_docs):
        sections.append(_profile_section(p, charts, notes, f"profile-{i + 1}"))
    if extra.compare is not None:
        sections.append(comparison_section(extra.compare[0], extra.compare[1], charts, notes))
    created = extra.created or _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    parts = [f"{len(preds)} prediction(s)", f"{len(profile_docs)} profile(s)"]
    if extra.validations:
        parts.append(f"{len(extra.validations)} validation(s)")
    if extra.studies:
        parts.append(f"{len(extra.studies)} study result(s)")
    if extra.whatif_studies:
        parts.append(f"{len(extra.whatif_studies)} what-if stud(ies)")
    if extra.compare:
        parts.append("a profile comparison")
    if not sections:
        sections.append(
            H.Section(
                "empty",
                "Nothing to show",
                [H.missing("No predictions, profiles or results were given.")],
            )
        )
    subtitle = "What the service mesh costs: " + ", ".join(parts) + "."
    return Report(H.page(extra.title, subtitle, sections, created), charts, notes)


def build_report(
    prediction_docs: Sequence[Mapping[str, Any]] = (),
    profile_docs: Sequence[Mapping[str, Any]] = (),
    *,
    extra: ReportInputs | None = None,
    out_path: str | Path,
) -> Path:
    """Write the self-contained HTML report to ``out_path`` (parents created); returns the path.

    A prediction document may carry a ``label`` key (e.g. its file name) used in headings and
    legends; otherwise its profile name is used.
    """
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    rep = render_report(prediction_docs, profile_docs, extra)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(rep.html, encoding="utf-8")
    tmp.replace(out)  # a reader never sees half a report
    return out


# ---- result files --------------------------------------------------------------------------------


@dataclass
class ResultFiles:
    """Result files sorted by what they hold."""

    predictions: list[dict[str, Any]] = field(default_factory=list)
    profiles: list[dict[str, Any]] = field(default_factory=list)
    validations: list[dict[str, Any]] = field(default_factory=list)
    studies: list[dict[str, Any]] = field(default_factory=list)
    whatif_studies: list[dict[str, Any]] = field(default_factory=list)


def _study_from_parquet(path: Path) -> dict[str, Any]:
    """Per-graph study results (columns ``config``/``configuration``, ``latency_overhead_pct``, ``cpu_vcpu``)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    t = pq.read_table(path).to_pydict()
    cfg_col = "config" if "config" in t else "configuration"
    if cfg_col not in t:
        raise ValueError(f"{path}: expected a 'config' column, got {sorted(t)}")
    confs: dict[str, dict[str, list[Any]]] = {}
    for i, c in enumerate(t[cfg_col]):
        d = confs.setdefault(str(c), {"latency_overhead_pct": [], "cpu_vcpu": []})
        for k in ("latency_overhead_pct", "cpu_vcpu"):
            if k in t:
                d[k].append(t[k][i])
    return {"format": "meshtax-study/1", "name": path.stem, "configurations": confs}


def load_result_file(path: str | Path) -> tuple[str, dict[str, Any]]:
    """(kind, document) of one result file; kind is prediction | profile | validation | study
    | whatif."""
    p = Path(path)
    if p.suffix == ".parquet":
        return "study", _study_from_parquet(p)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{p}: file not found") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{p}: expected a JSON object")
    kind = result_kind(doc)
    if kind is None:
        fmt = str(doc.get("format", "")) or "missing"
        raise ValueError(
            f"{p}: not a meshtax prediction, profile, validation or study result (format {fmt})"
        )
    doc.setdefault("label" if kind == "prediction" else "name", p.stem)
    return kind, doc


def result_kind(doc: Mapping[str, Any]) -> str | None:
    """prediction | profile | validation | study | whatif, or None."""
    fmt = str(doc.get("format", ""))
    if fmt == W.FORMAT:
        return "whatif"
    if fmt.startswith("meshtax-prediction/") or "graphs" in doc:
        return "prediction"
    if fmt.startswith("meshtax-validation/") or "cases" in doc:
        return "validation"
    if fmt.startswith("meshtax-study/") or "configurations" in doc:
        return "study"
    if "modes" in doc and "platform" in doc:
        return "profile"
    return None


def load_result_files(
    paths: Sequence[str | Path], docs: Sequence[dict[str, Any]] = ()
) -> ResultFiles:
    """Result files (and documents already in memory), sorted by kind."""
    r = ResultFiles()
    loaded = [load_result_file(p) for p in paths]
    for doc in docs:
        kind = result_kind(doc)
        if kind is None:
            raise ValueError("not a meshtax prediction, profile, validation or study document")
        loaded.append((kind, doc))
    for kind, doc in loaded:
        {
            "prediction": r.predictions,
            "profile": r.profiles,
            "validation": r.validations,
            "study": r.studies,
            "whatif": r.whatif_studies,
        }[kind].append(doc)
    return r


def report_from_files(
    paths: Sequence[str | Path],
    profile_docs: Sequence[Mapping[str, Any]] = (),
    *,
    out_path: str | Path,
    compare: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None,
    created: str | None = None,
    docs: Sequence[dict[str, Any]] = (),
) -> Path:
    """``meshtax report FILE... --profiles NAME... [--compare A B]``: files of any result kind
    (and ``docs`` in memory), plus profile documents from the store; writes ``out_path``."""
    r = load_result_files(paths, docs)
    extra = ReportInputs(
        validations=r.validations,
        studies=r.studies,
        whatif_studies=r.whatif_studies,
        compare=compare,
        created=created,
    )
    return build_report(r.predictions, [*r.profiles, *profile_docs], extra=extra, out_path=out_path)


def open_in_browser(path: str | Path) -> bool:
    """``--open``: hand the file to the desktop's browser; False when there is none (headless)."""
    return webbrowser.open(Path(path).resolve().as_uri())
