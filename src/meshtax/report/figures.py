"""The report's figures, drawn with matplotlib into inline SVG (offline, no JavaScript).

Every function takes documents (or :mod:`meshtax.report.tables` rows computed from them) and
returns a :class:`Chart`, or ``None`` when its data is absent (e.g. a published profile has no
samples for Figures 10/11) — the report then says so instead of drawing an empty plot.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from meshtax.model.components import Component
from meshtax.report import tables as T

#: Colours per component kind (the paper's stacking order); filters cycle through the rest.
_KIND_COLORS = {
    "ipc": "#4e79a7",
    "read": "#59a14f",
    "write": "#f28e2b",
    "notification": "#b07aa1",
    "parsing": "#e15759",
    "tls": "#9c755f",
    "other": "#bab0ac",
    "unattributed": "#76b7b2",
}
_FILTER_COLORS = (
    "#edc948",
    "#ff9da7",
    "#86bcb6",
    "#d37295",
    "#a0cbe8",
    "#8cd17d",
    "#b6992d",
    "#499894",
)
_SERIES = ("#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2", "#edc948", "#9c755f")
CRITICAL = "#d62728"
_RC: dict[Any, Any] = {
    "svg.fonttype": "none",  # text stays text: smaller, selectable, searchable
    "font.size": 9.0,
    "font.family": "sans-serif",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
}


@dataclass(frozen=True)
class Chart:
    """One figure of the report: a stable id (also its anchor), a title, a caption and inline SVG."""

    id: str
    kind: str  # breakdown | filters | latency-size | cpu-size-rate | callgraph | overview | cdf | whatif | validation | comparison
    title: str
    caption: str
    svg: str


def color(key: str) -> str:
    if T.is_filter(key):
        return _FILTER_COLORS[sum(map(ord, key)) % len(_FILTER_COLORS)]
    return _KIND_COLORS.get(key, "#888888")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def _svg(fig: Figure, fid: str) -> str:
    """Figure → inline ``<svg>``; every id is prefixed with the figure id, so several inline
    SVGs in one page never resolve each other's clip paths or markers."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": fid}):  # stable ids: reproducible files
        fig.savefig(
            buf, format="svg", metadata={"Date": None}
        )  # constrained layout already fits: no second "tight" pass
    s = buf.getvalue()
    s = s[s.index("<svg") :]
    s = re.sub(
        r"\s*<metadata>.*?</metadata>", "", s, flags=re.S
    )  # RDF block: namespace URLs, no information
    p = _slug(fid) + "-"
    s = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{p}{m.group(1)}"', s)
    s = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{p}{m.group(1)})", s)
    s = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{p}{m.group(1)}"', s)
    return s.replace("<svg ", f'<svg role="img" aria-label="{fid}" ', 1)


def _new(
    w: float, h: float, nrows: int = 1, ncols: int = 1, **kw: Any
) -> tuple[Figure, list[Axes]]:
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(w, h), layout="constrained")
        axs = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, [a for row in axs for a in row]


def _chart(fig: Figure, fid: str, kind: str, title: str, caption: str) -> Chart:
    with matplotlib.rc_context(_RC):
        return Chart(fid, kind, title, caption, _svg(fig, fid))


# ---- profiles ----------------------------------------------------------------------------------


