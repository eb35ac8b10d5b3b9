"""The what-if study of measured optimizations (the paper's Figures 13/14): per message size,
CDFs of latency and CPU overhead across call graphs before and after each derived speedup,
and the mean reductions with their intervals next to the paper's published numbers.

Reads a ``meshtax-whatif-study/1`` document (:mod:`meshtax.app.whatif` writes it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from meshtax.report import html as H

if TYPE_CHECKING:
    from meshtax.report.figures import Chart

__all__ = ["FORMAT", "whatif_cdf_chart", "whatif_rows", "whatif_study_section"]

FORMAT = "meshtax-whatif-study/1"
_PANELS = (
    ("latency_overhead_us", "latency overhead (µs per call graph)"),
    ("cpu_vcpu", "CPU (vCPU)"),
)


def _size_label(size: float) -> str:
    return f"{size / 1024:g} KB" if size >= 1024 else f"{size:g} B"


def whatif_cdf_chart(name: str, at: Mapping[str, Any]) -> Chart | None:
    """Latency and CPU overhead CDFs at one message size: the baseline solid, each variant
    dashed (None without quantiles)."""
    lines = [("baseline", at.get("baseline") or {})]
    lines += [(str(v["label"]), v) for v in at.get("variants") or []]
    if not any(len(d.get(k, {}).get("quantiles") or []) >= 2 for _, d in lines for k, _ in _PANELS):
        return None
    import matplotlib  # here: the CLI imports this module, and matplotlib costs ~1 s

    from meshtax.report.figures import RC, SERIES, make_chart, new_figure, slug

    with matplotlib.rc_context(RC):
        fig, axes = new_figure(8.5, 3.2, 1, 2, sharey=True)
        for j, (label, d) in enumerate(lines):
            for ax, (key, _) in zip(axes, _PANELS):
                qs = d.get(key, {}).get("quantiles") or []
                if len(qs) < 2:
                    continue
                p = np.linspace(0.0, 1.0, len(qs))
                ax.step(
                    qs,
                    p,
                    where="post",
                    color=SERIES[j % len(SERIES)],
                    linestyle="-" if j == 0 else "--",
                    label=f"{label} (mean {d[key]['mean']:.4g})",
                )
        for ax, (_, xlabel) in zip(axes, _PANELS):
            ax.set_xscale("symlog")
            ax.set_xlabel(xlabel)
            ax.legend(fontsize=7, loc="lower right")
        axes[0].set_ylabel("fraction of call graphs")
    size = _size_label(float(at["size"]))
    return make_chart(
        fig,
        f"whatif-cdf-{slug(name)}-{slug(size)}",
        "cdf",
        f"What-if over {at.get('graphs', '?')} call graphs at {size}",
        "Empirical CDFs of each call graph's latency and CPU overhead with the measured "
        "baseline (solid) and after each derived speedup (dashed); the paper's Figures 13/14 "
        "on this machine.",
    )


def _pct(r: Mapping[str, Any] | None) -> str:
    if not r or r.get("value") is None:
        return "-"
    if r.get("lo") is None:
        return f"{r['value']:+.1f} %"
    return f"{r['value']:+.1f} % [{r['lo']:+.1f}, {r['hi']:+.1f}]"


def _paper(pub: Mapping[str, Any] | None, metric: str) -> str:
    if not pub:
        return "not published"
    parts = []
    if f"{metric}_pct" in pub:
        parts.append(f"{pub[f'{metric}_pct']:.1f} % at {pub.get('size_label', '')}")
    if f"headline_{metric}_pct" in pub:
        parts.append(f"{pub[f'headline_{metric}_pct']:g} % headline")
    if not parts and pub.get("summary"):
        parts.append("negligible")
    return "; ".join(parts) or "not published"


def whatif_rows(doc: Mapping[str, Any]) -> list[list[str]]:
    """One row per size and variant: mean overheads before → after, reductions of the mean
    with intervals, the paper's numbers."""
    rows = []
    for at in doc.get("sizes") or []:
        b = at.get("baseline") or {}
        for v in at.get("variants") or []:
            red = v.get("reduction_pct") or {}
            lat_b, lat_v = b["latency_overhead_us"]["mean"], v["latency_overhead_us"]["mean"]
            rows.append(
                [
                    str(v["label"]),
                    _size_label(float(at["size"])),
                    f"{lat_b:.1f} → {lat_v:.1f}",
                    _pct(red.get("latency")),
                    _paper(v.get("published"), "latency"),
                    f"{b['cpu_vcpu']['mean']:.3g} → {v['cpu_vcpu']['mean']:.3g}",
                    _pct(red.get("cpu")),
                    _paper(v.get("published"), "cpu"),
                ]
            )
    return rows


def whatif_study_section(
    doc: Mapping[str, Any], charts: list[Chart], notes: list[str], sid: str
) -> H.Section:
    """The report section of one what-if study document."""
    name = str(doc.get("name") or "what-if study")
    sec = H.Section(sid, f"What-if study: {name}")
    sec.blocks.append(
        H.para(
            f"Baseline profile {doc['base_profile']} ({doc['platform']}), {doc['mode']} mode "
            "sidecars on every service; each variant's speedup derived from a profile "
            f"measured on this machine. Intervals: {doc.get('interval', 'none')}."
        )
    )
    for w in doc.get("warnings") or []:
        sec.blocks.append(H.para(f"warning: {w}", "warn"))
    for n in doc.get("notes") or []:
        sec.blocks.append(H.para(n))
    head = [
        "variant",
        "size",
        "latency overhead mean (µs)",
        "reduction [95 %]",
        "paper",
        "CPU mean (vCPU)",
        "reduction [95 %]",
        "paper",
    ]
    sec.blocks.append(H.table(head, whatif_rows(doc)))
    for at in doc.get("sizes") or []:
        c = whatif_cdf_chart(name, at)
        if c is None:
            what = f"{name} at {_size_label(float(at['size']))}: no distributions"
            notes.append(what)
            sec.blocks.append(H.missing(what))
            continue
        charts.append(c)
        sec.blocks.append(H.figure(c.id, c.kind, c.title, c.caption, c.svg))
    return sec
