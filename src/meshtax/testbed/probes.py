"""The eBPF sidecar probe (``bpf/sidecar``) from Python.

The probe aggregates in kernel maps, per thread of the target processes:

* **Read** / **Write**: wall time of read-family (read, readv, recvfrom, recvmsg, recvmmsg) and
  write-family (write, writev, sendto, sendmsg, sendmmsg) syscalls, ``raw_syscalls`` enter→exit,
  with bytes returned. On loopback the receiver's whole RX path runs inside the sender's
  write (softirq on ``local_bh_enable``), so Write *includes* IPC; subtract it downstream.
* **Notification**: ``sched:sched_wakeup`` of a thread sleeping in ``epoll_wait``/
  ``epoll_pwait``/``epoll_pwait2`` → the return of that call (only calls that slept).
* **on-CPU split**: ``sched:sched_switch`` in/out plus syscall boundaries split each thread's
  on-CPU time into user (between syscalls — Parsing/Filter/Other are computed from it) and sys.
  Interrupts and softirqs are charged to whatever thread they interrupt.

Besides the target PIDs, ``follow_netns`` (``-f``) also tracks every task of one more network
namespace from its first syscall on (:attr:`ThreadReading.followed`): the client pod, whose
load generator is a new process in every window and cannot be named by PID beforehand.

and, for the first target's network namespace (not per thread):

* **IPC**: ``net:net_dev_queue`` on ``lo`` → ``net:netif_receive_skb`` on ``lo`` of the same skb
  (keyed by address): loopback device delivery (qdisc-less xmit, backlog queue, softirq
  pick-up). It does not include the TCP/IP processing on either side.

:class:`RealProbe` runs the loader through :class:`~meshtax.testbed.system.System`;
:class:`FakeProbe` returns scripted readings. Parsing (:func:`parse_reading`) is pure.
Both can also take cumulative snapshots while staying attached (:class:`SnapshotSession`);
:meth:`ProbeReading.since` turns two snapshots into the window between them, so consecutive
windows do not pay a probe attach and detach each (≈ 0.3 s here).
"""

from __future__ import annotations

import json
import operator
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

from meshtax.testbed.system import Placement, Process, RealSystem, System

__all__ = [
    "FORMAT_VERSION",
    "FakeProbe",
    "Histogram",
    "IpcStat",
    "OpStat",
    "ProbeError",
    "ProbeReading",
    "ProbeSession",
    "ProbeUnavailable",
    "ProgramStat",
    "RealProbe",
    "SnapshotSession",
    "ThreadReading",
    "parse_reading",
    "probe_binary",
    "realtime",
]

FORMAT_VERSION = 1
READY_MARK = "sidecar: ready"
# counters in the loader's JSON that mean an event was lost; exit_unmatched is not one (a
# syscall already running when the probe attached has no entry: expected once per thread)
_LOSS_COUNTERS = ("thread_map_full", "skb_map_full")


class ProbeError(RuntimeError):
    """The probe failed to start, died, or printed something unparseable."""


class ProbeUnavailable(ProbeError):
    """The probe binary is not built (needs clang, bpftool, libbpf and kernel BTF)."""


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
)

EMPTY_THREAD = ThreadReading(0, 0, "", OpStat(), OpStat(), OpStat(), OpStat(), 0, 0, 0, 0, 0, 0, 0)


@dataclass(frozen=True)
class IpcStat:
    """Loopback skbs timed from queue to receive (``method`` says which tracepoints)."""

    method: str
    count: int
    ns: int
    bytes: int
    max_ns: int

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


class ProbeSession(Protocol):
    """A probe window: ``start`` on some processes, ``stop`` to get the reading.

    ``follow_netns`` (a path such as ``/run/netns/NAME``) also tracks every task of that
    network namespace, including processes started later. ``close`` ends a running window
    without a reading (idempotent); use it in ``finally``.
    """

    def start(self, pids: Sequence[int], *, follow_netns: str | None = None) -> None: ...

    def stop(self) -> ProbeReading: ...

    def close(self) -> None: ...


