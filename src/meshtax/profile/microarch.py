"""The microarchitectural profile: instructions, cache misses and branch mispredictions per
request of the proxy, per mode, variant (base, each filter, each chain) and size.

One Envoy per mode serves every variant (:func:`~meshtax.profile.loopback.variant_envoy`),
started the way the counter source needs (:mod:`meshtax.testbed.counters`: under callgrind with
the cache and branch simulators, or plainly for ``perf stat``) and with its wall-clock timers
quiet (:data:`~meshtax.testbed.envoy.variants.QUIET_TIMERS`). Each variant is counted in
windows of one connection each: a warm-up of ``warmup_n`` requests, a few settling
connections, then pairs of ``n1`` and ``n2`` requests. Per request = ``(C(n2) − C(n1)) /
(n2 − n1)``, the median over the pairs, whose spread the row keeps: the per-window work (the
connection's set-up and close) cancels and is reported apart (``fixed``), and so is what the
first window cost beyond that (``warmup``: lazy initialisation, cold caches). Every ``n2``
window simulates about the same number of instructions (:meth:`MicroarchOptions.windows`):
cheap variants get more requests, so that a few misses per request are still resolved;
costly ones (RBAC with 10 000 rules) fewer.

Counts are the proxy's user space, of the threads that serve requests
(:func:`serving_threads`; the others are the row's ``background``). Where the proxy's symbols
are known (a binary with symbols, or a symbol map), each function's self cost is attributed to
parsing, filters or other (:func:`classify`); else the rows stay whole-process and say so.
Kernel work per request is not re-measured: it comes from the base profile's probe windows
(:func:`kernel_rows`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshtax.model.microarch import CacheGeometry, CounterRow, KernelRow, Microarch, metric
from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends
from meshtax.profile.filters import ModeRun
from meshtax.profile.loopback import VariantEnvoy, variant_envoy
from meshtax.testbed.callgrind import SymbolMap, load_base
from meshtax.testbed.counters import CounterSource, Counts, WindowCounter
from meshtax.testbed.envoy.filters import (
    COMBINATIONS,
    SAHU_MIXES,
    modes_for,
    parse_component,
)
from meshtax.testbed.envoy.variants import BASE, QUIET_TIMERS, filter_variants
from meshtax.testbed.pinning import available_cpus
from meshtax.testbed.pods import Testbed

__all__ = [
    "DEFAULT_FILTERS",
    "PARTS",
    "Attribution",
    "MicroarchOptions",
    "ModeCounts",
    "classify",
    "combos_for",
    "count_mode",
    "fill_instructions",
    "pinned",
    "kernel_rows",
    "measure_microarch",
]

#: what ``--microarch`` counts without ``--filters``: the members of the paper's five
#: combinations and Sahu's two HTTP mixes, IP tagging 1/5/10 and RBAC 100/10 000
DEFAULT_FILTERS: tuple[str, ...] = (
    *dict.fromkeys(c for v in (*COMBINATIONS.values(), *SAHU_MIXES.values()) for c in v),
    "ip_tagging_5",
    "ip_tagging_10",
    "rbac_http_100",
    "rbac_http_10000",
    "rbac_network_100",
    "rbac_network_10000",
)
PARTS = ("parsing", "filters", "other")
#: attribution is kept when names cover at least this share of the instructions
NAMED_ENOUGH = 0.5
_PARSING = re.compile(
    r"Http1::|Http2::|http_parser|llhttp|nghttp2|http2::adapter|oghttp2|Balsa|"
    r"HeaderMapImpl|HeaderString|Grpc::Common|Grpc::Codec"
)
# the HTTP connection manager, the router and tcp_proxy are the base sidecar: "other"
_FILTERS = re.compile(
    r"Extensions::Filters::Http::(?!Router)|Extensions::Filters::Common::(RBAC|Lua)|"
    r"Extensions::Filters::Network::(Rbac|RBAC|LocalRateLimit)|Extensions::Common::(Wasm|Tap)|"
    r"Extensions::AccessLoggers|proxy_wasm|v8::|\blua_|\bluaL_|\blj_"
)


@dataclass(frozen=True)
class MicroarchOptions:
    """Sizes counted, the windows (requests) and the instruction budget of the ``n2`` window:
    ``n2`` is the number of requests a variant is estimated (from its warm-up) to spend the
    budget on, two significant digits, within ``min_n2``…``max_n2``; where that is below
    ``n2``, ``n1`` is scaled alike (at least ``min_n1``). After the warm-up window,
    ``settle`` more connections of ``settle_n`` requests each go uncounted; then ``pairs``
    window pairs (n1 then n2, n2 then n1, …), whose median is the count per request.
    ``pin``: Envoy alone on CPU 1, the load client and the echo app on CPU 0 (where the
    machine lets this process use both): the native client and app, ~100 times faster than
    Envoy under valgrind, mostly have their whole message written before Envoy reads. gRPC
    counts still follow a busy CPU a little (a 25 % CPU quota: +0.4 % pinned, +0.6–0.9 %
    unpinned, 2026-11-26; an unpinned run capped among other processes: up to +3 %)."""

    sizes: tuple[int, ...] = (100,)
    warmup_n: int = 100
    n1: int = 100
    n2: int = 500
    min_n1: int = 10
    min_n2: int = 40
    max_n2: int = 10_000
    budget: float = 1.5e8
    pairs: int = 3
    settle: int = 4
    settle_n: int = 10
    connections: int = 1
    pin: bool = True

    @classmethod
    def quick(cls) -> MicroarchOptions:
        return cls(warmup_n=50, n1=50, n2=250, max_n2=5_000, budget=6e7)

    def windows(self, per_request: float | None) -> tuple[int, int]:
        """(n1, n2) for a variant of about ``per_request`` instructions per request."""
        if not per_request:
            return self.n1, self.n2
        per_window = self.budget / per_request / self.connections
        n2 = min(self.max_n2, max(self.min_n2, _two_digits(per_window)))
        if n2 >= self.n2:
            return self.n1, n2
        n1 = max(self.min_n1, min(round(self.n1 * n2 / self.n2), n2 // 2))
        return n1, n2

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def _two_digits(x: float) -> int:
    """``x`` rounded to two significant digits: runs whose estimates differ a little count
    the same windows."""
    k = 1
    while x >= 100 * k:
        k *= 10
    return round(x / k) * k


def combos_for(mode: Mode, components: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The paper's five combinations and Sahu's two HTTP mixes whose members are all counted."""
    have = set(components)
    return {
        k: v
        for k, v in {**COMBINATIONS, **SAHU_MIXES}.items()
        if set(v) <= have and all(mode in modes_for(parse_component(c)[0]) for c in v)
    }