def breakdown_chart(
    profile_doc: Mapping[str, Any], size: float = T.TABLE_BYTES, rate: float = T.TABLE_RATE
) -> Chart | None:
    """Table 2 as stacked bars: per mode, latency and CPU of one request through one sidecar."""
    modes = T.breakdown(profile_doc, size, rate)
    if not modes:
        return None
    name = str(profile_doc["name"])
    with matplotlib.rc_context(_RC):
        fig, (al, ac) = _new(8.0, 3.4, 1, 2)
        for ax, metric, unit in (
            (al, "latency", "latency (µs)"),
            (ac, "cpu", f"CPU (vCPU at {rate:g} req/s)"),
        ):
            seen: set[str] = set()
            for i, m in enumerate(modes):
                cells = m.latency_us if metric == "latency" else m.cpu_vcpu
                bottom = 0.0
                for k in m.base_components():
                    v = cells[k].value
                    ax.bar(
                        i,
                        v,
                        bottom=bottom,
                        color=color(k),
                        width=0.6,
                        label=None if k in seen else T.label(k),
                        edgecolor="white",
                        linewidth=0.5,
                    )
                    seen.add(k)
                    bottom += v
                tot = m.total(metric)
                if tot.half > 0:
                    ax.errorbar(i, tot.value, yerr=tot.half, color="black", capsize=4, linewidth=1)
                ax.annotate(
                    f"{tot.value:.3g}",
                    (i, tot.value + tot.half),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    xytext=(0, 2),
                    textcoords="offset points",
                )
            ax.set_xticks(range(len(modes)), [m.mode for m in modes])
            ax.set_ylabel(unit)
            ax.margins(y=0.12)
        handles, labels = al.get_legend_handles_labels()
        order = sorted(
            range(len(labels)), key=lambda i: -T.KIND_ORDER.index(Component.parse(labels[i]).kind)
        )
        al.legend(
            [handles[i] for i in order], [labels[i] for i in order], fontsize=8, loc="upper left"
        )  # top of the stack first
    return _chart(
        fig,
        f"breakdown-{_slug(name)}",
        "breakdown",
        f"Component breakdown per mode — {name}",
        f"One request ({size:g} B request and response) through one sidecar, stacked by component "
        "(the paper's Table 2). Error bars: 95 % interval of the fitted models.",
    )


def filters_chart(
    profile_doc: Mapping[str, Any], size: float = T.TABLE_BYTES, rate: float = T.TABLE_RATE
) -> Chart | None:
    """Table 3: the cost of each filter per mode, with the percentage over the mode's base."""
    modes = [m for m in T.breakdown(profile_doc, size, rate) if m.filters()]
    if not modes:
        return None
    name = str(profile_doc["name"])
    filters = sorted({f for m in modes for f in m.filters()}, key=T.component_sort_key)
    with matplotlib.rc_context(_RC):
        fig, (al, ac) = _new(8.0, 0.5 + 0.35 * len(filters) * len(modes) + 1.0, 1, 2, sharey=True)
        h = 0.8 / len(modes)
        for ax, metric, unit in (
            (al, "latency", "added latency (µs)"),
            (ac, "cpu", f"added CPU (vCPU at {rate:g} req/s)"),
        ):
            for j, m in enumerate(modes):
                cells = m.latency_us if metric == "latency" else m.cpu_vcpu
                base = m.total(metric).value
                ys = [i + (j - (len(modes) - 1) / 2) * h for i in range(len(filters))]
                vals = [cells[f].value if f in cells else 0.0 for f in filters]
                errs = [cells[f].half if f in cells else 0.0 for f in filters]
                ax.barh(
                    ys,
                    vals,
                    height=h * 0.9,
                    xerr=errs,
                    color=_SERIES[j % len(_SERIES)],
                    label=m.mode,
                    capsize=2,
                )
                for y, v, e, f in zip(ys, vals, errs, filters):
                    if f in cells and base:
                        ax.annotate(
                            f"+{100 * v / base:.0f}%",
                            (v + e, y),
                            xytext=(3, 0),
                            textcoords="offset points",
                            va="center",
                            fontsize=7,
                        )
            ax.set_yticks(range(len(filters)), [T.label(f) for f in filters])
            ax.set_xlabel(unit)
            ax.margins(x=0.18)
        al.invert_yaxis()
        al.legend(fontsize=8, loc="lower right")
    return _chart(
        fig,
        f"filters-{_slug(name)}",
        "filters",
        f"Filter costs — {name}",
        "Added latency and CPU of each filter per mode at one request through one sidecar, with the "
        "percentage over the mode without filters (the paper's Table 3).",
    )


