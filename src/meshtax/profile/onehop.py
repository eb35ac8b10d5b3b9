"""One-hop measurements on the :class:`~meshtax.testbed.bed.EchoBed`: the paired overhead
(meshed − direct), paired probe windows (the components, pooled by
:func:`~meshtax.profile.probed.pool`), and CPU runs under perf.

Each is a use of the one paired-run loop (:func:`~meshtax.testbed.paired.paired_runs`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from meshtax.model.capacity import LatencySketch
from meshtax.model.sidecar import Mode
from meshtax.model.stats import Estimate, estimate
from meshtax.profile.backends import CpuSampler, _real_perf, _real_probe
from meshtax.profile.capacity import latency_sketch
from meshtax.profile.decompose import Breakdown, Window, cpu_breakdown
from meshtax.profile.probed import (
    _BD_FIELDS,
    ProbedPairs,
    ProbeWindow,
    pair_breakdown,
    window_record,
)
from meshtax.testbed import procfs
from meshtax.testbed.bed import OneHop
from meshtax.testbed.fortio import LoadResult
from meshtax.testbed.interference import (
    Interference,
    MeterFactory,
    Thresholds,
    host_stalls,
)
from meshtax.testbed.paired import (
    GroupRun,
    Paired,
    PairPolicy,
    group_order,
    is_narrow,
    paired_runs,
)
from meshtax.testbed.probe_reading import EMPTY_THREAD
from meshtax.testbed.probes import (
    ProbeReading,
    ProbeSession,
    SnapshotSession,
    realtime,
)
from meshtax.testbed.system import System

__all__ = [
    "PairedOverhead",
    "measure_overhead",
    "probe_pairs",
    "WindowPolicy",
    "components_narrow",
    "sidecar_cpu",
]


@dataclass
class PairedOverhead:
    """Per-request overhead (meshed − direct mean latency, µs) from alternating paired runs."""

    estimate: Estimate
    meshed_mean: list[float] = field(default_factory=list)
    direct_mean: list[float] = field(default_factory=list)
    meshed_p50: list[float] = field(default_factory=list)
    direct_p50: list[float] = field(default_factory=list)
    sketch: LatencySketch | None = None  # latency quantiles of the pooled runs, each side

    def to_dict(self) -> dict[str, Any]:
        return {
            "overhead_per_request_us": self.estimate.to_dict(),
            "meshed_mean_us": self.meshed_mean,
            "direct_mean_us": self.direct_mean,
            "meshed_p50_us": self.meshed_p50,
            "direct_p50_us": self.direct_p50,
            **({} if self.sketch is None else {"latency_sketch": self.sketch.to_dict()}),
        }


def measure_overhead(
    bed: OneHop,
    mode: Mode,
    size: int,
    *,
    run_s: float,
    rel_halfwidth: float = 0.1,
    min_runs: int = 3,
    max_runs: int = 6,
    budget_s: float | None = None,
    meshed: str | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> PairedOverhead:
    """Paired closed-loop runs with and without the sidecar (:func:`paired_runs`, order
    alternating) until the median difference is narrow. Means, not p50s: components are
    means too, and fortio's p50 is bucket-interpolated."""
    targets = {"meshed": meshed or bed.meshed_target, "direct": bed.direct_target(mode)}

    def diffs(p: Paired[LoadResult]) -> list[float]:
        return [m.avg_us - d.avg_us for d, m in p.pairs("direct", "meshed")]

    paired = paired_runs(
        [("direct", "meshed")],
        lambda name: bed.load(targets[name], mode, size, duration_s=run_s),
        PairPolicy(min_runs, max_runs, budget_s),
        narrow=lambda p: is_narrow(diffs(p), rel_halfwidth),
        clock=clock,
    )
    pairs = paired.pairs("direct", "meshed")
    return PairedOverhead(
        estimate(diffs(paired), stop=paired.stop),
        meshed_mean=[m.avg_us for _, m in pairs],
        direct_mean=[d.avg_us for d, _ in pairs],
        meshed_p50=[m.p50_us for _, m in pairs],
        direct_p50=[d.p50_us for d, _ in pairs],
        sketch=latency_sketch(size, [m for _, m in pairs], [d for d, _ in pairs]),
    )


