"""CPU attribution by sampling: ``perf record -e cpu-clock`` → samples per process and component.

Per-task perf events do not count on this platform (``perf record -p`` writes no samples),
so recording is system-wide (``-a``) and samples are filtered by PID when parsed.

Each sample's call chain is walked from the leaf: a user-space leaf is ``user``; in the
kernel, the first frame found in :data:`SYMBOL_TABLE` decides the bucket, so the loopback RX
path that runs inside a ``sendto`` is ``ipc``, not ``write``. A kernel sample no frame matches
is ``kernel_other``. The table is pure data; :func:`classify_stack` is a pure function.

:func:`~meshtax.testbed.procfs.schedstat` is the cross-check of both the probe's and perf's
totals.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO

from meshtax.testbed.system import Placement, Process, RealSystem, System

__all__ = [
    "Bucket",
    "Frame",
    "PerfError",
    "PerfProfile",
    "PerfSession",
    "Sample",
    "SYMBOL_TABLE",
    "attribute",
    "classify_stack",
    "classify_symbol",
    "parse_perf_script",
    "record_argv",
    "script_argv",
]


class PerfError(RuntimeError):
    """perf failed, or its output could not be parsed."""


class Bucket(str, Enum):
    """Where a CPU sample goes. Values match component keys where one exists."""

    USER = "user"
    READ = "read"
    WRITE = "write"
    NOTIFICATION = "notification"
    IPC = "ipc"
    PROBE = "probe"  # our own BPF programs: overhead of measuring, reported apart
    KERNEL_OTHER = "kernel_other"


# (symbol, bucket). A trailing "*" makes it a prefix. Order does not matter: the leaf-most
# matching frame wins. Loopback xmit/RX and the TCP/IP receive path are IPC; socket wake-ups
# (sock_def_readable → ep_poll_callback) are notification even when they run inside RX.
SYMBOL_TABLE: tuple[tuple[str, Bucket], ...] = (
    # our probe
    ("bpf_prog_*", Bucket.PROBE),
    # notification: epoll wait side and the wake-up side
    ("ep_poll", Bucket.NOTIFICATION),
    ("do_epoll_wait", Bucket.NOTIFICATION),
    ("do_epoll_pwait", Bucket.NOTIFICATION),
    ("__x64_sys_epoll_wait", Bucket.NOTIFICATION),
    ("__x64_sys_epoll_pwait", Bucket.NOTIFICATION),
    ("__x64_sys_epoll_pwait2", Bucket.NOTIFICATION),
    ("ep_send_events", Bucket.NOTIFICATION),
    ("ep_poll_callback", Bucket.NOTIFICATION),
    ("sock_def_readable", Bucket.NOTIFICATION),
    ("sk_stream_write_space", Bucket.NOTIFICATION),
    # ipc: loopback device and the RX path up to the socket
    ("__dev_queue_xmit", Bucket.IPC),
    ("dev_hard_start_xmit", Bucket.IPC),
    ("loopback_xmit", Bucket.IPC),
    ("__netif_rx", Bucket.IPC),
    ("netif_rx_internal", Bucket.IPC),
    ("enqueue_to_backlog", Bucket.IPC),
    ("net_rx_action", Bucket.IPC),
    ("__napi_poll", Bucket.IPC),
    ("process_backlog", Bucket.IPC),
    ("__netif_receive_skb*", Bucket.IPC),
    ("netif_receive_skb", Bucket.IPC),
    ("ip_rcv", Bucket.IPC),
    ("ip_rcv_finish", Bucket.IPC),
    ("ip_rcv_core", Bucket.IPC),
    ("ip_local_deliver", Bucket.IPC),
    ("ip_local_deliver_finish", Bucket.IPC),
    ("ip_protocol_deliver_rcu", Bucket.IPC),
    ("ipv6_rcv", Bucket.IPC),
    ("ip6_input_finish", Bucket.IPC),
    ("tcp_v4_rcv", Bucket.IPC),
    ("tcp_v6_rcv", Bucket.IPC),
    ("tcp_v4_do_rcv", Bucket.IPC),
    ("tcp_rcv_established", Bucket.IPC),
    # write family
    ("tcp_sendmsg", Bucket.WRITE),
    ("tcp_sendmsg_locked", Bucket.WRITE),
    ("unix_stream_sendmsg", Bucket.WRITE),
    ("sock_sendmsg", Bucket.WRITE),
    ("__sock_sendmsg", Bucket.WRITE),
    ("sock_write_iter", Bucket.WRITE),
    ("__sys_sendto", Bucket.WRITE),
    ("__sys_sendmsg", Bucket.WRITE),
    ("__sys_sendmmsg", Bucket.WRITE),
    ("__x64_sys_sendto", Bucket.WRITE),
    ("__x64_sys_sendmsg", Bucket.WRITE),
    ("__x64_sys_sendmmsg", Bucket.WRITE),
    ("ksys_write", Bucket.WRITE),
    ("vfs_write", Bucket.WRITE),
    ("do_writev", Bucket.WRITE),
    ("__x64_sys_write", Bucket.WRITE),
    ("__x64_sys_writev", Bucket.WRITE),
    # read family
    ("tcp_recvmsg", Bucket.READ),
    ("tcp_recvmsg_locked", Bucket.READ),
    ("unix_stream_recvmsg", Bucket.READ),
    ("sock_recvmsg", Bucket.READ),
    ("sock_read_iter", Bucket.READ),
    ("__sys_recvfrom", Bucket.READ),
    ("__sys_recvmsg", Bucket.READ),
    ("__sys_recvmmsg", Bucket.READ),
    ("__x64_sys_recvfrom", Bucket.READ),
    ("__x64_sys_recvmsg", Bucket.READ),
    ("__x64_sys_recvmmsg", Bucket.READ),
    ("ksys_read", Bucket.READ),
    ("vfs_read", Bucket.READ),
    ("do_readv", Bucket.READ),
    ("__x64_sys_read", Bucket.READ),
    ("__x64_sys_readv", Bucket.READ),
)

_EXACT: dict[str, Bucket] = {s: b for s, b in SYMBOL_TABLE if not s.endswith("*")}
_PREFIX: tuple[tuple[str, Bucket], ...] = tuple(
    (s[:-1], b) for s, b in SYMBOL_TABLE if s.endswith("*")
)
# compiler-made clones: tcp_sendmsg.cold, ep_poll.isra.0, finish_task_switch.constprop.0
_CLONE_SUFFIX = re.compile(r"\.(?:cold|isra|constprop|part|lto_priv)(?:\.\d+)*.*$")
_KERNEL_BASE = 0xFFFF800000000000


def classify_symbol(sym: str) -> Bucket | None:
    """The bucket of one kernel symbol (``+0x..`` offsets and clone suffixes ignored)."""
    name = _CLONE_SUFFIX.sub("", sym.split("+", 1)[0])
    hit = _EXACT.get(name)
    if hit is not None:
        return hit
    for prefix, bucket in _PREFIX:
        if name.startswith(prefix):
            return bucket
    return None


@dataclass(frozen=True)
class Frame:
    ip: int
    sym: str
    dso: str

    @property
    def kernel(self) -> bool:
        return self.ip >= _KERNEL_BASE or self.dso == "[kernel.kallsyms]"


def classify_stack(frames: Sequence[Frame]) -> Bucket:
    """Bucket of one sample; ``frames`` leaf first."""
    if not frames or not frames[0].kernel:
        return Bucket.USER
    for f in frames:
        if not f.kernel:
            break
        hit = classify_symbol(f.sym)
        if hit is not None:
            return hit
    return Bucket.KERNEL_OTHER


@dataclass(frozen=True)
class Sample:
    comm: str
    pid: int
    tid: int
    period: int  # ns for cpu-clock
    frames: tuple[Frame, ...]


_HEADER = re.compile(
    r"^\s*(?P<comm>\S.*?)\s+(?P<pid>-?\d+)/(?P<tid>-?\d+)\s+(?P<period>\d+)"
    r"(?:\s+(?P<ip>[0-9a-f]+)\s+(?P<sym>.+?)\s+\((?P<dso>[^)]*)\))?\s*$"
)
_FRAME = re.compile(r"^\s+(?P<ip>[0-9a-f]+)\s+(?P<sym>.+?)\s+\((?P<dso>.*)\)\s*$")


def parse_perf_script(lines: Iterable[str]) -> Iterator[Sample]:
    """Samples from ``perf script -F comm,pid,tid,period,ip,sym,dso`` (with or without -g).

    With call chains, a header line is followed by tab-indented frames and a blank line;
    without, the one frame is on the header line.
    """
    head: re.Match[str] | None = None
    frames: list[Frame] = []

    def flush() -> Iterator[Sample]:
        if head is not None:
            yield Sample(
                head["comm"],
                int(head["pid"]),
                int(head["tid"]),
                int(head["period"]),
                tuple(frames),
            )

    for raw in lines:
        line = raw.rstrip("\n")
        if not line.strip():
            yield from flush()
            head, frames = None, []
            continue
        if line.startswith("\t"):
            m = _FRAME.match(line)
            if m is None or head is None:
                raise PerfError(f"unexpected perf script line: {line!r}")
            frames.append(Frame(int(m["ip"], 16), m["sym"], m["dso"]))
            continue
        yield from flush()
        head = _HEADER.match(line)
        if head is None:
            raise PerfError(f"unexpected perf script line: {line!r}")
        frames = []
        if head["ip"] is not None:
            frames.append(Frame(int(head["ip"], 16), head["sym"], head["dso"]))
    yield from flush()


@dataclass(frozen=True)
class PerfProfile:
    """Sampled CPU time (ns) by (pid, bucket) and by (pid, tid); samples counted too."""

    freq: int
    duration_s: float
    ns: Mapping[tuple[int, Bucket], int]
    samples: Mapping[tuple[int, Bucket], int]
    by_thread_ns: Mapping[tuple[int, int], int]
    comms: Mapping[int, str]

    def process(self, pid: int) -> dict[Bucket, int]:
        """ns per bucket of one process (every bucket present, zeros included)."""
        return {b: self.ns.get((pid, b), 0) for b in Bucket}

    def total(self, pids: Iterable[int] | None = None) -> dict[Bucket, int]:
        keep = None if pids is None else set(pids)
        out = {b: 0 for b in Bucket}
        for (pid, b), v in self.ns.items():
            if keep is None or pid in keep:
                out[b] += v
        return out


def attribute(
    samples: Iterable[Sample], pids: Iterable[int] | None, freq: int, duration_s: float
) -> PerfProfile:
    """Aggregate samples of ``pids`` (all when None) into a :class:`PerfProfile`."""
    keep = None if pids is None else set(pids)
    ns: Counter[tuple[int, Bucket]] = Counter()
    n: Counter[tuple[int, Bucket]] = Counter()
    by_thread: Counter[tuple[int, int]] = Counter()
    comms: dict[int, str] = {}
    for s in samples:
        if keep is not None and s.pid not in keep:
            continue
        b = classify_stack(s.frames)
        ns[(s.pid, b)] += s.period
        n[(s.pid, b)] += 1
        by_thread[(s.pid, s.tid)] += s.period
        comms.setdefault(s.pid, s.comm)
    return PerfProfile(freq, duration_s, dict(ns), dict(n), dict(by_thread), comms)


def record_argv(output: Path, freq: int = 999, callgraph: bool = True) -> list[str]:
    """``perf record`` system-wide on cpu-clock until SIGINT."""
    argv = ["perf", "record", "-e", "cpu-clock", "-F", str(int(freq)), "-a", "-q"]
    return argv + (["-g"] if callgraph else []) + ["-o", str(output)]


def script_argv(data: Path) -> list[str]:
    return ["perf", "script", "-i", str(data), "-F", "comm,pid,tid,period,ip,sym,dso"]


@dataclass
class PerfSession:
    """``start`` perf record, ``stop(pids)`` → :class:`PerfProfile` of those processes."""

    system: System = field(default_factory=RealSystem)
    freq: int = 999
    callgraph: bool = True
    stop_timeout: float = 30.0
    _proc: Process | None = field(default=None, init=False, repr=False)
    _dir: Path | None = field(default=None, init=False, repr=False)
    _log: IO[bytes] | None = field(default=None, init=False, repr=False)
    _t0: float = field(default=0.0, init=False, repr=False)

    def start(self) -> None:
        if self._proc is not None:
            raise PerfError("perf already recording")
        self._dir = Path(tempfile.mkdtemp(prefix="meshtax-perf-"))
        self._log = open(self._dir / "record.log", "wb")  # noqa: SIM115 - closed in close()
        argv = record_argv(self._dir / "perf.data", self.freq, self.callgraph)
        self._proc = self.system.spawn(argv, place=Placement(), stderr=self._log)
        self._t0 = time.monotonic()

    def stop(self, pids: Iterable[int] | None) -> PerfProfile:
        proc, d = self._proc, self._dir
        if proc is None or d is None:
            raise PerfError("perf not recording")
        try:
            # perf writes its data file on SIGINT
            self.system.run(["kill", "-s", "INT", str(proc.pid)], check=False)
            duration = time.monotonic() - self._t0
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired as e:
                raise PerfError(
                    f"perf record did not exit {self.stop_timeout:.0f} s after SIGINT"
                ) from e
            out = self.system.run(script_argv(d / "perf.data"), timeout=300.0)
            samples = parse_perf_script(out.stdout.splitlines())
            return attribute(samples, pids, self.freq, duration)
        finally:
            self.close()

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stop()
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