def _size_grid(series: Sequence[T.SampleSeries]) -> np.ndarray[Any, Any]:
    lo = max(1.0, min(float(s.sizes.min()) for s in series))
    hi = max(float(s.sizes.max()) for s in series)
    return np.unique(
        np.concatenate([np.geomspace(lo, max(hi, lo * 2), 200), *(s.sizes for s in series)])
    )


def _vs_size(
    axs: Sequence[Axes], series: Sequence[T.SampleSeries], modes: Sequence[str], ylabel: str
) -> None:
    for ax, mode in zip(axs, modes):
        ss = [s for s in series if s.mode == mode]
        grid = _size_grid(ss)
        total = np.zeros_like(grid)
        for s in ss:
            y = s.model.predict(grid)
            if not T.is_filter(s.component):  # the sum is the mode without filters, as in Table 2
                total += y
            ax.plot(grid, y, color=color(s.component), linewidth=1.2, label=T.label(s.component))
            ax.scatter(s.sizes, s.values, color=color(s.component), s=9, alpha=0.7, linewidths=0)
        ax.plot(
            grid, total, color="black", linestyle="--", linewidth=1.2, label="sum without filters"
        )
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(
            NullFormatter()
        )  # unlabelled minor ticks: labelling them dominates drawing time
        ax.set_title(mode, fontsize=9)
        ax.set_xlabel("message size (bytes)")
    axs[0].set_ylabel(ylabel)


