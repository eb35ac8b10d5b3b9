"""The report's figures of predictions and validations: the overview of many call graphs,
one call graph with its critical path, CDFs across graphs, what-if, measured vs predicted
(the profile figures are :mod:`meshtax.report.figures`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np

from meshtax.report import tables as T
from meshtax.report.figures import (
    CRITICAL,
    RC,
    SERIES,
    Chart,
    color,
    make_chart,
    new_figure,
    slug,
)


def overview_chart(label: str, doc: Mapping[str, Any], max_graphs: int = 40) -> Chart | None:
    """Per graph: latency overhead on the critical path and CPU, stacked by component, with intervals."""
    gs = doc["graphs"][:max_graphs]
    if not gs:
        return None
    comps = sorted(doc["components"], key=T.component_sort_key)
    with matplotlib.rc_context(RC):
        fig, (al, ac) = new_figure(9.0, 0.9 + 0.32 * len(gs), 1, 2, sharey=True)
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
    return make_chart(
        fig,
        f"overview-{slug(label)}",
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
    with matplotlib.rc_context(RC):
        fig, (ax,) = new_figure(2.3 * (depth + 1) + 0.5, 0.55 * leaves + 0.9)
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
    return make_chart(
        fig,
        f"callgraph-{slug(label)}-{slug(str(graph['name']))}",
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
    with matplotlib.rc_context(RC):
        fig, (al, ac) = new_figure(8.5, 3.3, 1, 2, sharey=True)
        for j, d in enumerate(dists):
            c = SERIES[j % len(SERIES)]
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
    return make_chart(
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
    with matplotlib.rc_context(RC):
        fig, (al, ac) = new_figure(
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
                ax.barh(y - 0.2, before_v, 0.4, color=SERIES[0], label="before")
                ax.barh(y + 0.2, after_v, 0.4, color=SERIES[2], label="after")
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
                color=SERIES[0],
                label="before",
            )
            al.bar(
                x + 0.2,
                [a["latency_overhead_us"][k] for k in ks],
                0.4,
                color=SERIES[2],
                label="after",
            )
            al.set_xticks(x, ks)
            al.set_ylabel("latency overhead (µs)")
            ac.bar(
                [0, 1],
                [b["cpu_vcpu_total"], a["cpu_vcpu_total"]],
                0.6,
                color=[SERIES[0], SERIES[2]],
            )
            ac.set_xticks([0, 1], ["before", "after"])
            ac.set_ylabel("CPU over all graphs (vCPU)")
        fig.legend(*al.get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize=7)
    sv = w["saving"]
    return make_chart(
        fig,
        f"whatif-{slug(label)}",
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
    with matplotlib.rc_context(RC):
        n = max(len([c for c in cases if c.metric == m]) for m in metrics)
        fig, axs = new_figure(max(5.0, 0.55 * n + 1.5) * len(metrics), 3.6, 1, len(metrics))
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
                color=SERIES[0],
                label="measured",
            )
            ax.bar(x + 0.2, [c.predicted for c in cs], 0.4, color=SERIES[1], label="predicted")
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
    return make_chart(
        fig,
        f"validation-{slug(name)}",
        "validation",
        f"Predicted vs measured — {name}",
        "Measured overhead (with its interval) and the prediction for each case; the label is the prediction's "
        "error relative to the measurement (the paper's Figure 8).",
    )
