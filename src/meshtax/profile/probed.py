"""Probe windows → :class:`ProbeResult`: one mode's and size's components from the kept pairs of
meshed and direct windows, pooled (:func:`pool`) — the windows of one sidecar instance, or of
several started one after the other (``Plan.probe_instances``: each instance's level differs
beyond its windows' noise, BENCHMARKS.md issue #14 run 16, so a profile averages over some).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from meshtax.model.stats import Estimate, estimate, median
from meshtax.profile.decompose import (
    CROSSINGS_PER_REQUEST,
    Breakdown,
    Window,
    chain_breakdown,
    mesh_breakdown,
)
from meshtax.testbed.fortio import LoadResult
from meshtax.testbed.interference import Interference, summarize
from meshtax.testbed.probe_reading import EMPTY_THREAD
from meshtax.testbed.probes import ProbeError, ProbeReading, ThreadReading

__all__ = [
    "ProbeResult",
    "ProbeWindow",
    "ProbedPairs",
    "client_cpu_us",
    "pair_breakdown",
    "per_crossing_delta",
    "pool",
    "window_record",
]


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


def window_record(meshed: bool, x: ProbeWindow, sched: str, kept: bool) -> dict[str, Any]:
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
        **{k: thread_dict(t) for k, t in threads},
        # per-event notification latencies, [bin, count, ns] in 2^shift ns bins
        "notify_hist": {k: [list(b) for b in t.notify_hist.bins] for k, t in threads},
        "notify_hist_shift": w.sidecar.notify_hist.shift,
        "sched": sched,
        "interference": None if x.noise is None else x.noise.to_dict(),
    }


def thread_dict(t: ThreadReading) -> dict[str, int]:
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


@dataclass(frozen=True)
class ProbedPairs:
    """The windows of one sidecar instance: its kept (meshed, direct) pairs in time order,
    every window's record (kept and refused, :func:`window_record`), why the pairs stopped,
    how many pairs were refused and how many kept only because every pair was disturbed
    (``forced``), and whether what else ran was measured (``metered``)."""

    pairs: list[tuple[ProbeWindow, ProbeWindow]]
    records: list[dict[str, Any]]
    stop: str
    rejected: int = 0
    forced: int = 0
    metered: bool = False


def pair_breakdown(m: Window, d: Window | None, cpu_chain: bool) -> Breakdown:
    """A meshed window's components against its direct one (``d`` None: the sidecar's alone);
    several busy proxies sharing the app's CPU (``cpu_chain``, a waypoint's bed): on-CPU time
    adds up."""
    return chain_breakdown(m, d) if cpu_chain and d is not None else mesh_breakdown(m, d)


def pool(
    parts: Sequence[ProbedPairs], *, cpu_chain: bool, probe_app: bool, what: str
) -> ProbeResult:
    """The components of all kept pairs of ``parts`` (one part a sidecar instance): windows
    of a kind summed, so each instance weighs by its requests; the pairs' spread (the
    interval) then holds the instances' spread too. With several parts each record says its
    ``instance`` (0, 1, …). ``what``: the mode and size, for the error without a pair."""
    pairs_ = [p for part in parts for p in part.pairs]
    if not pairs_:
        raise ProbeError(f"{what}: no probe window pair completed")

    def breakdown(m: Window, d: Window | None) -> Breakdown:
        return pair_breakdown(m, d if probe_app else None, cpu_chain)

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
    if cpu_chain and probe_app:
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
    per_pair = [breakdown(m, d) for m, d in zip(m_windows, d_windows)]
    diffs = [m - d for m, d in zip(m_mean, d_mean)]
    pooled_bd = breakdown(pm, pd)
    several = len(parts) > 1
    records = [
        {**r, "instance": i} if several else r for i, part in enumerate(parts) for r in part.records
    ]
    return ProbeResult(
        latency=pooled_bd,
        pooled=pooled_bd,
        median=Breakdown(**{f: median([getattr(b, f) for b in per_pair]) for f in _BD_FIELDS}),
        sidecar_only=mesh_breakdown(pm, None),
        per_pair=per_pair,
        overhead=estimate(diffs, stop="/".join(dict.fromkeys(p.stop for p in parts))),
        meshed_mean=m_mean,
        direct_mean=d_mean,
        requests=pm.requests,
        dropped=dropped,
        windows=records,
        interference=(
            summarize(noise, sum(p.rejected for p in parts), sum(p.forced for p in parts))
            if any(p.metered for p in parts)
            else {}
        ),
        path_kernel_cpu_us=path_cpu,
        chain_app_cpu_us=chain_app,
    )