def latency_size_chart(profile_doc: Mapping[str, Any]) -> Chart | None:
    """Figure 10: per-message latency vs message size, fitted lines through the samples."""
    series = T.sample_series(profile_doc, "latency")
    if not series:
        return None
    name = str(profile_doc["name"])
    modes = list(dict.fromkeys(s.mode for s in series))
    with matplotlib.rc_context(_RC):
        fig, axs = _new(3.0 * len(modes) + 1.6, 3.2, 1, len(modes), sharey=True)
        _vs_size(axs, series, modes, "latency per message (µs)")
        axs[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _chart(
        fig,
        f"latency-size-{_slug(name)}",
        "latency-size",
        f"Latency vs message size — {name}",
        "Per-message latency of each component (one direction through one sidecar): samples as dots, "
        "the fitted cost model as lines, their sum dashed (the paper's Figure 10). Log size axis.",
    )


def _total_at(series: Sequence[T.SampleSeries], size: float) -> float:
    return float(sum(float(s.model.predict(np.array([size]))[0]) for s in series))


def _rate_points(series: Sequence[T.SampleSeries]) -> list[tuple[float, float, float]]:
    """(size, rate, summed CPU-µs) for the (size, rate) cells every component was sampled at."""
    cells: list[dict[tuple[float, float], float]] = []
    for s in series:
        if s.rates is None:
            return []
        acc: dict[tuple[float, float], list[float]] = {}
        for sz, r, v in zip(s.sizes, s.rates, s.values):
            acc.setdefault((float(sz), float(r)), []).append(float(v))
        cells.append({k: float(np.mean(v)) for k, v in acc.items()})
    common = set.intersection(*(set(c) for c in cells)) if cells else set()
    return sorted((sz, r, sum(c[(sz, r)] for c in cells)) for sz, r in common)


def cpu_chart(profile_doc: Mapping[str, Any], size: float = T.TABLE_BYTES) -> Chart | None:
    """Figure 11: per-message CPU vs size (top) and vCPU vs request rate (bottom)."""
    series = T.sample_series(profile_doc, "cpu")
    if not series:
        return None
    name = str(profile_doc["name"])
    modes = list(dict.fromkeys(s.mode for s in series))
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(3.0 * len(modes) + 1.6, 6.2), layout="constrained")
        top: Any = fig.subfigures(2, 1, height_ratios=[1.0, 0.9])
        axs = list(top[0].subplots(1, len(modes), squeeze=False, sharey=True)[0])
        _vs_size(axs, series, modes, "CPU per message (CPU-µs)")
        axs[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
        ax = top[1].subplots()
        rmax = (
            max(float(s.rates.max()) for s in series if s.rates is not None)
            if any(s.rates is not None for s in series)
            else T.TABLE_RATE
        )
        rates = np.linspace(0.0, rmax * 1.1, 50)
        for j, mode in enumerate(modes):
            ss = [s for s in series if s.mode == mode and not T.is_filter(s.component)]
            c = _SERIES[j % len(_SERIES)]
            per_msg = _total_at(ss, size)
            # a request is two messages (request and response) through the sidecar
            ax.plot(
                rates, 2 * rates * per_msg * 1e-6, color=c, label=f"{mode} (fitted, {size:g} B)"
            )
            pts = [(r, v) for sz, r, v in _rate_points(ss) if sz == size]
            if pts:
                ax.scatter(
                    [p[0] for p in pts], [2 * p[0] * p[1] * 1e-6 for p in pts], color=c, s=14
                )
        ax.set_xlabel("request rate (requests/s)")
        ax.set_ylabel("CPU (vCPU)")
        ax.legend(fontsize=7)
    return _chart(
        fig,
        f"cpu-{_slug(name)}",
        "cpu-size-rate",
        f"CPU vs message size and rate — {name}",
        "Top: CPU-µs per message of each component vs size (dots: samples; lines: fitted). Bottom: vCPU of one "
        f"sidecar vs request rate at {size:g} B, r·(C + s·c) per message × 2 messages (the paper's Figure 11); "
        "dots are the summed samples measured at that size.",
    )


def comparison_chart(cmp: T.Comparison) -> Chart | None:
    """Two profiles side by side: per mode, the base components and the total, A vs B."""
    rows = [r for r in cmp.rows if not T.is_filter(r.component)]
    if not rows:
        return None
    modes = list(dict.fromkeys(r.mode for r in rows))
    with matplotlib.rc_context(_RC):
        fig, axs = _new(3.2 * len(modes) + 0.6, 5.6, 2, len(modes))
        for col, mode in enumerate(modes):
            rs = [r for r in rows if r.mode == mode]
            x = np.arange(len(rs))
            for row, (metric, unit) in enumerate(
                (("latency", "latency (µs)"), ("cpu", "CPU (vCPU)"))
            ):
                ax = axs[row * len(modes) + col]
                va = [(r.latency_a if metric == "latency" else r.cpu_a) for r in rs]
                vb = [(r.latency_b if metric == "latency" else r.cpu_b) for r in rs]
                ax.bar(x - 0.2, [v or 0.0 for v in va], 0.4, color=_SERIES[0], label=cmp.a)
                ax.bar(x + 0.2, [v or 0.0 for v in vb], 0.4, color=_SERIES[1], label=cmp.b)
                ax.set_xticks(
                    x,
                    ["total" if r.component == "total" else T.label(r.component) for r in rs],
                    rotation=35,
                    ha="right",
                    fontsize=7,
                )
                if row == 0:
                    ax.set_title(mode, fontsize=9)
                if col == 0:
                    ax.set_ylabel(unit)
        axs[0].legend(fontsize=7)
    return _chart(
        fig,
        f"comparison-{_slug(cmp.a)}-vs-{_slug(cmp.b)}",
        "comparison",
        f"{cmp.a} vs {cmp.b}",
        f"Per component, one request ({cmp.size_bytes:g} B) through one sidecar; CPU at {cmp.rate_rps:g} req/s. "
        "Components a profile lacks are drawn as 0 and shown as — in the table.",
    )


# ---- predictions -------------------------------------------------------------------------------


def overview_chart(label: str, doc: Mapping[str, Any], max_graphs: int = 40) -> Chart | None:
    """Per graph: latency overhead on the critical path and CPU, stacked by component, with intervals."""
    gs = list(doc["graphs"])[:max_graphs]
    if not gs:
        return None
    comps = sorted(doc["components"], key=T.component_sort_key)
    with matplotlib.rc_context(_RC):
        fig, (al, ac) = _new(9.0, 0.9 + 0.32 * len(gs), 1, 2, sharey=True)
        y = np.arange(len(gs))
        for ax, key, est, unit in (
            (al, "latency_by_component_us", "latency_overhead_us", "latency overhead (µs)"),
            (ac, "cpu_by_component_vcpu", "cpu_vcpu", "CPU overhead (vCPU)"),
        ):
            left = np.zeros(len(gs))
            for k in comps:
                v = np.array([g[key].get(k, 0.0) for g in gs])
                ax.barh(y, v, left=left, color=color(k), label=T.label(k), height=0.7)
                left += v
            val = np.array([g[est]["value"] for g in gs])
            lo = np.array([g[est]["lo"] for g in gs])
            hi = np.array([g[est]["hi"] for g in gs])
            ax.errorbar(
                val,
                y,
                xerr=[np.maximum(val - lo, 0), np.maximum(hi - val, 0)],
                fmt="|",
                color="black",
                markersize=10,
                capsize=3,
            )
            ax.set_xlabel(unit)
        al.set_yticks(y, [g["name"] for g in gs])
        al.invert_yaxis()
        fig.legend(
            *ac.get_legend_handles_labels(),
            loc="outside lower center",
            ncols=min(len(comps), 8),
            fontsize=7,
        )
    more = (
        f" Showing the first {max_graphs} of {len(doc['graphs'])} graphs."
        if len(doc["graphs"]) > max_graphs
        else ""
    )
    return _chart(
        fig,
        f"overview-{_slug(label)}",
        "overview",
        f"Predicted overhead per call graph — {label}",
        "Latency added on the critical path and CPU over all sidecars, stacked by component; the black mark is "
        "the predicted total with its interval (parallel calls can hide part of the stacked latency)."
        + more,
    )


def _layout(
    invs: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, tuple[float, float]], dict[str, list[str]]]:
    """Tree layout: x = depth, y = leaf order (depth-first, in start order)."""
    kids: dict[str, list[str]] = {}
    for inv in sorted(invs, key=lambda i: i["start_us"]):
        kids.setdefault(str(inv["parent"]) if inv["parent"] is not None else "", []).append(
            str(inv["id"])
        )
    pos: dict[str, tuple[float, float]] = {}
    nxt = [0.0]

    def place(node: str, depth: int) -> float:
        ch = kids.get(node, [])
        if not ch:
            y = nxt[0]
            nxt[0] += 1.0
        else:
            ys = [place(c, depth + 1) for c in ch]
            y = (min(ys) + max(ys)) / 2
        pos[node] = (float(depth), y)
        return y

    place("", 0)
    return pos, kids