@runtime_checkable
class SnapshotSession(ProbeSession, Protocol):
    """A session that can also report its cumulative totals so far without stopping."""

    def snapshot(self) -> ProbeReading: ...


@contextmanager
def realtime(system: System, priorities: Mapping[int, int]) -> Iterator[bool]:
    """Run the block with every thread of each PID at ``SCHED_FIFO`` of its priority
    (``chrt``), then back to ``SCHED_OTHER`` (their nice value is kept). Yields whether it
    took effect (an empty mapping, or ``chrt`` refused: False, nothing changed).

    Why: on this shared 2-vCPU machine most of a probe window's notification time came from a
    few wake-ups of 0.2–5 ms (BENCHMARKS.md, issue #3): the woken thread, even at nice −20,
    waits behind another process's CFS slice on its CPU (EEVDF lets the running task finish
    its slice). They landed at random in meshed or direct windows and swung Notification and
    the overhead by tens of percent. A real-time thread preempts CFS tasks at once. Processes
    spawned later by a listed PID (the load generator of each window, when the caller lists
    itself) inherit the policy. Equal priorities never preempt each other: give a process that
    must preempt another on its CPU (the sidecar, woken while the app still runs) a higher one.
    Measured (two quick profiles each way): the stalls went (their share of notification time
    from 10–59 % to 3–7 %), but the sidecar/app CPU sharing changed with them and closure and
    agreement got worse, so profiles do not use it by default (``Plan.probe_rt_priority``).
    """
    done: list[int] = []
    try:
        for pid, prio in priorities.items():
            r = system.run(["chrt", "-f", "-a", "-p", str(prio), str(pid)], check=False)
            if r.returncode != 0:
                break
            done.append(pid)
        ok = bool(priorities) and len(done) == len(priorities)
        if not ok:
            # all or nothing: a half real-time path would be a third regime
            for pid in reversed(done):
                system.run(["chrt", "-o", "-a", "-p", "0", str(pid)], check=False)
            done.clear()
        yield ok
    finally:
        for pid in reversed(done):
            system.run(["chrt", "-o", "-a", "-p", "0", str(pid)], check=False)