# --- attribution ---------------------------------------------------------------------------


def classify(function: str) -> str:
    """``parsing``, ``filters`` or ``other`` for a (demangled) function name."""
    if _FILTERS.search(function):
        return "filters"
    if _PARSING.search(function):
        return "parsing"
    return "other"


@dataclass(frozen=True)
class Attribution:
    """How function costs are named: the proxy binary's path as callgrind reports its object,
    the run-time address it is loaded at, and a symbol map of it (for a stripped binary)."""

    binary: str
    base: int | None = None
    symbols: SymbolMap | None = None

    def name(self, ob: str, fn: str) -> str | None:
        """The function's name; None for an address in the proxy that nothing names."""
        if not fn.startswith("0x"):
            return fn
        if ob != self.binary or self.symbols is None or self.base is None:
            return None if ob == self.binary else fn
        return self.symbols.name(int(fn, 16) - self.base)

    def split(
        self, functions: Mapping[tuple[str, str], Mapping[str, float]], event: str = "Ir"
    ) -> tuple[dict[str, dict[str, float]], float]:
        """Events per part, and the share of ``event`` that had a name (the rest is "other")."""
        parts: dict[str, dict[str, float]] = {p: {} for p in PARTS}
        named = total = 0.0
        for (ob, fn), cost in functions.items():
            name = self.name(ob, fn)
            part = "other" if name is None else classify(name)
            total += cost.get(event, 0.0)
            named += cost.get(event, 0.0) if name is not None else 0.0
            acc = parts[part]
            for e, v in cost.items():
                acc[e] = acc.get(e, 0.0) + v
        return parts, (named / total if total else 0.0)


# --- counting ------------------------------------------------------------------------------


def _sub(a: Mapping[str, float], b: Mapping[str, float], k: float = 1.0) -> dict[str, float]:
    return {e: a.get(e, 0.0) - k * b.get(e, 0.0) for e in {*a, *b}}


def _per_request(c1: Mapping[str, float], c2: Mapping[str, float], dn: int) -> dict[str, float]:
    return {e: v / dn for e, v in _sub(c2, c1).items()}