def callgraph_chart(label: str, graph: Mapping[str, Any]) -> Chart | None:
    """The call graph as a tree, critical path in red, each hop labelled with the latency it adds."""
    invs = graph.get("invocations")
    if not invs:
        return None
    by_id = {str(i["id"]): i for i in invs}
    pos, kids = _layout(invs)
    leaves = max(1.0, max(y for _, y in pos.values()) + 1)
    depth = max(x for x, _ in pos.values())
    with matplotlib.rc_context(_RC):
        fig, (ax,) = _new(2.3 * (depth + 1) + 0.5, 0.55 * leaves + 0.9)
        ax.axis("off")
        for parent, children in kids.items():
            for c in children:
                inv = by_id[c]
                (x0, y0), (x1, y1) = pos[parent], pos[c]
                crit = bool(inv["critical"])
                ax.plot(
                    [x0, x0 + 0.5, x0 + 0.5, x1],
                    [y0, y0, y1, y1],
                    color=CRITICAL if crit else "#999999",
                    linewidth=2.6 if crit else 1.0,
                    zorder=1,
                    solid_joinstyle="round",
                )
                ax.annotate(
                    f"+{inv['latency_added_us']:.0f} µs",
                    (x0 + 0.52, y1),
                    xytext=(0, 3),
                    textcoords="offset points",
                    fontsize=7,
                    color=CRITICAL if crit else "#555555",
                    ha="left",
                    va="bottom",
                )
        for node, (x, y) in pos.items():
            name = "client" if node == "" else str(by_id[node]["hop"]).split("→")[-1]
            crit = node == "" or bool(by_id[node]["critical"])
            ax.annotate(
                name,
                (x, y),
                ha="center",
                va="center",
                fontsize=8,
                zorder=3,
                bbox={
                    "boxstyle": "round,pad=0.3",
                    "facecolor": "#fde0dd" if crit else "#f0f0f0",
                    "edgecolor": CRITICAL if crit else "#999999",
                },
            )
        ax.set_xlim(-0.6, depth + 0.6)
        ax.set_ylim(leaves - 0.4, -0.6)
    lat = graph["latency_overhead_us"]
    changed = (
        " Adding the overhead changed the critical path."
        if graph.get("critical_path_changed")
        else ""
    )
    return _chart(
        fig,
        f"callgraph-{_slug(label)}-{_slug(str(graph['name']))}",
        "callgraph",
        f"Call graph {graph['name']} — {label}",
        f"Red: the critical path with sidecars (+{lat['value']:.0f} µs end to end, "
        f"{graph['latency_overhead_pct']:.1f} % of the mesh-free latency). Each edge is one invocation, labelled "
        "with the latency its four sidecar crossings add." + changed,
    )


