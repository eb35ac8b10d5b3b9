"""The architecture comparison of a prediction (``predict --architecture a,b,…``): a document
section (plain dicts) and its text and CSV renderings, one column or row per architecture."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from meshtax.model.ecg import EcgBatch
from meshtax.predict.architecture import Arranged
from meshtax.predict.engine import BatchPrediction

if TYPE_CHECKING:
    from meshtax.report.figures import Chart

__all__ = [
    "architecture_chart",
    "architecture_section",
    "architectures_csv",
    "architectures_text",
]


def roles_text(roles: Mapping[str, str]) -> str:
    """Which profile prices each role, given the profiles measured in a role (by role)."""
    node, way = roles.get("node-l4"), roles.get("waypoint")
    parts = ["sidecar: the service's mode, filters and mTLS"]
    parts.append(
        f"node proxy (node-l4): profile {node!r}, measured as Envoy per node (plaintext within a "
        "node, its inter-node mTLS across) — Envoy in ztunnel's role, not ztunnel"
        if node
        else "node proxy (node-l4): the service's profile in tcp mode with its mTLS — an Envoy "
        "tcp-mode profile is a stand-in for ztunnel, not ztunnel"
    )
    parts.append(
        f"waypoint: profile {way!r}, measured as an Envoy waypoint in the destination's mode"
        if way
        else "waypoint: the destination's mode, filters and mTLS"
    )
    return "; ".join(parts)


def _iv(v: float, lo: float, hi: float) -> dict[str, float]:
    return {"value": float(v), "lo": float(lo), "hi": float(hi)}


def architecture_section(
    batch: EcgBatch,
    results: Sequence[tuple[Arranged, BatchPrediction]],
    memory: Mapping[str, dict[str, Any] | None],
    pods_per_node: int,
    roles: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Per architecture: the proxies it runs, each graph's latency and CPU overhead (95 %
    intervals), and the proxies' memory when the profiles have memory models; ``roles``: the
    profiles measured in a role that priced them (by role)."""
    rows = []
    for arranged, bp in results:
        a = arranged.architecture.value
        counts: dict[str, int] = {}
        for arch in arranged.architectures.values():
            counts[arch.value] = counts.get(arch.value, 0) + 1
        rows.append(
            {
                "architecture": a,
                "services": counts,
                "node_proxies": arranged.n_nodes,
                "graphs": [
                    {
                        "name": batch.graph_names[g],
                        "latency_overhead_us": _iv(
                            bp.latency_overhead_us[g], bp.latency_lo_us[g], bp.latency_hi_us[g]
                        ),
                        "cpu_vcpu": _iv(bp.cpu_vcpu[g], bp.cpu_lo_vcpu[g], bp.cpu_hi_vcpu[g]),
                    }
                    for g in range(batch.n_graphs)
                ],
                "memory": memory.get(a),
            }
        )
    return {
        "pods_per_node": pods_per_node,
        "roles": roles_text(roles or {}),
        "role_profiles": dict(roles or {}),
        "by_architecture": rows,
    }


def _mb(m: Mapping[str, Any] | None) -> str:
    return "-" if m is None else f"{m['total_bytes'] / 1e6:.1f} MB ({m['proxies']} proxies)"


def architectures_text(section: Mapping[str, Any]) -> str:
    """Side by side: one column per architecture, rows per graph (latency, CPU), memory."""
    archs = section["by_architecture"]
    head = ["", *(a["architecture"] for a in archs)]
    lines = [head]
    for g, first in enumerate(archs[0]["graphs"]):
        lines.append(
            [f"{first['name']} latency (µs)"]
            + [f"{a['graphs'][g]['latency_overhead_us']['value']:.1f}" for a in archs]
        )
        lines.append(
            [f"{first['name']} CPU (vCPU)"]
            + [f"{a['graphs'][g]['cpu_vcpu']['value']:.4f}" for a in archs]
        )
    lines.append(["node proxies"] + [str(a["node_proxies"]) for a in archs])
    lines.append(["memory"] + [_mb(a["memory"]) for a in archs])
    widths = [max(len(r[k]) for r in lines) for k in range(len(head))]
    out = [f"architectures (pods per node for unplaced services: {section['pods_per_node']})"]
    for r in lines:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        out.append("  ".join(cells).rstrip())
    out.append(f"roles priced: {section['roles']}")
    return "\n".join(out) + "\n"


def architectures_csv(section: Mapping[str, Any]) -> str:
    """One row per architecture and graph."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        [
            "architecture",
            "graph",
            "latency_overhead_us",
            "latency_lo_us",
            "latency_hi_us",
            "cpu_vcpu",
            "cpu_lo_vcpu",
            "cpu_hi_vcpu",
            "node_proxies",
            "memory_bytes",
        ]
    )
    for a in section["by_architecture"]:
        mem = a["memory"]
        for g in a["graphs"]:
            lat, cpu = g["latency_overhead_us"], g["cpu_vcpu"]
            w.writerow(
                [a["architecture"], g["name"]]
                + [f"{x:.6g}" for x in (lat["value"], lat["lo"], lat["hi"])]
                + [f"{x:.6g}" for x in (cpu["value"], cpu["lo"], cpu["hi"])]
                + [a["node_proxies"], "" if mem is None else f"{mem['total_bytes']:.6g}"]
            )
    return buf.getvalue()


def architecture_chart(label: str, doc: Mapping[str, Any]) -> Chart | None:
    """One comparison figure: per architecture, the mean latency overhead over the graphs
    (with the graphs' range), the CPU over all graphs, and the proxies' memory when known."""
    import matplotlib  # here: `predict` imports this module, and matplotlib costs ~1 s

    from meshtax.report.figures import RC, SERIES, make_chart, new_figure, slug

    sec = doc.get("architectures")
    if not sec:
        return None
    rows = sec["by_architecture"]
    names = [r["architecture"] for r in rows]
    lat = [[g["latency_overhead_us"]["value"] for g in r["graphs"]] for r in rows]
    cpu = [sum(g["cpu_vcpu"]["value"] for g in r["graphs"]) for r in rows]
    mem = [None if r["memory"] is None else r["memory"]["total_bytes"] / 1e6 for r in rows]
    panels = 3 if any(m is not None for m in mem) else 2
    x = np.arange(len(rows))
    colors = [SERIES[k % len(SERIES)] for k in range(len(rows))]
    with matplotlib.rc_context(RC):
        fig, axes = new_figure(3.0 * panels, 3.0, 1, panels)
        mean = np.array([float(np.mean(v)) if v else 0.0 for v in lat])
        lo = mean - np.array([min(v, default=0.0) for v in lat])
        hi = np.array([max(v, default=0.0) for v in lat]) - mean
        axes[0].bar(x, mean, 0.6, color=colors, yerr=[lo, hi], capsize=3)
        axes[0].set_ylabel("latency overhead (µs), mean [graphs' range]")
        axes[1].bar(x, cpu, 0.6, color=colors)
        axes[1].set_ylabel("CPU over all graphs (vCPU)")
        if panels == 3:
            axes[2].bar(x, [0.0 if m is None else m for m in mem], 0.6, color=colors)
            axes[2].set_ylabel("proxies' memory (MB)")
        for ax in axes:
            ax.set_xticks(x, names)
    return make_chart(
        fig,
        f"architectures-{slug(label)}",
        "architectures",
        f"Architectures: {label}",
        "The same call graphs priced with sidecars, per-node L4 proxies, waypoints or no proxy "
        f"(unplaced services {sec['pods_per_node']} to a node). Roles priced: {sec['roles']}.",
    )
