"""Human-readable tables (rich) rendered to text; the CLI prints them."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from rich.console import Console
from rich.table import Table

from meshtax.model.components import BASE_COMPONENTS, Component
from meshtax.model.profile import Platform, Profile

#: Conditions of the paper's Table 2: one request (request + response) through one sidecar.
TABLE_BYTES = 100.0
TABLE_RATE = 30_000.0


def _render(*items: Any, width: int = 110) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=width, no_color=True, highlight=False, soft_wrap=False)
    for it in items:
        # text lines are never folded (they are read and grepped whole); tables fit the width
        con.print(it, soft_wrap=isinstance(it, str))
    return buf.getvalue()


def _iv(e: Mapping[str, float], fmt: str = "{:.1f}") -> str:
    v, lo, hi = e["value"], e["lo"], e["hi"]
    if lo == v == hi:
        return fmt.format(v)
    return f"{fmt.format(v)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def _label(key: str) -> str:
    return Component.parse(key).label


def prediction_text(doc: Mapping[str, Any]) -> str:
    items: list[Any] = []
    p = doc["profile"]
    where = "this host" if p["platform_is_this_host"] else "NOT this host"
    src = {"published": "published data", "measured": "measured", "derived": "derived"}.get(
        p["source"], p["source"]
    )
    items.append(
        f"profile {p['name']!r} ({src}; platform: {p['platform']['cpu_model']}, {p['platform']['cores']} cores, "
        f"Linux {p['platform']['kernel']}, {p['platform']['proxy']} {p['platform']['proxy_version']} — {where})"
    )
    if "placement" in doc:
        pl = doc["placement"]
        items.append(
            f"pods share {pl['pod_cpus']} CPU(s): in {pl['graphs_bound_by_cpu']} of "
            f"{len(doc['graphs'])} graph(s) the request's "
            "sidecar CPU work, queued on those CPUs, sets the latency overhead rather than the critical path"
        )
    for g in doc["graphs"][:20]:
        items.append("")
        items.append(f"[bold]{g['name']}[/bold]: mesh-free latency {g['base_latency_us']:.0f} µs")
        t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        t.add_column("overhead")
        t.add_column("value [95% interval]", justify="right")
        t.add_row("latency (µs)", _iv(g["latency_overhead_us"]))
        t.add_row("latency (% of mesh-free)", f"{g['latency_overhead_pct']:.1f}%")
        t.add_row("CPU (vCPU at the graph's rates)", _iv(g["cpu_vcpu"], "{:.3f}"))
        items.append(t)
        c = Table(
            title="by component",
            title_justify="left",
            header_style="bold",
            box=None,
            pad_edge=False,
        )
        c.add_column("component")
        c.add_column("latency on critical path (µs)", justify="right")
        c.add_column("CPU (vCPU)", justify="right")
        for k in doc["components"]:
            c.add_row(
                _label(k),
                f"{g['latency_by_component_us'][k]:.1f}",
                f"{g['cpu_by_component_vcpu'][k]:.3f}",
            )
        if abs(g["absorbed_us"]) > 1e-9:
            c.add_row("hidden by parallel calls", f"-{g['absorbed_us']:.1f}", "")
        items.append(c)
        if "by_service" in g:
            s = Table(
                title="by service (its sidecar)",
                title_justify="left",
                header_style="bold",
                box=None,
                pad_edge=False,
            )
            s.add_column("service")
            s.add_column("latency on critical path (µs)", justify="right")
            s.add_column("CPU (vCPU)", justify="right")
            for row in g["by_service"]:
                s.add_row(
                    row["service"], f"{row['latency_on_path_us']:.1f}", f"{row['cpu_vcpu']:.3f}"
                )
            items.append(s)
            changed = " (changed by the overhead)" if g["critical_path_changed"] else ""
            items.append("critical path" + changed + ": " + " ; ".join(g["critical_path"]))
            if g["critical_path_changed"]:
                items.append("  before: " + " ; ".join(g["critical_path_before"]))
    if len(doc["graphs"]) > 20:
        items.append(f"… {len(doc['graphs']) - 20} more graphs (use --format json or csv for all)")
    s = doc["summary"]
    if s["graphs"] > 1:
        d = Table(
            title=f"distribution over {s['graphs']} graphs",
            title_justify="left",
            header_style="bold",
            box=None,
            pad_edge=False,
        )
        d.add_column("")
        for k in ("mean", "p50", "p90", "p99"):
            d.add_column(k, justify="right")
        for name, key, fmt in (
            ("latency overhead (µs)", "latency_overhead_us", "{:.1f}"),
            ("latency overhead (%)", "latency_overhead_pct", "{:.1f}"),
            ("CPU (vCPU)", "cpu_vcpu", "{:.3f}"),
        ):
            d.add_row(name, *(fmt.format(s[key][k]) for k in ("mean", "p50", "p90", "p99")))
        items += ["", d]
    if "whatif" in doc:
        w = doc["whatif"]
        b, a, sv = w["before"], w["after"], w["saving"]
        t = Table(
            title=f"what-if: {w['speedup']}",
            title_justify="left",
            header_style="bold",
            box=None,
            pad_edge=False,
        )
        for col in ("", "before", "after", "saving"):
            t.add_column(col, justify="right" if col else "left")
        t.add_row(
            "latency overhead, mean (µs)",
            f"{b['latency_overhead_us']['mean']:.1f}",
            f"{a['latency_overhead_us']['mean']:.1f}",
            f"{sv['latency_overhead_us_mean']:.1f}",
        )
        t.add_row(
            "latency overhead, mean (%)",
            f"{b['latency_overhead_pct']['mean']:.1f}",
            f"{a['latency_overhead_pct']['mean']:.1f}",
            f"{sv['latency_overhead_pct_points_mean']:.1f} pts",
        )
        t.add_row(
            "CPU, total (vCPU)",
            f"{b['cpu_vcpu_total']:.3f}",
            f"{a['cpu_vcpu_total']:.3f}",
            f"{sv['cpu_vcpu_total']:.3f} ({100 * sv['cpu_saving_fraction']:.1f}%)",
        )
        items += ["", t]
    if "memory" in doc:
        m = Table(
            title="sidecar memory (resident)",
            title_justify="left",
            header_style="bold",
            box=None,
            pad_edge=False,
        )
        for col in ("service", "connections", "MiB [95% interval]"):
            m.add_column(col, justify="left" if col == "service" else "right")
        for r in doc["memory"]["per_pod"]:
            m.add_row(
                r["service"],
                str(r["connections"]),
                f"{r['bytes'] / 2**20:.1f} [{r['bytes_lo'] / 2**20:.1f}, {r['bytes_hi'] / 2**20:.1f}]",
            )
        m.add_row("total", "", f"{doc['memory']['total_bytes'] / 2**20:.1f}")
        items += ["", m]
    if "import" in doc:
        imp = doc["import"]
        items.append(
            f"traces: {imp['graphs_kept']} of {imp['graphs_seen']} call graphs kept ({imp['graphs_dropped']} dropped); "
            f"{imp['rows_read']} rows/spans read"
            + (f"; dropped: {imp['dropped_graphs']}" if imp["dropped_graphs"] else "")
        )
    for wmsg in doc["warnings"]:
        items.append(f"warning: {wmsg}")
    return _render(*items)


class ProfileRow(Protocol):
    """One line of ``profiles list`` (the store's summary satisfies it)."""

    @property
    def name(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def created(self) -> str: ...
    @property
    def modes(self) -> Sequence[str]: ...
    @property
    def filters(self) -> Sequence[str]: ...
    @property
    def platform(self) -> Platform: ...
    @property
    def bundled(self) -> bool: ...


def profiles_text(rows: Sequence[ProfileRow]) -> str:
    t = Table(header_style="bold", box=None, pad_edge=False)
    for col in ("name", "source", "created", "modes", "filters", "platform"):
        t.add_column(col)
    for r in rows:
        t.add_row(
            r.name + (" (bundled)" if r.bundled else ""),
            r.source,
            r.created[:19],
            ",".join(r.modes),
            ",".join(r.filters) or "-",
            r.platform.describe(),
        )
    return _render(t, width=160)


def _cell(model_mean: float, se: float, fmt: str) -> str:
    return (
        fmt.format(model_mean) if se == 0 else f"{fmt.format(model_mean)} ± {fmt.format(1.96 * se)}"
    )


def profile_text(profile: Profile, size: float = TABLE_BYTES, rate: float = TABLE_RATE) -> str:
    """The breakdown table (the paper's Table 2 layout): one request (request + response)
    through one sidecar at ``size`` bytes; CPU in vCPU at ``rate`` requests/s; ± is a 95 % interval."""
    pv = profile.provenance
    head = [
        f"profile {profile.name!r}: {pv.source} by {pv.by} on {pv.created}",
        f"platform: {profile.platform.describe()}",
        *[f"note: {n}" for n in pv.notes],
        f"one request through one sidecar at {size:g} B; CPU at {rate:g} requests/s",
    ]
    t = Table(header_style="bold", box=None, pad_edge=False)
    t.add_column("component")
    # a mode's carried models (e.g. gRPC through a tcp-mode sidecar) get columns "tcp+grpc"
    cols = [(mp.mode.value, mp) for mp in profile.modes.values()]
    cols = [
        c
        for name, mp in cols
        for c in [(name, mp), *((f"{name}+{p}", cm) for p, cm in sorted(mp.carried.items()))]
    ]
    modes = [mp for _, mp in cols]
    for name, _ in cols:
        t.add_column(f"{name} latency (µs)", justify="right")
        t.add_column(f"{name} CPU (vCPU)", justify="right")
    order = {c: i for i, c in enumerate(BASE_COMPONENTS)}
    comps = sorted(
        {c for mp in modes for c in mp.components if not c.name},
        key=lambda c: (order.get(c, len(order)), c.key),
    )
    filters = sorted({c for mp in modes for c in mp.components if c.name})
    totals = {id(mp): [0.0, 0.0] for mp in modes}
    s = np.array([size])

    def row(c: Component) -> list[str]:
        cells = []
        for mp in modes:
            m = mp.components.get(c)
            if m is None:
                cells += ["-", "-"]
                continue
            lat = 2 * float(m.latency.predict(s)[0])
            cpu = 2 * float(m.cpu.predict(s)[0]) * rate * 1e-6
            lse = 2 * float(m.latency.stderr_at(s)[0])
            cse = 2 * float(m.cpu.stderr_at(s)[0]) * rate * 1e-6
            pct = ""
            if c.name:  # filters: CPU % over the base mode, as in the paper's Table 3 (latency is within noise here)
                base_cpu = totals[id(mp)][1]
                pct = f" ({100 * cpu / base_cpu:+.0f}%)" if base_cpu else ""
            else:
                totals[id(mp)][0] += lat
                totals[id(mp)][1] += cpu
            cells += [_cell(lat, lse, "{:.2f}"), _cell(cpu, cse, "{:.2f}") + pct]
        return cells

    for c in comps:
        t.add_row(c.label, *row(c))
    t.add_row(
        "[bold]total[/bold]" + (" (without filters)" if filters else ""),
        *[f"{v:.2f}" for mp in modes for v in totals[id(mp)]],
    )
    for c in filters:
        t.add_row(c.label, *row(c))
    closure = [
        f"closure {name}: components {mp.closure.components_us:.1f} µs vs measured {mp.closure.measured_us:.1f} µs "
        f"[{mp.closure.measured_lo_us:.1f}, {mp.closure.measured_hi_us:.1f}] → {100 * mp.closure.error:+.1f}% "
        + (
            "(closes)"
            if mp.closure.closes
            else f"(DOES NOT CLOSE within ±{100 * mp.closure.tolerance:.0f}%)"
        )
        for name, mp in cols
        if mp.closure is not None
    ]
    return _render(*head, "", t, *closure, width=160)