@dataclass(frozen=True)
class WindowPolicy:
    """How probe windows are taken: ``run_s`` each, meshed and direct in pairs; at least
    ``min_pairs``, at most ``max_pairs``, stopping earlier once every component of at least
    ``floor_us`` per crossing has a per-pair 95 % interval within ``rel_halfwidth`` of its
    median (never narrower than ``min_halfwidth_us`` is asked for), or before ``budget_s``
    would be overrun. A pair with a window others contaminated (:class:`Thresholds`) is taken
    again, up to ``max_rejects`` times."""

    run_s: float
    min_pairs: int
    max_pairs: int
    budget_s: float | None = None
    rel_halfwidth: float = 0.15
    floor_us: float = 5.0
    thresholds: Thresholds = Thresholds()
    max_rejects: int = 4
    min_halfwidth_us: float = 1.0

    @classmethod
    def fixed(cls, run_s: float, pairs: int) -> WindowPolicy:
        return cls(run_s, pairs, pairs)

    def share(self, k: int) -> WindowPolicy:
        """One of ``k`` groups of these windows (one a sidecar instance): its share of the
        pairs (at least two, a spread, where this asks for two) and of the budget."""
        if k < 1:
            raise ValueError(f"groups of windows: at least one, got {k}")
        if k == 1:
            return self
        lo = max(min(2, self.min_pairs), math.ceil(self.min_pairs / k))
        return replace(
            self,
            min_pairs=lo,
            max_pairs=max(lo, math.ceil(self.max_pairs / k)),
            budget_s=None if self.budget_s is None else self.budget_s / k,
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "thresholds": self.thresholds.to_dict()}


def components_narrow(
    per_pair: Sequence[Breakdown], rel: float, floor_us: float, min_halfwidth_us: float = 1.0
) -> bool:
    """Does every component above ``floor_us`` have a 95 % interval within ``rel`` of its
    median over the pairs (or within ``min_halfwidth_us``)?"""
    for f in _BD_FIELDS:
        e = estimate([getattr(b, f) for b in per_pair])
        if abs(e.median) < floor_us:
            continue
        if e.coverage < 0.95 or (e.hi - e.lo) / 2 > max(rel * abs(e.median), min_halfwidth_us):
            return False
    return True


def probe_pairs(
    bed: OneHop,
    mode: Mode,
    size: int,
    sidecar_pid: int,
    *,
    windows: WindowPolicy,
    probe_app: bool = True,
    probe: Callable[[System], ProbeSession] = _real_probe,
    meter: MeterFactory | None = None,
    meshed: str | None = None,
    probe_client: bool = True,
    rt_priority: int | None = None,
) -> ProbedPairs:
    """Pairs of probe windows (a meshed and a direct one, order alternating; see
    :class:`WindowPolicy`), the probe on the sidecar, (``probe_app``) the app and
    (``probe_client``) every process of the client pod → the kept pairs and every window's record.
    ``meter``: measures what else ran in each window (None: nothing is checked).
    ``rt_priority``: the windows run with app and this process (so each window's load
    generator, its child) at ``SCHED_FIFO`` of that priority and the sidecar one above
    (:func:`~meshtax.testbed.probes.realtime`)."""
    # the app each path reaches (two processes when the sidecar talks to it over Unix sockets)
    apps = {"meshed": bed.meshed_app_pid, "direct": bed.app_pid}

    # other proxies on both paths (a node bed's): their change counts as the app's does
    path = bed.path_pids
    app_pids = list(dict.fromkeys([*apps.values(), *path]))
    pids = [sidecar_pid, *app_pids] if probe_app else [sidecar_pid]
    # the load generator is a new process per window: follow its namespace, not a PID
    follow = bed.client_netns_path if probe_client and probe_app else None
    targets = {"meshed": meshed or bed.meshed_target, "direct": bed.direct_target(mode)}
    gauge = meter(bed.cpus, [sidecar_pid, *app_pids]) if meter is not None else None
    # a probe that can snapshot stays attached for all windows (each window = the difference
    # of two snapshots): no attach/detach per window (≈ 0.3 s each)
    held = probe(bed.system)
    snap = held if isinstance(held, SnapshotSession) else None
    if snap is None:
        held.close()
    else:
        _start_probe(snap, pids, follow)
    # the profiler itself too: each window's load generator is its child and inherits it.
    # The sidecar one above the rest: on CFS it preempts the app that woke it (the app's Go
    # runtime then parks); at equal FIFO priorities it would wait for that (measured: gRPC
    # Notification +15 µs per crossing, closure +19 %)
    prio: dict[int, int] = {}
    if rt_priority is not None:
        prio = {p: rt_priority for p in (*pids, os.getpid())}
        prio[sidecar_pid] = rt_priority + 1
    rt = False
    last: list[ProbeReading] = []

    def window(name: str) -> ProbeWindow:
        before = gauge.snapshot() if gauge is not None else None
        if snap is not None:
            res = bed.load(targets[name], mode, size, duration_s=windows.run_s)
            now = snap.snapshot()
            reading = now.since(last[-1])
            last.append(now)
        else:
            res, reading = _probed_load(
                bed, probe, pids, follow, targets[name], mode, size, windows.run_s
            )
        app_tgid = (apps[name], *path) if probe_app else None
        w = Window.of(reading, res.count, sidecar_tgid=sidecar_pid, app_tgid=app_tgid)
        noise = (
            None
            if gauge is None or before is None
            else replace(
                Interference.between(before, gauge.snapshot()), stalls=host_stalls(reading)
            )
        )
        on_path = EMPTY_THREAD
        for t in reading.threads:
            if t.tgid in path:
                on_path = on_path + t
        return ProbeWindow(res, reading, w, noise, on_path)

    def clean(g: GroupRun[ProbeWindow]) -> bool:
        return not any(
            x.noise is not None and x.noise.contaminated(windows.thresholds)
            for xs in g.runs.values()
            for x in xs
        )

    def narrow(p: Paired[ProbeWindow]) -> bool:
        per = [
            pair_breakdown(m.window, d.window if probe_app else None, bed.cpu_chain)
            for m, d in p.pairs("meshed", "direct")
        ]
        return components_narrow(
            per, windows.rel_halfwidth, windows.floor_us, windows.min_halfwidth_us
        )

    try:
        with realtime(bed.system, prio) as rt:
            if snap is not None:
                last.append(snap.snapshot())
            paired = paired_runs(
                [("meshed", "direct")],
                window,
                PairPolicy(windows.min_pairs, windows.max_pairs, windows.budget_s),
                narrow=narrow,
                accept=clean if gauge is not None else None,
                max_rejects=windows.max_rejects,
            )
    finally:
        held.close()
    forced = 0
    if not paired.groups and paired.rejected:
        # every pair was disturbed (a machine busy throughout): rather than nothing, the least
        # disturbed pairs, said so in the record (``forced``) and by the profile
        paired = least_disturbed(paired, windows.thresholds, windows.min_pairs)
        forced = len(paired.groups)
    sched = f"fifo:{rt_priority}" if rt else "other"
    records = [
        window_record(name == "meshed", x, sched, kept)
        for kept, gs in ((True, paired.groups), (False, paired.rejected))
        for g in gs
        for name in group_order(g.group, g.round)
        for x in g.runs[name]
    ]
    return ProbedPairs(
        list(paired.pairs("meshed", "direct")),
        records,
        paired.stop,
        len(paired.rejected),
        forced,
        gauge is not None,
    )


