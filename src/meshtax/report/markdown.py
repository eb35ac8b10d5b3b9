"""Markdown for pull requests and issues: predictions, profiles and profile comparisons.

GitHub-flavoured tables, numbers rounded for reading (the JSON export keeps full precision),
deterministic output (golden-file tested).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from meshtax.report import tables as T


def _row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def table(
    head: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[bool] | None = None
) -> str:
    """A GitHub table; numeric columns right-aligned (``right`` defaults to all but the first)."""
    right = right if right is not None else [False] + [True] * (len(head) - 1)
    align = ["---:" if r else "---" for r in right]
    return "\n".join([_row(head), _row(align), *(_row(r) for r in rows)])


def interval(e: Mapping[str, float], fmt: str = "{:.1f}") -> str:
    v, lo, hi = e["value"], e["lo"], e["hi"]
    if v is None:  # NaN is written as null in JSON
        return "—"
    if lo is None or hi is None or lo == v == hi:
        return fmt.format(v)
    return f"{fmt.format(v)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def cell(c: T.Cell, fmt: str) -> str:
    return fmt.format(c.value) if c.half == 0 else f"{fmt.format(c.value)} ± {fmt.format(c.half)}"


def _opt(v: float | None, fmt: str) -> str:
    return "—" if v is None else fmt.format(v)


def profile_line(p: Mapping[str, Any]) -> str:
    pl = p["platform"]
    where = "this host" if p.get("platform_is_this_host") else "not this host"
    return (
        f"Profile **{p['name']}** ({p['source']}; {pl['cpu_model']}, {pl['cores']} cores, Linux {pl['kernel']}, "
        f"{pl['proxy']} {pl['proxy_version']} — {where})"
    )


def prediction_markdown(doc: Mapping[str, Any], max_graphs: int = 50) -> str:
    out = ["# meshtax prediction", "", profile_line(doc["profile"]), ""]
    comps = sorted(doc["components"], key=T.component_sort_key)
    gs = doc["graphs"]  # a list, or a GraphList read graph by graph
    rows = [
        [
            g["name"],
            f"{g['base_latency_us']:.0f}",
            interval(g["latency_overhead_us"]),
            f"{g['latency_overhead_pct']:.1f}",
            interval(g["cpu_vcpu"], "{:.3f}"),
        ]
        for g in gs[:max_graphs]
    ]
    out += [
        "## Overhead per call graph",
        "",
        table(
            [
                "graph",
                "mesh-free latency (µs)",
                "latency overhead (µs) [95% interval]",
                "latency overhead (%)",
                "CPU (vCPU)",
            ],
            rows,
        ),
    ]
    if len(gs) > max_graphs:
        out += ["", f"… {len(gs) - max_graphs} more graphs (the JSON and CSV exports have all)."]
    rows = [
        [g["name"], *(f"{g['latency_by_component_us'].get(k, 0.0):.1f}" for k in comps)]
        for g in gs[:max_graphs]
    ]
    out += [
        "",
        "## Latency on the critical path by component (µs)",
        "",
        table(["graph", *(T.label(k) for k in comps)], rows),
    ]
    rows = [
        [g["name"], *(f"{g['cpu_by_component_vcpu'].get(k, 0.0):.3f}" for k in comps)]
        for g in gs[:max_graphs]
    ]
    out += [
        "",
        "## CPU by component (vCPU)",
        "",
        table(["graph", *(T.label(k) for k in comps)], rows),
    ]
    paths = [g for g in gs[:max_graphs] if g.get("critical_path")]
    if paths:
        out += ["", "## Critical paths", ""]
        for g in paths:
            changed = (
                " (changed by the overhead; before: " + " ; ".join(g["critical_path_before"]) + ")"
                if g["critical_path_changed"]
                else ""
            )
            out.append(f"- **{g['name']}**: " + " ; ".join(g["critical_path"]) + changed)
    s = doc["summary"]
    if s["graphs"] > 1:
        ks = ("mean", "p50", "p90", "p99")
        rows = [
            [name, *(fmt.format(s[key][k]) for k in ks)]
            for name, key, fmt in (
                ("latency overhead (µs)", "latency_overhead_us", "{:.1f}"),
                ("latency overhead (%)", "latency_overhead_pct", "{:.1f}"),
                ("CPU (vCPU)", "cpu_vcpu", "{:.3f}"),
            )
        ]
        out += ["", f"## Distribution over {s['graphs']} graphs", "", table(["", *ks], rows)]
    w = doc.get("whatif")
    if w:
        b, a, sv = w["before"], w["after"], w["saving"]
        rows = [
            [
                "latency overhead, mean (µs)",
                f"{b['latency_overhead_us']['mean']:.1f}",
                f"{a['latency_overhead_us']['mean']:.1f}",
                f"{sv['latency_overhead_us_mean']:.1f}",
            ],
            [
                "latency overhead, mean (%)",
                f"{b['latency_overhead_pct']['mean']:.1f}",
                f"{a['latency_overhead_pct']['mean']:.1f}",
                f"{sv['latency_overhead_pct_points_mean']:.1f} pts",
            ],
            [
                "CPU, total (vCPU)",
                f"{b['cpu_vcpu_total']:.3f}",
                f"{a['cpu_vcpu_total']:.3f}",
                f"{sv['cpu_vcpu_total']:.3f} ({100 * sv['cpu_saving_fraction']:.1f}%)",
            ],
        ]
        out += [
            "",
            f"## What-if: {w['speedup']}",
            "",
            table(["", "before", "after", "saving"], rows),
        ]
    out += _tail_markdown(doc)
    if doc.get("warnings"):
        out += ["", "## Warnings", "", *(f"- {m}" for m in doc["warnings"])]
    out += [
        "",
        f"<sub>{doc['tool']['name']} {doc['tool']['version']}, {doc['format']}, created {doc['created']}</sub>",
    ]
    return "\n".join(out) + "\n"


def _tail_markdown(doc: Mapping[str, Any]) -> list[str]:
    """The tail's pooled percentiles (when the document has one) and how it was priced."""
    t, lines = doc.get("tail"), T.tail_pricing_lines(doc)
    if not t and not lines:
        return []
    out = ["", "## Tail latency under load", ""]
    if t:
        pooled, ps = t["pooled"], [f"p{p:g}" for p in t["percentiles"]]
        rows = [
            [
                p,
                f"{pooled['base_us'][p]:.0f}",
                f"{pooled['with_mesh_us'][p]:.0f}",
                f"{pooled['overhead_us'][p]:.0f} [{pooled['lo_us'][p]:.0f}, "
                f"{pooled['hi_us'][p]:.0f}]",
            ]
            for p in ps
        ]
        out += [
            f"At {t['request_rate']:.0f} requests/s, pooled over the graphs (µs):",
            "",
            table(["", "without mesh", "with mesh", "overhead [95% interval]"], rows),
            "",
        ]
    return out + [f"- {x}" for x in lines]


