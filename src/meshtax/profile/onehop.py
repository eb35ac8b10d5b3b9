"""One-hop measurements on the :class:`~meshtax.testbed.bed.EchoBed`: the paired overhead
(meshed − direct), paired probe windows (the components), and CPU runs under perf.

Each is a use of the one paired-run loop (:func:`~meshtax.testbed.paired.paired_runs`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from meshtax.model.capacity import LatencySketch
from meshtax.model.sidecar import Mode
from meshtax.model.stats import Estimate, estimate, median
from meshtax.profile.backends import CpuSampler, _real_perf, _real_probe
from meshtax.profile.capacity import latency_sketch
from meshtax.profile.decompose import (
    CROSSINGS_PER_REQUEST,
    Breakdown,
    Window,
    chain_breakdown,
    cpu_breakdown,
    mesh_breakdown,
)
from meshtax.testbed import procfs
from meshtax.testbed.bed import OneHop
from meshtax.testbed.fortio import LoadResult
from meshtax.testbed.interference import (
    Interference,
    MeterFactory,
    Thresholds,
    host_stalls,
    summarize,
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
    ProbeError,
    ProbeReading,
    ProbeSession,
    SnapshotSession,
    ThreadReading,
    realtime,
)
from meshtax.testbed.system import System

__all__ = [
    "PairedOverhead",
    "ProbeResult",
    "measure_overhead",
    "probe_components",
    "ProbeWindow",
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


@dataclass
class ProbeResult:
    """Paired probe windows of one mode and size.

    ``latency``: components per crossing (µs) from all windows of a kind summed (sidecar + Δapp
    + Δclient, see :mod:`~meshtax.profile.decompose`) — the per-message mean; two consecutive
    quick profiles agreed on more components with it than with per-field medians over the
    pairs (23 vs 19 of 36, BENCHMARKS.md issue #3); ``pooled``: the same (kept for readers of
    older records); ``median``: per-field medians over the pairs; ``sidecar_only``: pooled,
    without the app and client terms; ``per_pair``: each pair alone (their spread is the
    interval);
    ``overhead``: per-request overhead measured in the same probed windows.
    ``path_kernel_cpu_us``: the kernel CPU change per crossing (meshed − direct) of the other
    proxies on both paths (a node bed's; 0 on the echo bed), which CPU models count.
    ``chain_app_cpu_us``: on a bed whose proxies share the app's CPU with it on both paths (a
    waypoint's, :attr:`~meshtax.testbed.bed.OneHop.cpu_chain`), the echo app's own CPU change
    per crossing (meshed − direct, without the path's proxies), (user, kernel); None elsewhere.
    """

    latency: Breakdown
    pooled: Breakdown
    median: Breakdown
    sidecar_only: Breakdown
    per_pair: list[Breakdown]
    overhead: Estimate
    meshed_mean: list[float]
    direct_mean: list[float]
    requests: int
    dropped: int
    windows: list[dict[str, Any]]
    interference: dict[str, Any] = field(default_factory=dict)
    path_kernel_cpu_us: float = 0.0
    chain_app_cpu_us: tuple[float, float] | None = None

    def client_cpu_us(self) -> dict[str, float]:
        """:func:`client_cpu_us` of this result's windows."""
        return client_cpu_us(self.windows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "latency_breakdown_us": self.latency.to_dict(),
            "pooled_breakdown_us": self.pooled.to_dict(),
            "median_breakdown_us": self.median.to_dict(),
            "sidecar_only_breakdown_us": self.sidecar_only.to_dict(),
            "per_pair_breakdown_us": [b.to_dict() for b in self.per_pair],
            "overhead_per_request_us": self.overhead.to_dict(),
            "meshed_mean_us": self.meshed_mean,
            "direct_mean_us": self.direct_mean,
            "requests": self.requests,
            "dropped_events": self.dropped,
            "windows": self.windows,
            "interference": self.interference,
            **({"path_kernel_cpu_us": self.path_kernel_cpu_us} if self.path_kernel_cpu_us else {}),
            **(
                {}
                if self.chain_app_cpu_us is None
                else {
                    "chain_app_cpu_us": {
                        "user": self.chain_app_cpu_us[0],
                        "kernel": self.chain_app_cpu_us[1],
                    }
                }
            ),
        }


_BD_FIELDS = tuple(f.name for f in fields(Breakdown))


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


def probe_components(
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
) -> ProbeResult:
    """Pairs of probe windows (a meshed and a direct one, order alternating; see
    :class:`WindowPolicy`), the probe on the sidecar, (``probe_app``) the app and
    (``probe_client``) every process of the client pod → components and the probed overhead.
    ``meter``: measures what else ran in each window (None: nothing is checked).
    ``rt_priority``: the windows run with app and this process (so each window's load
    generator, its child) at ``SCHED_FIFO`` of that priority and the sidecar one above
    (:func:`~meshtax.testbed.probes.realtime`)."""
    # the app each path reaches (two processes when the sidecar talks to it over Unix sockets)
    apps = {"meshed": bed.meshed_app_pid, "direct": bed.app_pid}

    def breakdown(m: Window, d: Window | None) -> Breakdown:
        # several busy proxies sharing the app's CPU (a waypoint's bed): on-CPU time adds up
        return chain_breakdown(m, d) if bed.cpu_chain and d is not None else mesh_breakdown(m, d)

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
            breakdown(m.window, d.window if probe_app else None)
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
    raw = [
        _window_record(name == "meshed", x, sched, kept)
        for kept, gs in ((True, paired.groups), (False, paired.rejected))
        for g in gs
        for name in group_order(g.group, g.round)
        for x in g.runs[name]
    ]
    pairs_ = paired.pairs("meshed", "direct")
    if not pairs_:
        raise ProbeError(f"{mode.value} {size} B: no probe window pair completed")
    m_windows = [m.window for m, _ in pairs_]
    d_windows = [d.window for _, d in pairs_]
    m_mean = [m.result.avg_us for m, _ in pairs_]
    d_mean = [d.result.avg_us for _, d in pairs_]
    dropped = sum(x.reading.dropped for m, d in pairs_ for x in (m, d))
    path_cpu = per_crossing_delta(
        sum(m.path.sys_cpu_ns for m, _ in pairs_),
        sum(m.result.count for m, _ in pairs_),
        sum(d.path.sys_cpu_ns for _, d in pairs_),
        sum(d.result.count for _, d in pairs_),
    )
    chain_app = None
    if bed.cpu_chain and probe_app:
        # the echo alone: the app's threads less the path's proxies, which "app" includes
        def echo(xs: list[ProbeWindow], attr: str) -> float:
            return float(sum(getattr(x.window.app, attr) - getattr(x.path, attr) for x in xs))

        ms, ds = [m for m, _ in pairs_], [d for _, d in pairs_]
        nm, nd = sum(m.result.count for m in ms), sum(d.result.count for d in ds)
        chain_app = (
            per_crossing_delta(echo(ms, "user_ns"), nm, echo(ds, "user_ns"), nd),
            per_crossing_delta(echo(ms, "sys_cpu_ns"), nm, echo(ds, "sys_cpu_ns"), nd),
        )
    noise = [x.noise for m, d in pairs_ for x in (m, d) if x.noise is not None]

    def pooled(ws: list[Window]) -> Window:
        out = ws[0]
        for w in ws[1:]:
            out = out + w
        return out

    pm, pd = pooled(m_windows), pooled(d_windows)
    per_pair = [breakdown(m, d if probe_app else None) for m, d in zip(m_windows, d_windows)]
    diffs = [m - d for m, d in zip(m_mean, d_mean)]
    pooled_bd = breakdown(pm, pd if probe_app else None)
    return ProbeResult(
        latency=pooled_bd,
        pooled=pooled_bd,
        median=Breakdown(**{f: median([getattr(b, f) for b in per_pair]) for f in _BD_FIELDS}),
        sidecar_only=mesh_breakdown(pm, None),
        per_pair=per_pair,
        overhead=estimate(diffs, stop=paired.stop),
        meshed_mean=m_mean,
        direct_mean=d_mean,
        requests=pm.requests,
        dropped=dropped,
        windows=raw,
        interference=summarize(noise, len(paired.rejected), forced) if gauge is not None else {},
        path_kernel_cpu_us=path_cpu,
        chain_app_cpu_us=chain_app,
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


@dataclass(frozen=True)
class ProbeWindow:
    """One probe window: the load's result, the probe's reading, the window it makes, and
    what else ran meanwhile (None: not measured)."""

    result: LoadResult
    reading: ProbeReading
    window: Window
    noise: Interference | None
    path: ThreadReading = EMPTY_THREAD  # the other proxies on the path (a node bed's), summed


def client_cpu_us(windows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The load generator's CPU change per crossing (meshed − direct, over the kept window
    records): its read and write syscalls (the server pod's interception runs in its send
    path) and its user time (parsing what the sidecar sends: more HTTP/2 frames in gRPC). In
    an app the caller is a meshed pod whose CPU counts, so the CPU models carry it."""
    out = {}
    for k in ("read", "write", "user"):
        per = {}
        for meshed in (True, False):
            ws = [w for w in windows if w["meshed"] is meshed and w["kept"]]
            n = sum(int(w["requests"]) for w in ws)
            ns = sum(int(w.get("client", {}).get(f"{k}_ns", 0)) for w in ws)
            per[meshed] = ns * 1e-3 / (CROSSINGS_PER_REQUEST * n) if n else 0.0
        out[k] = per[True] - per[False]
    return out


def per_crossing_delta(m_ns: float, m_requests: int, d_ns: float, d_requests: int) -> float:
    """(meshed − direct) ns per request, in µs per crossing (0 without requests)."""
    if m_requests <= 0 or d_requests <= 0:
        return 0.0
    return (m_ns / m_requests - d_ns / d_requests) * 1e-3 / CROSSINGS_PER_REQUEST


def _window_record(meshed: bool, x: ProbeWindow, sched: str, kept: bool) -> dict[str, Any]:
    """One probe window, raw, for the profile's record (``kept``: used, not refused)."""
    res, reading, w = x.result, x.reading, x.window
    threads: tuple[tuple[str, ThreadReading], ...] = (
        ("sidecar", w.sidecar),
        ("app", w.app),
        ("client", w.client),
    )
    if x.path != EMPTY_THREAD:  # a node bed's other proxies (inside "app" too)
        threads += (("path", x.path),)
    return {
        "meshed": meshed,
        "kept": kept,
        "requests": res.count,
        "mean_us": res.avg_us,
        "duration_ns": reading.duration_ns,
        "ipc_packets": w.ipc_packets,
        "ipc_ns": w.ipc_ns,
        "ipc_bytes": w.ipc_bytes,
        "sock_method": reading.ipc.sock_method,
        "probe_bpf_ns": reading.probe_ns,
        **{k: _thread_dict(t) for k, t in threads},
        # per-event notification latencies, [bin, count, ns] in 2^shift ns bins
        "notify_hist": {k: [list(b) for b in t.notify_hist.bins] for k, t in threads},
        "notify_hist_shift": w.sidecar.notify_hist.shift,
        "sched": sched,
        "interference": None if x.noise is None else x.noise.to_dict(),
    }


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


def _thread_dict(t: ThreadReading) -> dict[str, int]:
    """The raw totals of a thread sum, for the record (ns and counts)."""
    return {
        "read_ns": t.read.ns,
        "read_n": t.read.count,
        "write_ns": t.write.ns,
        "write_n": t.write.count,
        "epoll_ns": t.epoll.ns,
        "epoll_n": t.epoll.count,
        "notify_ns": t.notify.ns,
        "notify_n": t.notify.count,
        "notify_behind_ns": t.notify_behind_ns,
        "sock_ipc_ns": t.sock_ipc.ns,
        "sock_ipc_n": t.sock_ipc.count,
        "errqueue_ns": t.errqueue.ns,
        "errqueue_n": t.errqueue.count,
        "syscalls": t.syscalls,
        "sys_ns": t.sys_ns,
        "oncpu_ns": t.oncpu_ns,
        "user_ns": t.user_ns,
        "sys_cpu_ns": t.sys_cpu_ns,
        "switches_in": t.switches_in,
    }


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
