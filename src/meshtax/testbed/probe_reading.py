"""What the eBPF probe (``bpf/sidecar``) reports, parsed: per-thread syscall, wake-up and CPU
aggregates, loopback IPC timings, per-thread socket-to-socket IPC and the probe's own counters
(:func:`parse_reading`). Pure: readings add and subtract, so a window is the difference of two
snapshots."""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "FORMAT_VERSION",
    "Histogram",
    "IpcStat",
    "OpStat",
    "ProbeError",
    "ProbeReading",
    "ProgramStat",
    "ThreadReading",
    "parse_reading",
]

FORMAT_VERSION = 1
# counters in the loader's JSON that mean an event was lost; exit_unmatched is not one (a
# syscall already running when the probe attached has no entry: expected once per thread)
_LOSS_COUNTERS = ("thread_map_full", "skb_map_full")


class ProbeError(RuntimeError):
    """The probe failed to start, died, or printed something unparseable."""


@dataclass(frozen=True)
class OpStat:
    """Calls of one class: how many, total wall ns, bytes returned, error returns."""

    count: int = 0
    ns: int = 0
    bytes: int = 0
    errors: int = 0

    @property
    def mean_ns(self) -> float:
        return self.ns / self.count if self.count else 0.0

    def __add__(self, other: OpStat) -> OpStat:
        return OpStat(
            self.count + other.count,
            self.ns + other.ns,
            self.bytes + other.bytes,
            self.errors + other.errors,
        )

    def __sub__(self, other: OpStat) -> OpStat:
        return OpStat(
            self.count - other.count,
            self.ns - other.ns,
            self.bytes - other.bytes,
            self.errors - other.errors,
        )


@dataclass(frozen=True)
class Histogram:
    """Per-event latencies in bins of ``2**shift`` ns (the last bin the loader has is
    open-ended): sparse ``(bin, count, ns)`` rows sorted by bin, ``ns`` the exact sum of the
    bin's events. Lets the profile take robust per-event statistics of a window instead of
    only its sum (``notify_hist``: wake-up → epoll return). Empty when the loader predates it.
    """

    bins: tuple[tuple[int, int, int], ...] = ()
    shift: int = 10

    @property
    def count(self) -> int:
        return sum(n for _, n, _ in self.bins)

    @property
    def ns(self) -> int:
        return sum(ns for _, _, ns in self.bins)

    def _merge(self, other: Histogram, sign: int) -> Histogram:
        if not other.bins:
            return self
        if not self.bins:
            return (
                other
                if sign > 0
                else Histogram(tuple((b, -n, -t) for b, n, t in other.bins), other.shift)
            )
        if self.shift != other.shift:
            raise ValueError(
                f"histograms of different bin widths: 2^{self.shift} vs 2^{other.shift} ns"
            )
        acc: dict[int, tuple[int, int]] = {b: (n, t) for b, n, t in self.bins}
        for b, n, t in other.bins:
            n0, t0 = acc.get(b, (0, 0))
            acc[b] = (n0 + sign * n, t0 + sign * t)
        return Histogram(
            tuple((b, n, t) for b, (n, t) in sorted(acc.items()) if n or t), self.shift
        )

    def __add__(self, other: Histogram) -> Histogram:
        return self._merge(other, 1)

    def __sub__(self, other: Histogram) -> Histogram:
        return self._merge(other, -1)

    def trimmed_mean_ns(self, trim: float) -> float:
        """Mean per event after dropping the slowest ``trim`` share of events (0: the plain
        mean). Inside the bin where the cut falls, events are taken at that bin's mean."""
        if not 0.0 <= trim < 1.0:
            raise ValueError(f"trim must be in [0, 1), got {trim}")
        total = self.count
        if total <= 0:
            return 0.0
        keep = total * (1.0 - trim)
        taken = 0.0
        ns = 0.0
        for _, n, t in self.bins:
            if n <= 0:
                continue
            k = min(float(n), keep - taken)
            ns += t * (k / n)
            taken += k
            if taken >= keep:
                break
        return ns / taken if taken else 0.0

    def count_from(self, ns: int) -> int:
        """Events in the bins that start at ``ns`` or later."""
        return sum(n for b, n, _ in self.bins if b << self.shift >= ns)

    def quantile_ns(self, q: float) -> float:
        """The ``q`` quantile, linear inside its bin (bin edges from ``shift``)."""
        total = self.count
        if total <= 0:
            return 0.0
        target = q * total
        seen = 0
        width = 1 << self.shift
        for b, n, _ in self.bins:
            if n <= 0:
                continue
            if seen + n >= target:
                return (b + (target - seen) / n) * width
            seen += n
        return float((self.bins[-1][0] + 1) * width)


EMPTY_HIST = Histogram()


