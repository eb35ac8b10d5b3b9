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
SERIES = ("#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2", "#edc948", "#9c755f")
CRITICAL = "#d62728"
RC: dict[Any, Any] = {
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
    # breakdown | filters | latency-size | cpu-size-rate | callgraph | overview | cdf | whatif |
    # validation | comparison
    kind: str
    title: str
    caption: str
    svg: str


def color(key: str) -> str:
    if T.is_filter(key):
        return _FILTER_COLORS[sum(map(ord, key)) % len(_FILTER_COLORS)]
    return _KIND_COLORS.get(key, "#888888")


def slug(text: str) -> str:
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
    p = slug(fid) + "-"
    s = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{p}{m.group(1)}"', s)
    s = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{p}{m.group(1)})", s)
    s = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{p}{m.group(1)}"', s)
    return s.replace("<svg ", f'<svg role="img" aria-label="{fid}" ', 1)


def new_figure(
    w: float, h: float, nrows: int = 1, ncols: int = 1, **kw: Any
) -> tuple[Figure, list[Axes]]:
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(w, h), layout="constrained")
        axs = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, [a for row in axs for a in row]


def make_chart(fig: Figure, fid: str, kind: str, title: str, caption: str) -> Chart:
    with matplotlib.rc_context(RC):
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
    with matplotlib.rc_context(RC):
        fig, (al, ac) = new_figure(8.0, 3.4, 1, 2)
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
    return make_chart(
        fig,
        f"breakdown-{slug(name)}",
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
    with matplotlib.rc_context(RC):
        fig, (al, ac) = new_figure(
            8.0, 0.5 + 0.35 * len(filters) * len(modes) + 1.0, 1, 2, sharey=True
        )
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
                    color=SERIES[j % len(SERIES)],
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
    return make_chart(
        fig,
        f"filters-{slug(name)}",
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
    with matplotlib.rc_context(RC):
        fig, axs = new_figure(3.0 * len(modes) + 1.6, 3.2, 1, len(modes), sharey=True)
        _vs_size(axs, series, modes, "latency per message (µs)")
        axs[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return make_chart(
        fig,
        f"latency-size-{slug(name)}",
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
    with matplotlib.rc_context(RC):
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
            c = SERIES[j % len(SERIES)]
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
    return make_chart(
        fig,
        f"cpu-{slug(name)}",
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
    with matplotlib.rc_context(RC):
        fig, axs = new_figure(3.2 * len(modes) + 0.6, 5.6, 2, len(modes))
        for col, mode in enumerate(modes):
            rs = [r for r in rows if r.mode == mode]
            x = np.arange(len(rs))
            for row, (metric, unit) in enumerate(
                (("latency", "latency (µs)"), ("cpu", "CPU (vCPU)"))
            ):
                ax = axs[row * len(modes) + col]
                va = [(r.latency_a if metric == "latency" else r.cpu_a) for r in rs]
                vb = [(r.latency_b if metric == "latency" else r.cpu_b) for r in rs]
                ax.bar(x - 0.2, [v or 0.0 for v in va], 0.4, color=SERIES[0], label=cmp.a)
                ax.bar(x + 0.2, [v or 0.0 for v in vb], 0.4, color=SERIES[1], label=cmp.b)
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
    return make_chart(
        fig,
        f"comparison-{slug(cmp.a)}-vs-{slug(cmp.b)}",
        "comparison",
        f"{cmp.a} vs {cmp.b}",
        f"Per component, one request ({cmp.size_bytes:g} B) through one sidecar; CPU at {cmp.rate_rps:g} req/s. "
        "Components a profile lacks are drawn as 0 and shown as — in the table.",
    )


# ---- predictions -------------------------------------------------------------------------------