def least_disturbed(
    paired: Paired[ProbeWindow], thresholds: Thresholds, keep: int
) -> Paired[ProbeWindow]:
    """The ``keep`` refused pairs that ran with the least other work (in time order) as the
    kept ones; the rest stay refused."""

    def excess(g: GroupRun[ProbeWindow]) -> float:
        return max(
            (x.noise.excess(thresholds) for xs in g.runs.values() for x in xs if x.noise),
            default=0.0,
        )

    best = sorted(paired.rejected, key=excess)[:keep]
    chosen = {id(g) for g in best}
    return Paired(
        tuple(g for g in paired.rejected if id(g) in chosen),
        "contaminated",
        tuple(g for g in paired.rejected if id(g) not in chosen),
    )


def _start_probe(session: ProbeSession, pids: list[int], follow: str | None) -> None:
    if follow is None:
        session.start(pids)  # sessions written before namespaces could be followed
    else:
        session.start(pids, follow_netns=follow)


def _probed_load(
    bed: OneHop,
    probe: Callable[[System], ProbeSession],
    pids: list[int],
    follow: str | None,
    target: str,
    mode: Mode,
    size: int,
    run_s: float,
) -> tuple[LoadResult, ProbeReading]:
    """One load with a probe attached just for it (sessions that cannot snapshot)."""
    session = probe(bed.system)
    try:
        _start_probe(session, pids, follow)
        res = bed.load(target, mode, size, duration_s=run_s)
        return res, session.stop()
    finally:
        session.close()


def sidecar_cpu(
    bed: OneHop,
    mode: Mode,
    size: int,
    qps: float,
    pid: int,
    *,
    run_s: float,
    perf: Callable[[System], CpuSampler] = _real_perf,
    schedstat_of: Callable[[int], Mapping[int, int]] = procfs.schedstat,
    meshed: str | None = None,
) -> tuple[LoadResult, Breakdown, float]:
    """One run at ``qps`` (0: as fast as possible) under perf → (load result, per-crossing
    CPU-µs of the sidecar process ``pid``, perf/schedstat ratio).

    perf gives the split, schedstat the total: perf starts sampling a few hundred ms after it
    is spawned and misses the start of the run, schedstat misses nothing; the buckets are
    scaled so their sum is schedstat's.
    """
    sampler = perf(bed.system)
    try:
        before = sum(schedstat_of(pid).values())
        sampler.start()
        res = bed.load(meshed or bed.meshed_target, mode, size, qps, duration_s=run_s)
        prof = sampler.stop([pid])
        after = sum(schedstat_of(pid).values())
    finally:
        sampler.close()
    buckets = {b.value: ns for b, ns in prof.process(pid).items() if b.value != "probe"}
    sampled = sum(buckets.values())
    ratio = sampled / (after - before) if after > before else 0.0
    if ratio > 0:
        buckets = {b: round(ns / ratio) for b, ns in buckets.items()}
    return res, cpu_breakdown(buckets, res.count), ratio