@dataclass(frozen=True)
class ThreadReading:
    """Aggregates of one thread (or a sum of threads when ``tid`` is 0)."""

    tid: int
    tgid: int
    comm: str
    read: OpStat
    write: OpStat
    epoll: OpStat
    notify: OpStat
    syscalls: int
    sys_ns: int
    oncpu_ns: int
    user_ns: int
    sys_cpu_ns: int
    unknown_cpu_ns: int
    switches_in: int
    followed: bool = False  # tracked because of its netns, not its PID
    notify_hist: Histogram = EMPTY_HIST  # per-event notification latencies (sums to ``notify``)
    # socket-to-socket delivery inside this thread's sends, with no device on the way (Unix
    # sockets, sockmap; sk_data_ready → end of the send; part of ``write``'s time) and
    # recvmsg(MSG_ERRQUEUE) calls (zero-copy completions; not in ``read``). Empty from a
    # loader or kernel without them.
    sock_ipc: OpStat = OpStat()
    errqueue: OpStat = OpStat()
    # of ``notify``: the watched proxy's (the probe's first PID's) on-CPU time outside epoll
    # on this thread's CPU between its wake-up and the epoll return — it waited behind the
    # proxy's reads, writes, user-space work and other syscalls, which are the proxy's own
    # time (0 from a loader that predates it)
    notify_behind_ns: int = 0

    def _fieldwise(self, other: ThreadReading, op: Callable[[Any, Any], Any]) -> dict[str, Any]:
        """``op`` of every counter of the two readings (one list, so a new counter cannot be
        summed but forgotten in the difference)."""
        return {f: op(getattr(self, f), getattr(other, f)) for f in _COUNTERS}

    def __add__(self, other: ThreadReading) -> ThreadReading:
        same = self.tgid == other.tgid
        return ThreadReading(
            tid=0,
            tgid=self.tgid if same else 0,
            comm=self.comm if self.comm == other.comm else "",
            followed=self.followed and other.followed,
            **self._fieldwise(other, operator.add),
        )

    def __sub__(self, other: ThreadReading) -> ThreadReading:
        """What this (later, cumulative) reading of a thread adds to ``other``."""
        return replace(self, **self._fieldwise(other, operator.sub))


#: the additive fields of a :class:`ThreadReading`
_COUNTERS = (
    "read",
    "write",
    "epoll",
    "notify",
    "syscalls",
    "sys_ns",
    "oncpu_ns",
    "user_ns",
    "sys_cpu_ns",
    "unknown_cpu_ns",
    "switches_in",
    "notify_hist",
    "sock_ipc",
    "errqueue",
    "notify_behind_ns",
)

EMPTY_THREAD = ThreadReading(0, 0, "", OpStat(), OpStat(), OpStat(), OpStat(), 0, 0, 0, 0, 0, 0, 0)


@dataclass(frozen=True)
class IpcStat:
    """Loopback skbs timed from queue to receive (``method`` says which tracepoints);
    ``sock_method``: how socket-to-socket delivery was timed per thread (``unavailable``: the
    kernel lacks the tracepoints and it stays inside Write; empty: an older loader)."""

    method: str
    count: int
    ns: int
    bytes: int
    max_ns: int
    sock_method: str = ""

    @property
    def mean_ns(self) -> float:
        return self.ns / self.count if self.count else 0.0


@dataclass(frozen=True)
class ProgramStat:
    """Kernel-side cost of one BPF program; ``recursion_misses`` are events it missed."""

    name: str
    run_cnt: int
    run_time_ns: int
    recursion_misses: int