def profile_markdown(
    doc: Mapping[str, Any], size: float = T.TABLE_BYTES, rate: float = T.TABLE_RATE
) -> str:
    pv = doc["provenance"]
    out = [
        f"# meshtax profile {doc['name']}",
        "",
        f"- source: {pv['source']} by {pv['by']} on {pv['created']}",
        f"- platform: {T.platform_text(doc)}",
        *(f"- note: {n}" for n in pv.get("notes", [])),
        "",
        f"One request ({size:g} B request and response) through one sidecar; CPU at {rate:g} "
        "requests/s; ± is a 95 % interval.",
        "",
    ]
    modes = T.breakdown(doc, size, rate)
    comps = sorted({k for m in modes for k in m.base_components()}, key=T.component_sort_key)
    filters = sorted({k for m in modes for k in m.filters()}, key=T.component_sort_key)
    head = ["component", *(f"{m.mode} {x}" for m in modes for x in ("latency (µs)", "CPU (vCPU)"))]

    def cells(k: str) -> list[str]:
        r = []
        for m in modes:
            if k not in m.latency_us:
                r += ["—", "—"]
                continue
            pct = ""
            base = m.total("latency").value
            if (
                T.is_filter(k) and base
            ):  # filters: % over the mode without filters, as in the paper's Table 3
                pct = f" (+{100 * m.latency_us[k].value / base:.0f}%)"
            r += [cell(m.latency_us[k], "{:.2f}") + pct, cell(m.cpu_vcpu[k], "{:.2f}")]
        return r

    rows = [[T.label(k), *cells(k)] for k in comps]
    rows.append(
        [
            "**total**" + (" (without filters)" if filters else ""),
            *(f"{m.total(x).value:.2f}" for m in modes for x in ("latency", "cpu")),
        ]
    )
    rows += [[T.label(k), *cells(k)] for k in filters]
    out.append(table(head, rows))
    closures = [(m.mode, m.closure) for m in modes if m.closure]
    if closures:
        out += ["", "## Closure", ""]
        rows = []
        for mode, c in closures:
            assert c is not None
            err = (
                (c["components_us"] - c["measured_us"]) / c["measured_us"]
                if c["measured_us"]
                else float("inf")
            )
            ok = (
                "closes"
                if abs(err) <= c["tolerance"]
                else f"does NOT close within ±{100 * c['tolerance']:.0f}%"
            )
            rows.append(
                [
                    mode,
                    f"{c['components_us']:.1f}",
                    f"{c['measured_us']:.1f} [{c['measured_lo_us']:.1f}, {c['measured_hi_us']:.1f}]",
                    f"{100 * err:+.1f}%",
                    ok,
                ]
            )
        out.append(
            table(
                ["mode", "sum of components (µs)", "measured (µs)", "error", ""],
                rows,
                [False, True, True, True, False],
            )
        )
    return "\n".join(out) + "\n"