def cdf_chart(dists: Sequence[T.Distribution]) -> Chart | None:
    """Figure 12: CDFs of latency overhead (%) and CPU across many call graphs, one line per configuration."""
    dists = [d for d in dists if d.latency_pct.size >= 2 or d.cpu_vcpu.size >= 2]
    if not dists:
        return None
    with matplotlib.rc_context(_RC):
        fig, (al, ac) = _new(8.5, 3.3, 1, 2, sharey=True)
        for j, d in enumerate(dists):
            c = _SERIES[j % len(_SERIES)]
            ls = "--" if " after " in d.label else "-"
            for ax, x in ((al, d.latency_pct), (ac, d.cpu_vcpu)):
                if x.size:
                    xs, p = T.cdf(x)
                    ax.step(
                        xs, p, where="post", color=c, linestyle=ls, label=f"{d.label} (n={x.size})"
                    )
        al.set_xlabel("latency overhead (% of mesh-free latency)")
        ac.set_xlabel("CPU overhead (vCPU)")
        al.set_ylabel("fraction of call graphs")
        al.legend(fontsize=7, loc="lower right")
    return _chart(
        fig,
        "cdf",
        "cdf",
        "Overhead across call graphs",
        "Empirical CDFs over all call graphs, one line per configuration; dashed: after a what-if speedup "
        "(the paper's Figure 12).",
    )