def _median(xs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Event by event, the median of ``xs`` (an event a window lacks counts 0)."""
    events = {e for x in xs for e in x}
    return {e: float(statistics.median(x.get(e, 0.0) for x in xs)) for e in events}


#: a thread serves requests when its instructions grow from the n1 to the n2 windows by at
#: least this share of the whole process's growth (in Envoy: the workers, ~99.9 %); the others
#: (main thread, watchdogs, gRPC timers: < 0.1 %) follow the windows' wall time
SERVING_SHARE = 0.01


def serving_threads(pairs: Sequence[tuple[Counts, Counts]], source: str) -> frozenset[int]:
    """The threads whose work grows with requests over the (n1, n2) window ``pairs``; every
    thread when the source counts no instructions."""
    grow: dict[int, float] = {}
    for c1, c2 in pairs:
        for t in {*c1.threads, *c2.threads}:
            x1 = metric(c1.threads.get(t, {}), source, "instructions") or 0.0
            x2 = metric(c2.threads.get(t, {}), source, "instructions") or 0.0
            grow[t] = grow.get(t, 0.0) + x2 - x1
    total = sum(grow.values())
    if total <= 0:
        return frozenset(grow)
    return frozenset(t for t, g in grow.items() if g >= SERVING_SHARE * total)


@dataclass
class ModeCounts:
    """Rows of one mode; ``named_share``: the lowest share of instructions attribution could
    name in any window (None: not attempted); ``geometry`` as the source reported it."""

    mode: Mode
    rows: list[CounterRow] = field(default_factory=list)
    named_share: float | None = None
    geometry: CacheGeometry | None = None


def count_windows(
    ve: VariantEnvoy,
    counter: WindowCounter,
    source: str,
    name: str,
    size: int,
    opts: MicroarchOptions,
) -> tuple[Counts, tuple[int, int], list[tuple[Counts, Counts]]]:
    """Variant ``name``'s warm-up window, (n1, n2) and its window pairs, in the order of
    :class:`MicroarchOptions` (of the settling connections, only the last is read: for the
    estimate that sizes the windows)."""
    target = ve.target(name)
    counter.zero()
    ve.load(target, ve.mode, size, opts.warmup_n)
    w = counter.read()
    # the first few connections of a variant still miss more (in TCP mode, +500 D1 misses
    # on the first after the warm-up, ~0 by the fifth)
    for _ in range(opts.settle - 1):
        ve.load(target, ve.mode, size, opts.settle_n)
    last = None
    if opts.settle > 0:
        counter.zero()
        ve.load(target, ve.mode, size, opts.settle_n)
        last = counter.read()
    n1, n2 = opts.windows(_est(w, last, source, opts))
    counter.zero()
    pairs = []
    for i in range(opts.pairs):
        got: dict[int, Counts] = {}
        for n in (n1, n2) if i % 2 == 0 else (n2, n1):
            for _ in range(opts.connections):
                ve.load(target, ve.mode, size, n)
            got[n] = counter.read()
        pairs.append((got[n1], got[n2]))
    return w, (n1, n2), pairs


def count_variant(
    ve: VariantEnvoy,
    counter: WindowCounter,
    source: str,
    name: str,
    size: int,
    opts: MicroarchOptions,
    *,
    members: tuple[str, ...] = (),
    attribution: Attribution | None = None,
) -> tuple[CounterRow, float | None]:
    """Variant ``name``'s windows → its row (and the share of instructions attribution
    named). Each pair gives ``(C(n2) − C(n1)) / (n2 − n1)`` of the threads that serve
    requests (:func:`serving_threads`); the row's counts are the pairs' median."""
    w, (n1, n2), pairs = count_windows(ve, counter, source, name, size, opts)
    dn = (n2 - n1) * opts.connections
    serving = serving_threads(pairs, source)
    rest = {t for c1, c2 in pairs for t in (*c1.threads, *c2.threads)} - serving
    est = [_per_request(c1.events(serving), c2.events(serving), dn) for c1, c2 in pairs]
    per = _median(est)
    fixed = _median(
        [
            {
                k: v / opts.connections
                for k, v in _sub(c1.events(serving), e, n1 * opts.connections).items()
            }
            for (c1, _c2), e in zip(pairs, est)
        ]
    )
    warm = _sub(_sub(w.events(serving), per, opts.warmup_n), fixed)
    by_part: dict[str, dict[str, float]] = {}
    share = None
    if attribution is not None and all(c.functions for pair in pairs for c in pair):
        split = [
            (attribution.split(c1.costs(serving)), attribution.split(c2.costs(serving)))
            for c1, c2 in pairs
        ]
        share = min(s for pair in split for _parts, s in pair)
        by_part = {
            p: _median([_per_request(a[0][p], b[0][p], dn) for a, b in split]) for p in PARTS
        }
    background = _median([_per_request(c1.events(rest), c2.events(rest), dn) for c1, c2 in pairs])
    row = CounterRow(
        ve.mode.value,
        name,
        size,
        n1,
        n2,
        opts.warmup_n,
        per,
        fixed,
        warm,
        members,
        by_part,
        background if rest else {},
        tuple(est),
    )
    return row, share


def _est(w: Counts, s: Counts | None, source: str, opts: MicroarchOptions) -> float | None:
    """Instructions per request from the warm-up window and the last settling one (their
    difference: a connection's own cost cancels), else from the warm-up alone."""
    iw = metric(w.events(), source, "instructions")
    if iw is None or opts.warmup_n <= 0:
        return None
    i_s = None if s is None else metric(s.events(), source, "instructions")
    if i_s is not None and opts.warmup_n > opts.settle_n and iw > i_s:
        return (iw - i_s) / (opts.warmup_n - opts.settle_n)
    return iw / opts.warmup_n


def pinned(opts: MicroarchOptions, cpus: Sequence[int] | None = None) -> bool:
    """Whether the counting pins (``opts.pin`` and CPUs 0 and 1 both usable: ``cpus``,
    default this process's affinity)."""
    return opts.pin and {0, 1} <= set(available_cpus() if cpus is None else cpus)


def count_mode(
    tb: Testbed,
    be: Backends,
    mode: Mode,
    components: Sequence[str],
    source: CounterSource,
    opts: MicroarchOptions,
    *,
    combos: Mapping[str, Sequence[str]] | None = None,
    attribution: Callable[[int], Attribution | None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> ModeCounts:
    """Every variant of ``mode`` (base, ``components``, ``combos``) at every size, counted by
    ``source`` in one Envoy. ``attribution``: given Envoy's PID, how to name its functions
    (None: whole-process rows)."""
    combos = dict(combos or {})
    say = progress or (lambda _m: None)

    def build(ports: Sequence[int], echo: tuple[str, int], out: Path) -> list[Any]:
        return filter_variants(mode, components, ports, echo, combos=combos, outdir=out)

    names = [BASE, *components, *combos]
    out = ModeCounts(mode)
    spec = source.callgrind or False
    pin = pinned(opts)
    where = ", Envoy alone on CPU 1" if pin else ""
    say(f"{mode.value}: starting Envoy ({source.name} counters, {len(names)} variants{where})")
    label = f"microarch-{mode.value}"
    with variant_envoy(
        tb,
        be,
        mode,
        build,
        len(names),
        label=label,
        callgrind=spec,
        bootstrap=QUIET_TIMERS,
        pin=pin,
        alone=True,
    ) as ve:
        counter = source.open(ve.env, tb.registered, tb.scratch_dir(f"meshtax-{label}-counts-"))
        attr = attribution(ve.env.pid) if attribution is not None else None
        try:
            for size in opts.sizes:
                for v in names:
                    say(f"{mode.value} {size} B: counting {v}")
                    row, share = count_variant(
                        ve,
                        counter,
                        source.name,
                        v,
                        size,
                        opts,
                        members=tuple(combos.get(v, ())),
                        attribution=attr,
                    )
                    out.rows.append(row)
                    if share is not None:
                        out.named_share = min(share, out.named_share or 1.0)
        finally:
            counter.close()
        out.geometry = getattr(counter, "geometry", None)
    return out


# --- kernel work, from the base profile ----------------------------------------------------


def kernel_rows(measurements: Mapping[str, Any]) -> list[KernelRow]:
    """Per mode and size, the sidecar's syscalls and CPU per request, pooled over the meshed
    probe windows of a profile's ``options.measurements`` (its worker threads: those that read
    or wrote), and the kernel/user split of its perf run at the highest rate (per crossing in
    the record, so doubled); empty when the profile has no such record."""
    rows = []
    for mode, records in measurements.items():
        for r in records or ():
            ws = [w for w in r.get("probe", {}).get("windows", ()) if w.get("meshed")]
            n = sum(int(w.get("requests", 0)) for w in ws)
            if not ws or n <= 0:
                continue

            def tot(key: str, ws: list[dict[str, Any]] = ws) -> float:
                return float(sum(w.get("sidecar", {}).get(key, 0) for w in ws))

            cpu = max(r.get("cpu") or [{}], key=lambda c: (c.get("run") == "max", c.get("rate", 0)))
            bd = cpu.get("breakdown_us")
            rows.append(
                KernelRow(
                    str(mode),
                    int(r["size"]),
                    n,
                    tot("syscalls") / n,
                    tot("read_n") / n,
                    tot("write_n") / n,
                    tot("epoll_n") / n,
                    tot("sys_cpu_ns") / n / 1e3,
                    tot("user_ns") / n / 1e3,
                    None if bd is None else 2 * sum(v for k, v in bd.items() if k != "user"),
                    None if bd is None else 2 * bd.get("user", 0.0),
                    str(cpu.get("run", "")),
                )
            )
    return rows


# --- one microarchitectural profile ----------------------------------------------------------


def attribution_for(binary: Path, symbols: SymbolMap | None) -> Callable[[int], Attribution]:
    """Given Envoy's PID: its functions named from the binary's own symbols (callgrind reads
    them) or, for a stripped binary, from ``symbols`` at the address it is loaded at."""
    real = os.path.realpath(binary)

    def make(pid: int) -> Attribution:
        return Attribution(real, load_base(pid, real) if symbols is not None else None, symbols)

    return make


def measure_microarch(
    tb: Testbed,
    be: Backends,
    components: Mapping[Mode, Sequence[str]],
    source: CounterSource,
    opts: MicroarchOptions,
    *,
    binary: Path,
    symbols: SymbolMap | None = None,
    measurements: Mapping[str, Any] | None = None,
    created: str = "",
    progress: Callable[[str], None] | None = None,
) -> Microarch:
    """Every mode of ``components`` (its filters; the combinations of them are added), plus the
    kernel work per request of the base profile's ``measurements``."""
    attr = attribution_for(binary, symbols) if source.name == "valgrind" else None
    counted = [
        count_mode(
            tb,
            be,
            mode,
            comps,
            source,
            opts,
            combos=combos_for(mode, comps),
            attribution=attr,
            progress=progress,
        )
        for mode, comps in components.items()
    ]
    shares = [m.named_share for m in counted if m.named_share is not None]
    named = bool(shares) and min(shares) >= NAMED_ENOUGH
    how = (
        "by function (self cost) into parsing/filters/other"
        + (" with the given symbol map" if symbols is not None else "")
        if named
        else "none: whole-process numbers (the proxy binary has no symbols; "
        "give a symbol map, `nm -C --defined-only envoy`, to split parsing/filters/other)"
    )
    rows = [r if named else dataclasses.replace(r, by_part={}) for m in counted for r in m.rows]
    geometry = next((m.geometry for m in counted if m.geometry is not None), None)
    whose = (
        "the threads that serve requests (the others, whose work follows wall time, are "
        "the rows' background)"
        if source.name == "valgrind"
        else "every thread"
    )
    notes = [
        f"user space of the proxy, {whose}, per request: (C(n2) − C(n1)) / (n2 − n1), the "
        f"median of {opts.pairs} window pairs (spread: half their range); fixed = per-window "
        "work (one connection each); warmup = the first window beyond steady and fixed work",
        "Envoy counted without its periodic stats flush and with its watchdogs at 60 s "
        "(wall-clock work that evicts the workers' lines from valgrind's one shared cache)",
        "Envoy alone on CPU 1, the load client and the echo app on CPU 0"
        if pinned(opts)
        else "unpinned: client, echo app and Envoy wherever the scheduler put them",
        "kernel work per request from the base profile's probe windows (not re-measured)",
    ]
    if shares and not named:
        notes.append(f"attribution named only {100 * min(shares):.0f} % of instructions")
    return Microarch(
        source=source.name,
        tool=source.tool(tb.system),
        rows=tuple(rows),
        geometry=geometry,
        attribution=how,
        kernel=tuple(kernel_rows(measurements or {})),
        created=created,
        notes=tuple(notes),
    )


def fill_instructions(run: ModeRun, counted: Microarch) -> None:
    """A filter profile's instructions per request from a microarch run of the same mode,
    variants and sizes (one callgrind pass serves both); variants it lacks stay None."""
    for size, by in run.samples.items():
        for name, s in by.items():
            row = counted.row(run.mode.value, name, size)
            if row is not None:
                s.instructions = metric(row.per_request, counted.source, "instructions")
