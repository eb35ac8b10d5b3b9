"""The microarchitectural profile as tables — counts per request, the split into parsing /
filters / other, additivity on instructions, this machine next to the published numbers,
kernel work per request — rendered as text, Markdown or HTML from one set of tables; and the
agreement of two profiles, item by item (``benchmarks/bench_microarch.py``)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from meshtax.model.microarch import (
    AGREEMENT_BOUNDS,
    METRICS,
    MIN_COUNT,
    PUBLISHED_BRANCHES,
    PUBLISHED_MICROARCH,
    PUBLISHED_RATIOS,
    SAHU,
    TOPDOWN,
    CounterRow,
    Microarch,
    metric,
)
from meshtax.report import html as H
from meshtax.report.markdown import table as md_table

__all__ = [
    "AGREEMENT_METRICS",
    "Additivity",
    "Agreement",
    "Tab",
    "additivity",
    "agreement",
    "microarch_document",
    "microarch_html",
    "microarch_markdown",
    "microarch_tables",
    "microarch_text",
    "published_ratios",
]

BASE = "base"
#: our variant(s) for each of the published policies (RBAC: HTTP and network filter; which one
#: the study used is not stated, and a network RBAC runs once per connection)
POLICIES: dict[str, tuple[str, ...]] = {
    "ip_tag_1": ("ip_tagging_1",),
    "ip_tag_5": ("ip_tagging_5",),
    "ip_tag_10": ("ip_tagging_10",),
    "rbac_100": ("rbac_http_100", "rbac_network_100"),
    "rbac_10k": ("rbac_http_10000", "rbac_network_10000"),
}
#: compared between two runs: instructions within 2 %, simulated misses within 5 % (issue #19)
AGREEMENT_METRICS: dict[str, float] = AGREEMENT_BOUNDS
LABELS = {
    "instructions": "instructions",
    "i1_misses": "I1 misses",
    "d1_misses": "D1 misses",
    "ll_misses": "LL misses",
    "branch_misses": "branch mispredictions",
}


@dataclass(frozen=True)
class Tab:
    title: str
    head: tuple[str, ...]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


def _m(row: CounterRow, source: str, name: str) -> float | None:
    return metric(row.per_request, source, name)


def _f(v: float | None, fmt: str = "{:,.0f}") -> str:
    return "—" if v is None else fmt.format(v)


def _mpki(row: CounterRow, source: str, name: str) -> str:
    i, x = _m(row, source, "instructions"), _m(row, source, name)
    if not i or x is None:
        return "—"
    v = 1000 * x / i
    return "0.00" if abs(v) < 0.005 else f"{v:.2f}"  # a difference of two windows: ±0, not −0


def _groups(m: Microarch) -> dict[tuple[str, int], list[CounterRow]]:
    out: dict[tuple[str, int], list[CounterRow]] = {}
    for r in m.rows:
        out.setdefault((r.mode, r.size), []).append(r)
    return out


def counts_table(m: Microarch) -> Tab:
    pmu = m.source == "pmu"
    head = (
        "mode",
        "size (B)",
        "variant",
        "instructions / request",
        "Δ vs base",
        "Δ %",
        "I1 MPKI",
        "D1 MPKI",
        "LL MPKI",
        "branch MPKI",
        *(("IPC",) if pmu else ()),
        "fixed / window",
        "warm-up",
    )
    rows = []
    for (mode, size), rs in _groups(m).items():
        base = next((r for r in rs if r.variant == BASE), None)
        bi = None if base is None else _m(base, m.source, "instructions")
        for r in rs:
            i = _m(r, m.source, "instructions")
            d = None if i is None or bi is None or r is base else i - bi
            ipc = None
            if pmu and i is not None and (c := _m(r, m.source, "cycles")):
                ipc = i / c
            rows.append(
                [
                    mode,
                    str(size),
                    r.variant,
                    _f(i),
                    _f(d, "{:+,.0f}"),
                    "—" if d is None or not bi else f"{100 * d / bi:+.1f}",
                    _mpki(r, m.source, "i1_misses"),
                    _mpki(r, m.source, "d1_misses"),
                    _mpki(r, m.source, "ll_misses"),
                    _mpki(r, m.source, "branch_misses"),
                    *((_f(ipc, "{:.2f}"),) if pmu else ()),
                    _f(metric(r.fixed, m.source, "instructions")),
                    _f(metric(r.warmup, m.source, "instructions")),
                ]
            )
    return Tab(
        "Instructions and misses per request",
        head,
        rows,
        [
            "MPKI: misses (branch: mispredictions) per 1000 instructions; fixed: per-window work "
            "(one connection); warm-up: the first window beyond steady and fixed work"
        ],
    )


def spread_table(m: Microarch) -> Tab | None:
    """How sure each row's counts are: half the range of its window pairs' estimates,
    relative to their median, for the metrics two runs are compared on."""
    names = [n for n in AGREEMENT_METRICS if n != "ll_misses"]
    rows = [
        [
            r.mode,
            str(r.size),
            r.variant,
            str(len(r.pairs)),
            " → ".join(f"{a} / {b}" for a, b in r.rounds)
            if len(r.rounds) > 1
            else f"{r.n1} / {r.n2}",
            *(_f(r.spread(m.source, n), "±{:.1%}") for n in names),
        ]
        for r in m.rows
        if len(r.pairs) > 1
    ]
    if not rows:
        return None
    head = ("mode", "size (B)", "variant", "pairs", "n1 / n2", *(LABELS[n] for n in names))
    notes = [
        "per request = the median of the pairs' (C(n2) − C(n1)) / (n2 − n1); the spread is "
        "half their range over that median; n1 / n2 → …: a row counted again with more "
        "requests (its pairs left a compared count beyond its bound), the last round's pairs"
    ]
    left = [
        f"{r.mode} {r.variant} ({', '.join(LABELS[u] for u in r.unresolved)})"
        for r in m.rows
        if r.unresolved
    ]
    if left:
        notes.append(
            "unresolved after the last round (two runs may differ beyond the bound): "
            + "; ".join(left)
        )
    return Tab("How sure: spread of the window pairs", head, rows, notes)


def parts_table(m: Microarch) -> Tab | None:
    rows = [
        [r.mode, str(r.size), r.variant]
        + [_f(metric(r.by_part.get(p, {}), m.source, "instructions")) for p in PARTS]
        for r in m.rows
        if r.by_part
    ]
    if not rows:
        return None
    head = ("mode", "size (B)", "variant", *(f"{p} instr / request" for p in PARTS))
    return Tab("Instructions per request by part (self cost per function)", head, rows)


PARTS = ("parsing", "filters", "other")


def topdown_table(m: Microarch) -> Tab | None:
    """Hardware counters with the top-down events: each category's share of a request's
    pipeline slots (None for valgrind, which simulates no pipeline)."""
    rows = []
    for r in m.rows:
        slots = _m(r, m.source, "slots")
        shares = [_m(r, m.source, k) for k in TOPDOWN]
        if slots and slots > 0 and all(v is not None for v in shares):
            rows.append(
                [r.mode, str(r.size), r.variant, *(f"{100 * (v or 0) / slots:.1f}" for v in shares)]
            )
    if not rows:
        return None
    head = ("mode", "size (B)", "variant", *(f"{k.replace('_', ' ')} %" for k in TOPDOWN))
    note = (
        "shares of the pipeline slots per request (perf's topdown-* events over slots); "
        f"published frontend-bound cycles: {PUBLISHED_MICROARCH['frontend-bound cycles']}"
    )
    return Tab("Top-down split of the pipeline slots per request", head, rows, [note])


def components_table(m: Microarch) -> Tab | None:
    """Instructions per request split as the profile's components are, by difference: Other =
    the TCP-mode base sidecar, Parsing = this mode's base − it (same size), each filter = its
    variant − base. Needs no symbols."""
    rows = []
    for (mode, size), rs in _groups(m).items():
        tcp = m.row("tcp", BASE, size)
        base = m.row(mode, BASE, size)
        other = None if tcp is None else _m(tcp, m.source, "instructions")
        mine = None if base is None else _m(base, m.source, "instructions")
        if other is None or mine is None:
            continue
        rows.append([mode, str(size), "Other", _f(other), f"{100 * other / mine:.0f}"])
        if mode != "tcp":
            parsing = mine - other
            rows.append([mode, str(size), "Parsing", _f(parsing), f"{100 * parsing / mine:.0f}"])
        for r in rs:
            i = _m(r, m.source, "instructions")
            if r.variant != BASE and not r.members and i is not None:
                rows.append(
                    [
                        mode,
                        str(size),
                        f"Filter({r.variant})",
                        _f(i - mine),
                        f"{100 * (i - mine) / mine:+.0f}",
                    ]
                )
    if not rows:
        return None
    head = ("mode", "size (B)", "component", "instructions / request", "% of the mode's base")
    note = "by difference: Other = TCP-mode base; Parsing = the mode's base − Other; filters − base"
    return Tab("Instructions per request by component", head, rows, [note])


@dataclass(frozen=True)
class Additivity:
    """A chain against base + Σ (member − base), on instructions per request."""

    mode: str
    size: int
    chain: str
    members: tuple[str, ...]
    base: float
    predicted: float
    measured: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1 if self.measured else float("inf")

    @property
    def increment_error(self) -> float:
        inc = self.measured - self.base
        return (self.predicted - self.measured) / inc if inc else float("inf")


def additivity(m: Microarch) -> list[Additivity]:
    out = []
    for (mode, size), rs in _groups(m).items():
        by = {r.variant: _m(r, m.source, "instructions") for r in rs}
        b = by.get(BASE)
        for r in rs:
            parts = [by.get(x) for x in r.members]
            got = by.get(r.variant)
            if not r.members or b is None or got is None or any(p is None for p in parts):
                continue
            pred = b + sum(p - b for p in parts if p is not None)
            out.append(Additivity(mode, size, r.variant, r.members, b, pred, got))
    return out


def additivity_table(m: Microarch) -> Tab | None:
    rows = [
        [
            a.mode,
            str(a.size),
            a.chain,
            " + ".join(a.members),
            _f(a.base),
            _f(a.predicted),
            _f(a.measured),
            f"{100 * a.error:+.2f}",
            f"{100 * a.increment_error:+.1f}",
        ]
        for a in additivity(m)
    ]
    if not rows:
        return None
    head = (
        "mode",
        "size (B)",
        "chain",
        "members",
        "base",
        "base + Σ Δ",
        "chain",
        "error on total %",
        "error on increment %",
    )
    return Tab("Filter additivity on instructions per request", head, rows)


def published_ratios(m: Microarch, mode: str = "http") -> list[tuple[str, str, float, float]]:
    """(published policy, our variant, our instruction ratio to base, the published ratio)
    at the smallest size counted in ``mode``."""
    sizes = sorted({r.size for r in m.rows if r.mode == mode})
    if not sizes:
        return []
    base = m.row(mode, BASE, sizes[0])
    bi = None if base is None else _m(base, m.source, "instructions")
    out = []
    for policy, ours in POLICIES.items():
        for v in ours:
            r = m.row(mode, v, sizes[0])
            i = None if r is None else _m(r, m.source, "instructions")
            if i is not None and bi:
                out.append((policy, v, i / bi, PUBLISHED_RATIOS[policy]["instructions"]))
    return out


def published_table(m: Microarch, mode: str = "http") -> Tab | None:
    rows = [
        [p, v, f"{here:.3f}", f"{pub:.3f}", f"{here / pub:.3f}"]
        for p, v, here, pub in published_ratios(m, mode)
    ]
    base = next((r for r in m.rows if r.mode == mode and r.variant == BASE), None)
    if base is not None and m.source == "valgrind":
        for kind, events in (
            ("conditional", ("cond_branches", "cond_misses")),
            ("indirect", ("indirect_branches", "indirect_misses")),
        ):
            here_n, here_m = (_m(base, m.source, x) for x in events)
            pub_n, pub_m = PUBLISHED_BRANCHES[kind]
            rows.append(["branches / request", f"base, {kind}", _f(here_n), _f(pub_n), "—"])
            rows.append(["mispredicted / request", f"base, {kind}", _f(here_m), _f(pub_m), "—"])
    if not rows:
        return None
    head = ("published", f"this machine ({mode})", "here", "published", "here / published")
    notes = [
        f"published: {SAHU}; instruction ratios are (sidecar with the policy) / (without it)",
        "published headline numbers: "
        + "; ".join(f"{k} {v}" for k, v in PUBLISHED_MICROARCH.items()),
    ]
    if m.source == "valgrind":
        notes.append(
            "branch counts and mispredictions here are valgrind's simulated predictors "
            "(conditional: 2-bit counters; indirect: a branch target buffer), not a real CPU's"
        )
    return Tab("This machine next to the published numbers", head, rows, notes)


def kernel_table(m: Microarch) -> Tab | None:
    rows = [
        [
            k.mode,
            str(k.size),
            f"{k.syscalls:.2f}",
            f"{k.reads:.2f}",
            f"{k.writes:.2f}",
            f"{k.epoll_waits:.2f}",
            f"{k.kernel_cpu_us:.1f}",
            f"{k.user_cpu_us:.1f}",
            _f(k.perf_kernel_cpu_us, "{:.1f}"),
            _f(k.perf_user_cpu_us, "{:.1f}"),
            str(k.requests),
        ]
        for k in m.kernel
    ]
    if not rows:
        return None
    head = (
        "mode",
        "size (B)",
        "syscalls",
        "reads",
        "writes",
        "epoll waits",
        "kernel CPU µs",
        "user CPU µs",
        "perf kernel µs",
        "perf user µs",
        "requests",
    )
    note = (
        "per request, the sidecar's worker threads in the base profile's meshed probe windows; "
        "perf: its CPU run at the highest rate (kernel symbols vs user space)"
    )
    return Tab("Kernel work per request (from the base profile)", head, rows, [note])


def microarch_tables(m: Microarch) -> list[Tab]:
    tabs = [counts_table(m)]
    more = (
        spread_table(m),
        topdown_table(m),
        components_table(m),
        parts_table(m),
        additivity_table(m),
        published_table(m),
    )
    for t in (*more, kernel_table(m)):
        if t is not None:
            tabs.append(t)
    return tabs


def header_lines(m: Microarch) -> list[str]:
    out = [f"counters: {m.source} — {m.tool}" + (f" ({m.created})" if m.created else "")]
    if m.geometry is not None:
        out.append(f"simulated caches: {m.geometry.describe()}")
    out.append(f"attribution: {m.attribution or 'none'}")
    out += [f"note: {n}" for n in m.notes]
    return out


def microarch_markdown(m: Microarch) -> str:
    out = ["## Microarchitecture", "", *(f"- {x}" for x in header_lines(m))]
    for t in microarch_tables(m):
        out += ["", f"### {t.title}", "", md_table(t.head, t.rows)]
        out += ["", *(f"_{n}_" for n in t.notes)] if t.notes else []
    return "\n".join(out) + "\n"


def microarch_text(m: Microarch) -> str:
    """Plain text: the header lines, then each table with aligned columns."""
    out = ["microarchitecture", *header_lines(m)]
    for t in microarch_tables(m):
        cols = list(zip(t.head, *t.rows))
        widths = [max(len(c) for c in col) for col in cols]

        def line(cells: Sequence[str], widths: list[int] = widths) -> str:
            first, *rest = cells
            parts = [first.ljust(widths[0])] + [c.rjust(w) for c, w in zip(rest, widths[1:])]
            return "  ".join(parts).rstrip()

        out += ["", t.title, line(t.head), *(line(r) for r in t.rows), *t.notes]
    return "\n".join(out) + "\n"


def microarch_html(m: Microarch) -> list[str]:
    """HTML blocks for a profile section."""
    blocks = ["<h3>Microarchitecture</h3>", *(H.para(x) for x in header_lines(m))]
    for t in microarch_tables(m):
        blocks += [f"<h4>{H.esc(t.title)}</h4>", H.table(list(t.head), t.rows)]
        blocks += [H.para(n) for n in t.notes]
    return blocks


def records(m: Microarch) -> list[dict[str, object]]:
    """One flat record per row: every metric per request (unrounded; empty when the source
    lacks it), and the fixed and warm-up instructions."""
    out: list[dict[str, object]] = []
    for r in m.rows:
        rec: dict[str, object] = {"mode": r.mode, "size": r.size, "variant": r.variant}
        for name in METRICS:
            v = metric(r.per_request, m.source, name)
            rec[name] = "" if v is None else v
        for what, ev in (("fixed", r.fixed), ("warmup", r.warmup)):
            v = metric(ev, m.source, "instructions")
            rec[f"{what}_instructions"] = "" if v is None else v
        rec["pairs"] = len(r.pairs)
        for name in AGREEMENT_METRICS:
            sp = r.spread(m.source, name)
            rec[f"{name}_spread"] = "" if sp is None else sp
        out.append(rec)
    return out


def microarch_document(m: Microarch, fmt: str) -> str:
    """``profiles show --microarch`` in ``fmt``: table (text), json, csv (the counts table),
    markdown or html (one page)."""
    if fmt == "json":
        return json.dumps(m.to_dict(), indent=2) + "\n"
    if fmt == "markdown":
        return microarch_markdown(m)
    if fmt == "csv":
        recs = records(m)
        buf = io.StringIO()
        w = csv.DictWriter(buf, list(recs[0]) if recs else ["mode"], lineterminator="\n")
        w.writeheader()
        w.writerows(recs)
        return buf.getvalue()
    if fmt == "html":
        sec = H.Section("microarch", "Microarchitecture", microarch_html(m)[1:])
        return H.page("meshtax microarchitecture", m.tool, [sec], m.created or "")
    return microarch_text(m)


@dataclass(frozen=True)
class Agreement:
    """One item of two runs: ``a`` and ``b`` per request, their relative difference (None:
    below :data:`MIN_COUNT`, not compared) and whether it is within the metric's bound;
    ``spread``: the larger of the two rows' own spreads (:meth:`CounterRow.spread`; None
    where a row has one pair)."""

    mode: str
    variant: str
    size: int
    metric: str
    a: float
    b: float
    rel: float | None
    bound: float
    spread: float | None = None

    @property
    def ok(self) -> bool:
        return self.rel is None or abs(self.rel) <= self.bound


def agreement(a: Microarch, b: Microarch) -> list[Agreement]:
    """Every (mode, variant, size) both profiles counted, every metric of
    :data:`AGREEMENT_METRICS` both have: ``b / a − 1``."""
    out = []
    for ra in a.rows:
        rb = b.row(*ra.key)
        if rb is None:
            continue
        for name, bound in AGREEMENT_METRICS.items():
            xa, xb = _m(ra, a.source, name), _m(rb, b.source, name)
            if xa is None or xb is None:
                continue
            rel = None if max(xa, xb) < MIN_COUNT or xa <= 0 else xb / xa - 1
            sa, sb = ra.spread(a.source, name), rb.spread(b.source, name)
            sp = None if sa is None or sb is None else max(sa, sb)
            out.append(Agreement(ra.mode, ra.variant, ra.size, name, xa, xb, rel, bound, sp))
    return out