def whatif_chart(label: str, doc: Mapping[str, Any], max_graphs: int = 30) -> Chart | None:
    """Before/after a speedup profile: per graph when few, else the distribution's summary."""
    w = doc.get("whatif")
    if not w:
        return None
    after = w.get("per_graph_after") or []
    gs = doc["graphs"]
    with matplotlib.rc_context(_RC):
        fig, (al, ac) = _new(
            8.5,
            0.9 + 0.3 * min(len(gs), max_graphs) if after and len(gs) <= max_graphs else 3.0,
            1,
            2,
        )
        if after and len(gs) <= max_graphs:
            y = np.arange(len(gs))
            for ax, before_v, after_v, unit in (
                (
                    al,
                    [g["latency_overhead_us"]["value"] for g in gs],
                    [a["latency_overhead_us"] for a in after],
                    "latency overhead (µs)",
                ),
                (
                    ac,
                    [g["cpu_vcpu"]["value"] for g in gs],
                    [a["cpu_vcpu"] for a in after],
                    "CPU overhead (vCPU)",
                ),
            ):
                ax.barh(y - 0.2, before_v, 0.4, color=_SERIES[0], label="before")
                ax.barh(y + 0.2, after_v, 0.4, color=_SERIES[2], label="after")
                ax.set_xlabel(unit)
            al.set_yticks(y, [g["name"] for g in gs])
            ac.set_yticks(y, [""] * len(gs))
            al.invert_yaxis()
            ac.invert_yaxis()
        else:
            b, a = w["before"], w["after"]
            ks = ["mean", "p50", "p90", "p99"]
            x = np.arange(len(ks))
            al.bar(
                x - 0.2,
                [b["latency_overhead_us"][k] for k in ks],
                0.4,
                color=_SERIES[0],
                label="before",
            )
            al.bar(
                x + 0.2,
                [a["latency_overhead_us"][k] for k in ks],
                0.4,
                color=_SERIES[2],
                label="after",
            )
            al.set_xticks(x, ks)
            al.set_ylabel("latency overhead (µs)")
            ac.bar(
                [0, 1],
                [b["cpu_vcpu_total"], a["cpu_vcpu_total"]],
                0.6,
                color=[_SERIES[0], _SERIES[2]],
            )
            ac.set_xticks([0, 1], ["before", "after"])
            ac.set_ylabel("CPU over all graphs (vCPU)")
        fig.legend(*al.get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize=7)
    sv = w["saving"]
    return _chart(
        fig,
        f"whatif-{_slug(label)}",
        "whatif",
        f"What-if: {w['speedup']} — {label}",
        f"Before and after the speedup profile ({w['profile_after']}): mean latency overhead "
        f"−{sv['latency_overhead_us_mean']:.1f} µs ({sv['latency_overhead_pct_points_mean']:.1f} points), CPU "
        f"−{sv['cpu_vcpu_total']:.3g} vCPU ({100 * sv['cpu_saving_fraction']:.1f} %).",
    )


def validation_chart(cases: Sequence[T.ValidationCase], name: str = "validation") -> Chart | None:
    """Figure 8: predicted vs measured overhead per case, with the measurement's interval."""
    if not cases:
        return None
    metrics = [m for m in ("latency", "cpu") if any(c.metric == m for c in cases)]
    with matplotlib.rc_context(_RC):
        n = max(len([c for c in cases if c.metric == m]) for m in metrics)
        fig, axs = _new(max(5.0, 0.55 * n + 1.5) * len(metrics), 3.6, 1, len(metrics))
        for ax, metric in zip(axs, metrics):
            cs = [c for c in cases if c.metric == metric]
            x = np.arange(len(cs))
            meas = np.array([c.measured for c in cs])
            lo = np.array([c.measured if c.measured_lo is None else c.measured_lo for c in cs])
            hi = np.array([c.measured if c.measured_hi is None else c.measured_hi for c in cs])
            ax.bar(
                x - 0.2,
                meas,
                0.4,
                yerr=[np.maximum(meas - lo, 0), np.maximum(hi - meas, 0)],
                capsize=2,
                color=_SERIES[0],
                label="measured",
            )
            ax.bar(x + 0.2, [c.predicted for c in cs], 0.4, color=_SERIES[1], label="predicted")
            for xi, c in zip(x, cs):
                ax.annotate(
                    f"{c.error_pct:+.0f}%",
                    (xi, max(c.predicted, c.measured if c.measured_hi is None else c.measured_hi)),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
            ax.set_xticks(x, [c.name for c in cs], rotation=35, ha="right", fontsize=7)
            ax.set_ylabel("latency overhead (µs)" if metric == "latency" else "CPU overhead (vCPU)")
            ax.margins(y=0.15)
        axs[0].legend(fontsize=7, loc="upper left")
    return _chart(
        fig,
        f"validation-{_slug(name)}",
        "validation",
        f"Predicted vs measured — {name}",
        "Measured overhead (with its interval) and the prediction for each case; the label is the prediction's "
        "error relative to the measurement (the paper's Figure 8).",
    )