@dataclass(frozen=True)
class ProbeReading:
    """One probe window: per-thread aggregates, totals, IPC and the probe's own counters."""

    pids: tuple[int, ...]
    netns: int
    duration_ns: int
    threads: tuple[ThreadReading, ...]
    total: ThreadReading
    ipc: IpcStat
    counters: Mapping[str, int]
    programs: tuple[ProgramStat, ...]
    stats_enabled: bool
    version: int = FORMAT_VERSION
    follow_netns: int = 0  # inode of the followed namespace (0: none)

    @property
    def dropped(self) -> int:
        """Events the probe saw but could not account, plus events the kernel skipped."""
        lost = sum(self.counters.get(k, 0) for k in _LOSS_COUNTERS)
        return lost + sum(p.recursion_misses for p in self.programs)

    @property
    def probe_ns(self) -> int:
        """Total time spent in the probe's BPF programs (0 when stats were unavailable)."""
        return sum(p.run_time_ns for p in self.programs)

    def since(self, earlier: ProbeReading) -> ProbeReading:
        """The window between two cumulative snapshots of one probe (``earlier`` first).

        Threads are matched by tid (new ones count whole); ``ipc.max_ns`` stays this
        snapshot's (a maximum cannot be subtracted).
        """
        before = {t.tid: t for t in earlier.threads}
        threads = tuple(t - before[t.tid] if t.tid in before else t for t in self.threads)
        total = EMPTY_THREAD
        for t in threads:
            total = total + t
        was = {p.name: p for p in earlier.programs}
        programs = tuple(
            ProgramStat(
                p.name,
                p.run_cnt - was[p.name].run_cnt,
                p.run_time_ns - was[p.name].run_time_ns,
                p.recursion_misses - was[p.name].recursion_misses,
            )
            if p.name in was
            else p
            for p in self.programs
        )
        return replace(
            self,
            duration_ns=self.duration_ns - earlier.duration_ns,
            threads=threads,
            total=replace(total, tid=0, tgid=0, comm=""),
            ipc=IpcStat(
                self.ipc.method,
                self.ipc.count - earlier.ipc.count,
                self.ipc.ns - earlier.ipc.ns,
                self.ipc.bytes - earlier.ipc.bytes,
                self.ipc.max_ns,
                self.ipc.sock_method,
            ),
            counters={k: v - earlier.counters.get(k, 0) for k, v in self.counters.items()},
            programs=programs,
        )

    def process(self, tgid: int) -> ThreadReading:
        """Sum over the threads of one process."""
        out = EMPTY_THREAD
        for t in self.threads:
            if t.tgid == tgid:
                out = out + t
        return replace(out, tgid=tgid, tid=0)

    def components(self) -> dict[str, OpStat]:
        """Per-component totals over all threads: read, write, notification, ipc, user.

        ``user`` carries on-CPU ns outside syscalls (count = syscalls, the number of user
        segments' boundaries); ``ipc`` bytes are IP packet lengths.
        """
        t = self.total
        return {
            "read": t.read,
            "write": t.write,
            "notification": t.notify,
            "ipc": OpStat(self.ipc.count, self.ipc.ns, self.ipc.bytes, 0),
            "user": OpStat(t.syscalls, t.user_ns, 0, 0),
        }


def _op(d: Mapping[str, Any]) -> OpStat:
    return OpStat(int(d["count"]), int(d["ns"]), int(d["bytes"]), int(d["errors"]))


def _op_opt(d: Mapping[str, Any], key: str) -> OpStat:
    """An op stat a loader may predate (empty then)."""
    return _op(d[key]) if key in d else OpStat()


def _thread(d: Mapping[str, Any], tid: int = 0, tgid: int = 0, comm: str = "") -> ThreadReading:
    return ThreadReading(
        tid=int(d.get("tid", tid)),
        tgid=int(d.get("tgid", tgid)),
        comm=str(d.get("comm", comm)),
        read=_op(d["read"]),
        write=_op(d["write"]),
        epoll=_op(d["epoll"]),
        notify=_op(d["notify"]),
        syscalls=int(d["syscalls"]),
        sys_ns=int(d["sys_ns"]),
        oncpu_ns=int(d["oncpu_ns"]),
        user_ns=int(d["user_ns"]),
        sys_cpu_ns=int(d["sys_cpu_ns"]),
        unknown_cpu_ns=int(d["unknown_cpu_ns"]),
        switches_in=int(d["switches_in"]),
        followed=bool(d.get("followed", 0)),
        notify_hist=Histogram(
            tuple((int(b), int(n), int(t)) for b, n, t in d.get("notify_hist", ())),
            int(d.get("notify_hist_shift", 10)),
        ),
        sock_ipc=_op_opt(d, "sock_ipc"),
        errqueue=_op_opt(d, "errqueue"),
        notify_behind_ns=int(d.get("notify_behind_ns", 0)),
    )


def parse_reading(text: str) -> ProbeReading:
    """Parse the loader's one JSON object. Raises :class:`ProbeError` on anything else."""
    try:
        d = json.loads(text)
        if d.get("tool") != "sidecar" or d.get("version") != FORMAT_VERSION:
            raise ProbeError(
                f"not a sidecar v{FORMAT_VERSION} reading: tool={d.get('tool')!r} "
                f"version={d.get('version')!r}"
            )
        ipc = d["ipc"]
        return ProbeReading(
            pids=tuple(int(p) for p in d["pids"]),
            netns=int(d["netns"]),
            duration_ns=int(d["duration_ns"]),
            threads=tuple(sorted((_thread(t) for t in d["threads"]), key=lambda t: t.tid)),
            total=_thread(d["total"]),
            ipc=IpcStat(
                str(ipc["method"]),
                int(ipc["count"]),
                int(ipc["ns"]),
                int(ipc["bytes"]),
                int(ipc["max_ns"]),
                str(ipc.get("sock_method", "")),
            ),
            counters={str(k): int(v) for k, v in d["counters"].items()},
            programs=tuple(
                ProgramStat(
                    str(p["name"]),
                    int(p["run_cnt"]),
                    int(p["run_time_ns"]),
                    int(p["recursion_misses"]),
                )
                for p in d["programs"]
            ),
            stats_enabled=bool(d["stats_enabled"]),
            version=int(d["version"]),
            follow_netns=int(d.get("follow_netns", 0)),
        )
    except ProbeError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ProbeError(f"unparseable probe output ({e!r}): {text[:200]!r}") from e