def comparison_markdown(cmp: T.Comparison) -> str:
    out = [
        f"# {cmp.a} vs {cmp.b}",
        "",
        f"- A = **{cmp.a}**: {cmp.a_platform}",
        f"- B = **{cmp.b}**: {cmp.b_platform}",
        "",
        f"One request ({cmp.size_bytes:g} B) through one sidecar; CPU at {cmp.rate_rps:g} "
        "requests/s; differences are B − A.",
        "",
    ]
    rows = []
    for r in cmp.rows:
        ld, lp = r.latency_diff
        cd, cp = r.cpu_diff
        name = "**total**" if r.component == "total" else T.label(r.component)
        rows.append(
            [
                r.mode,
                name,
                _opt(r.latency_a, "{:.2f}"),
                _opt(r.latency_b, "{:.2f}"),
                _opt(ld, "{:+.2f}"),
                _opt(lp, "{:+.0f}%"),
                _opt(r.cpu_a, "{:.3f}"),
                _opt(r.cpu_b, "{:.3f}"),
                _opt(cd, "{:+.3f}"),
                _opt(cp, "{:+.0f}%"),
            ]
        )
    out.append(
        table(
            [
                "mode",
                "component",
                "latency A (µs)",
                "latency B (µs)",
                "Δ (µs)",
                "Δ %",
                "CPU A (vCPU)",
                "CPU B (vCPU)",
                "Δ (vCPU)",
                "Δ %",
            ],
            rows,
            [False, False] + [True] * 8,
        )
    )
    return "\n".join(out) + "\n"


class MarkdownExporter:
    """Predictions (documents with ``graphs``) and profiles (documents with ``modes``)."""

    suffix = ".md"

    def write(self, doc: Mapping[str, Any], out: TextIO) -> None:
        out.write(self.export(doc))  # at most 50 graphs: small

    def export(self, doc: Mapping[str, Any]) -> str:
        if "graphs" in doc:
            return prediction_markdown(doc)
        if "modes" in doc:
            return profile_markdown(doc)
        raise ValueError("not a prediction or profile document (no 'graphs' or 'modes')")