def probe_binary() -> Path:
    """The built loader: ``bpf/.output/sidecar`` of the source tree this package lives in."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        cand = parent / "bpf" / ".output" / "sidecar"
        if cand.is_file():
            return cand
        if (parent / "bpf" / "Makefile").is_file():
            raise ProbeUnavailable(
                f"{cand} is not built: run `make -C {parent / 'bpf'}` "
                "(needs clang, bpftool, libbpf-dev and /sys/kernel/btf/vmlinux)"
            )
    raise ProbeUnavailable("bpf/ sources not found next to the meshtax package")


@dataclass
class RealProbe:
    """Runs ``sidecar -p PIDS`` as root; ``stop`` sends SIGINT and parses its JSON.

    ``all_netns`` times loopback skbs of every namespace instead of the first PID's;
    ``run_stats`` turns on kernel BPF run-time stats (``ProgramStat.run_time_ns``), which adds
    two clock reads per event.
    """

    system: System = field(default_factory=RealSystem)
    binary: Path | None = None
    all_netns: bool = False
    run_stats: bool = False
    ready_timeout: float = 15.0
    stop_timeout: float = 10.0
    snapshot_timeout: float = 5.0
    _proc: Process | None = field(default=None, init=False, repr=False)
    _dir: Path | None = field(default=None, init=False, repr=False)
    _files: list[IO[bytes]] = field(default_factory=list, init=False, repr=False)
    _snapshots: int = field(default=0, init=False, repr=False)

    def argv(self, pids: Sequence[int], follow_netns: str | None = None) -> list[str]:
        if not pids:
            raise ValueError("no target PIDs")
        binary = self.binary or probe_binary()
        out = [str(binary), "-p", ",".join(str(int(p)) for p in pids)]
        if follow_netns:
            out += ["-f", follow_netns]
        return out + (["-a"] if self.all_netns else []) + (["-s"] if self.run_stats else [])

    def start(self, pids: Sequence[int], *, follow_netns: str | None = None) -> None:
        if self._proc is not None:
            raise ProbeError("probe already running")
        argv = self.argv(pids, follow_netns)
        self._dir = Path(tempfile.mkdtemp(prefix="meshtax-probe-"))
        out = open(self._dir / "reading.json", "wb")  # noqa: SIM115 - closed in close()
        err = open(self._dir / "probe.log", "wb")  # noqa: SIM115
        self._files = [out, err]
        self._snapshots = 0
        self._proc = self.system.spawn(argv, place=Placement(), stdout=out, stderr=err)
        # the loader says when every program is attached; load must not start earlier
        deadline = time.monotonic() + self.ready_timeout
        while READY_MARK not in self._log():
            if self._proc.poll() is not None:
                log = self._log().strip()
                self.close()
                raise ProbeError(f"probe exited before attaching: {log or '(no output)'}")
            if time.monotonic() > deadline:
                self.close()
                raise ProbeError(f"probe not ready after {self.ready_timeout:.0f} s")
            time.sleep(0.02)

    def stop(self) -> ProbeReading:
        proc = self._proc
        if proc is None or self._dir is None:
            raise ProbeError("probe not started")
        try:
            # SIGINT is the loader's normal end: it prints the maps, then exits
            self.system.run(["kill", "-s", "INT", str(proc.pid)], check=False)
            try:
                rc = proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired as e:
                raise ProbeError(
                    f"probe did not exit {self.stop_timeout:.0f} s after SIGINT"
                ) from e
            text = (self._dir / "reading.json").read_text()
            if rc != 0:
                raise ProbeError(f"probe exited {rc}: {self._log().strip()}")
            # after snapshots the final reading is the last of several one-line objects
            lines = self._lines()
            return parse_reading(lines[-1] if self._snapshots and lines else text)
        finally:
            self.close()

    def snapshot(self) -> ProbeReading:
        """The totals since ``start`` (SIGUSR1: the loader prints a line and keeps running)."""
        proc = self._proc
        if proc is None or self._dir is None:
            raise ProbeError("probe not started")
        seen = len(self._lines())
        self._snapshots += 1
        self.system.run(["kill", "-s", "USR1", str(proc.pid)], check=False)
        deadline = time.monotonic() + self.snapshot_timeout
        while len(lines := self._lines()) <= seen:
            if proc.poll() is not None:
                raise ProbeError(f"probe exited during a snapshot: {self._log().strip()}")
            if time.monotonic() > deadline:
                raise ProbeError(f"no probe snapshot after {self.snapshot_timeout:.0f} s")
            time.sleep(0.002)
        return parse_reading(lines[-1])

    def _lines(self) -> list[str]:
        """Complete lines of the loader's stdout (one reading each)."""
        if self._dir is None:
            return []
        text = (self._dir / "reading.json").read_text()
        return [ln for ln in text.split("\n")[:-1] if ln.strip()]

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stop()
        self._proc = None
        for f in self._files:
            f.close()
        self._files = []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _log(self) -> str:
        if self._dir is None:
            return ""
        try:
            return (self._dir / "probe.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""


@dataclass
class FakeProbe:
    """Returns ``readings`` in order, one per window; records the PIDs (and the followed
    namespace) of each ``start``."""

    readings: list[ProbeReading]
    started: list[tuple[int, ...]] = field(default_factory=list)
    followed: list[str | None] = field(default_factory=list)
    running: bool = False

    def start(self, pids: Sequence[int], *, follow_netns: str | None = None) -> None:
        if self.running:
            raise ProbeError("probe already running")
        self.started.append(tuple(pids))
        self.followed.append(follow_netns)
        self.running = True

    def stop(self) -> ProbeReading:
        if not self.running:
            raise ProbeError("probe not started")
        self.running = False
        if not self.readings:
            raise ProbeError("FakeProbe has no more scripted readings")
        return self.readings.pop(0)

    def snapshot(self) -> ProbeReading:
        """The next scripted reading, staying started (script cumulative totals)."""
        if not self.running:
            raise ProbeError("probe not started")
        if not self.readings:
            raise ProbeError("FakeProbe has no more scripted readings")
        return self.readings.pop(0)

    def close(self) -> None:
        self.running = False
