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
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshtax.model.microarch import (
    AGREEMENT_BOUNDS,
    CacheGeometry,
    CounterRow,
    Microarch,
    metric,
)
from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends
from meshtax.profile.filters import ModeRun
from meshtax.profile.loopback import VariantEnvoy, variant_envoy
from meshtax.profile.microarch_attr import (
    NAMED_ENOUGH,
    PARTS,
    Attribution,
    attribution_for,
    classify,
)
from meshtax.profile.microarch_kernel import kernel_rows
from meshtax.testbed.callgrind import SymbolMap
from meshtax.testbed.counters import CounterSource, Counts, WindowCounter
from meshtax.testbed.envoy.filters import (
    COMBINATIONS,
    SAHU_MIXES,
    modes_for,
    parse_component,
)
from meshtax.testbed.envoy.variants import BASE, QUIET_ARGS, QUIET_TIMERS, filter_variants
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
    unpinned, 2026-11-26; an unpinned run capped among other processes: up to +3 %).
    ``resolve_s``: seconds a row may spend on counting rounds beyond the first, where its
    pairs leave a compared count unresolved (:func:`next_n2`: ``n2 − n1`` grown
    ``resolve_min``…``resolve_max``× a round; 0: never)."""

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
    resolve_s: float = 300.0
    resolve_min: float = 2.0
    resolve_max: float = 32.0

    @classmethod
    def quick(cls) -> MicroarchOptions:
        return cls(warmup_n=50, n1=50, n2=250, max_n2=5_000, budget=6e7, resolve_s=200.0)

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


def count_pairs(
    ve: VariantEnvoy,
    counter: WindowCounter,
    target: Any,
    size: int,
    n1: int,
    n2: int,
    opts: MicroarchOptions,
) -> list[tuple[Counts, Counts]]:
    """``opts.pairs`` window pairs of ``n1`` and ``n2`` requests (n1 then n2, n2 then n1, …),
    each window read from the end of the one before."""
    counter.zero()
    pairs = []
    for i in range(opts.pairs):
        got: dict[int, Counts] = {}
        for n in (n1, n2) if i % 2 == 0 else (n2, n1):
            for _ in range(opts.connections):
                ve.load(target, ve.mode, size, n)
            got[n] = counter.read()
        pairs.append((got[n1], got[n2]))
    return pairs


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
    return w, (n1, n2), count_pairs(ve, counter, target, size, n1, n2, opts)


def next_n2(
    row: CounterRow, source: str, seconds: float, left: float, opts: MicroarchOptions
) -> int | None:
    """The ``n2`` of the next counting round of a row whose pairs left ``row.unresolved_by_pairs``
    unresolved, ``n1`` kept: the difference ``n2 − n1`` grown by the worst such metric's
    spread over its bound (a burst of misses that lands in one window or the other moves a
    pair by its size over ``n2 − n1``), at least ``resolve_min``× and at most
    ``resolve_max``×, then cut to what the ``left`` seconds of the row's budget pay for at
    the last round's pace (``seconds`` for its pairs); None when that is below
    ``resolve_min``× (the row stays unresolved)."""
    dn = row.n2 - row.n1
    grow = opts.resolve_min
    for name in row.unresolved_by_pairs(source):
        sp = row.spread(source, name)
        grow = max(grow, min(opts.resolve_max, (sp or 0.0) / AGREEMENT_BOUNDS[name]))
    per_request = max(seconds, 1e-9) / (opts.pairs * opts.connections * (row.n1 + row.n2))
    afford = left / per_request / (opts.pairs * opts.connections) - 2 * row.n1
    dn_new = min(_two_digits(grow * dn), int(afford))
    return None if dn_new < opts.resolve_min * dn else row.n1 + dn_new


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
    clock: Callable[[], float] | None = None,
) -> tuple[CounterRow, float | None]:
    """Variant ``name``'s windows → its row (and the share of instructions attribution
    named). Each pair gives ``(C(n2) − C(n1)) / (n2 − n1)`` of the threads that serve
    requests (:func:`serving_threads`); the row's counts are the pairs' median. Where the
    pairs leave a compared count unresolved (:meth:`CounterRow.unresolved_by_pairs`), the
    row is counted again in rounds of larger ``n2`` (:func:`next_n2`) within
    ``opts.resolve_s`` seconds (``clock``); the row is the last round's, its ``rounds`` every
    round's windows, its ``earlier`` the pairs of the rounds before the last, its
    ``unresolved`` what the last left."""
    clock = clock or time.monotonic
    t0 = clock()
    w, (n1, n2), pairs = count_windows(ve, counter, source, name, size, opts)
    seconds = clock() - t0  # the warm-up's and settling windows' too: a pace on the safe side
    row, share = _row(ve.mode, name, size, opts, w, n1, n2, pairs, source, members, attribution)
    # a compared count the pairs do not resolve: count the row again with more requests
    rounds, spent, earlier = [(n1, n2)], 0.0, []
    while row.unresolved_by_pairs(source):
        n2_new = next_n2(row, source, seconds, opts.resolve_s - spent, opts)
        if n2_new is None:
            break
        earlier.append(tuple(row.pairs))
        t0 = clock()
        pairs = count_pairs(ve, counter, ve.target(name), size, n1, n2_new, opts)
        seconds = clock() - t0
        spent += seconds
        rounds.append((n1, n2_new))
        row, share = _row(
            ve.mode, name, size, opts, w, n1, n2_new, pairs, source, members, attribution
        )
    return (
        dataclasses.replace(
            row,
            rounds=tuple(rounds),
            unresolved=tuple(row.unresolved_by_pairs(source)),
            earlier=tuple(earlier),
        ),
        share,
    )


def _row(
    mode: Mode,
    name: str,
    size: int,
    opts: MicroarchOptions,
    w: Counts,
    n1: int,
    n2: int,
    pairs: list[tuple[Counts, Counts]],
    source: str,
    members: tuple[str, ...],
    attribution: Attribution | None,
) -> tuple[CounterRow, float | None]:
    """A row from its warm-up window and (n1, n2) window pairs."""
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
        mode.value,
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
    clock: Callable[[], float] | None = None,
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
        args=QUIET_ARGS,
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
                        clock=clock,
                    )
                    if len(row.rounds) > 1 or row.unresolved:
                        how = ", ".join(f"{a}/{b}" for a, b in row.rounds)
                        left = (
                            f", unresolved: {', '.join(row.unresolved)}" if row.unresolved else ""
                        )
                        say(f"{mode.value} {size} B: {v} counted again ({how}){left}")
                    out.rows.append(row)
                    if share is not None:
                        out.named_share = min(share, out.named_share or 1.0)
        finally:
            counter.close()
        out.geometry = getattr(counter, "geometry", None)
    return out


# --- one microarchitectural profile ----------------------------------------------------------


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
        "Envoy counted without its periodic stats flush, with its watchdogs at 60 s and its "
        "access-log flush timer at 1 h (wall-clock work: under valgrind the clock runs ~50× "
        "as fast against the requests; access logs flush by size, as at native speed)",
        "a row whose pairs leave a compared count unresolved (a pair at >= 1 per request, "
        "the pairs' spread above the count's bound) is counted again with more requests, "
        f"within {opts.resolve_s:.0f} s; its rounds and what stayed unresolved are kept",
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
