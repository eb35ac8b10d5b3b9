"""Readings → per-message components (pure).

Units: µs per *crossing* — one message through one sidecar in one direction. A closed-loop
request and its response through the one sidecar of the testbed are two crossings, so
per-request totals are halved (:data:`CROSSINGS_PER_REQUEST`).

Latency (from one probe window on the sidecar's threads):

* Read, Notification: the probe's read-family wall time and wake-up→epoll-return time.
* IPC: the probe's loopback delivery time (``net_dev_queue`` → ``netif_receive_skb`` on lo).
* Write: write-family wall time *minus IPC*, because on loopback the receiver's RX path runs
  inside the sender's write (DESIGN.md: "Write … minus IPC").
* Only threads that read or wrote count (:func:`traffic_threads`).
* user: on-CPU time outside syscalls; kernel_other: wall time of the sidecar's remaining
  syscalls (not read/write/epoll). Both feed Other (TCP mode) and Parsing (HTTP/gRPC minus
  TCP at the same size) in :func:`assemble`.

CPU (from perf ``cpu-clock`` buckets of the sidecar process during a fixed-rate run): the
buckets map one to one (perf already charges the loopback RX path to ``ipc``, not ``write``);
``kernel_other`` is kernel time no symbol rule claims. The probe's own bucket is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from meshtax.model.components import IPC, NOTIFICATION, OTHER, PARSING, READ, WRITE, Component
from meshtax.model.sidecar import Mode
from meshtax.profile.probes import ProbeReading, ThreadReading

__all__ = [
    "CROSSINGS_PER_REQUEST",
    "Breakdown",
    "assemble",
    "cpu_breakdown",
    "latency_breakdown",
    "per_crossing",
    "traffic_threads",
]

CROSSINGS_PER_REQUEST = 2


def per_crossing(per_request: float) -> float:
    """A per-request quantity (request + response through one sidecar) per crossing."""
    return per_request / CROSSINGS_PER_REQUEST


@dataclass(frozen=True)
class Breakdown:
    """Raw per-crossing times (µs) before Other/Parsing are separated."""

    read: float = 0.0
    write: float = 0.0
    ipc: float = 0.0
    notification: float = 0.0
    user: float = 0.0
    kernel_other: float = 0.0

    @property
    def sidecar_work(self) -> float:
        """What Other + Parsing share: user time plus the uncategorised kernel time."""
        return self.user + self.kernel_other

    def total(self) -> float:
        return float(sum(getattr(self, f.name) for f in fields(self)))

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _crossings(requests: int) -> int:
    if requests <= 0:
        raise ValueError(f"need a positive request count, got {requests}")
    return CROSSINGS_PER_REQUEST * requests


def traffic_threads(reading: ProbeReading) -> ThreadReading:
    """Sum of the threads that read or wrote in the window (Envoy's workers).

    The others (main thread, flush and stats threads) sleep in futex/poll calls the whole
    window; their syscall wall time is not on any message's path.
    """
    busy = [t for t in reading.threads if t.read.count or t.write.count]
    if not busy:
        return reading.total
    out = busy[0]
    for t in busy[1:]:
        out = out + t
    return out


def latency_breakdown(reading: ProbeReading, requests: int) -> Breakdown:
    """Per-crossing on-path times (µs) from a probe window that saw ``requests`` requests."""
    n = _crossings(requests)
    t = traffic_threads(reading)
    us = 1e-3 / n  # ns total → µs per crossing
    ipc = reading.ipc.ns * us
    # syscalls outside the three families (timers, setsockopt …): sidecar work too; clamp
    # the small negative a window edge can give (a call entered before attach)
    rest = max(0, t.sys_ns - t.read.ns - t.write.ns - t.epoll.ns)
    return Breakdown(
        read=t.read.ns * us,
        write=max(0.0, t.write.ns * us - ipc),
        ipc=ipc,
        notification=t.notify.ns * us,
        user=t.user_ns * us,
        kernel_other=rest * us,
    )


def cpu_breakdown(buckets_ns: Mapping[str, int], requests: int) -> Breakdown:
    """Per-crossing CPU-µs from perf buckets (keys are :class:`~meshtax.profile.perfcpu.Bucket`
    values: user, read, write, notification, ipc, kernel_other; ``probe`` is ignored)."""
    n = _crossings(requests)
    us = 1e-3 / n

    def get(k: str) -> float:
        return float(buckets_ns.get(k, 0)) * us

    return Breakdown(
        read=get("read"),
        write=get("write"),
        ipc=get("ipc"),
        notification=get("notification"),
        user=get("user"),
        kernel_other=get("kernel_other"),
    )


def assemble(mode: Mode, bd: Breakdown, tcp_baseline: Breakdown | None) -> dict[Component, float]:
    """Components of one mode at one size.

    TCP: Other = sidecar work, Parsing = 0. HTTP/gRPC with a TCP baseline at the same size:
    Other = the baseline's sidecar work, Parsing = this mode's minus it (kept signed: a
    negative value is noise the caller should see, not hide). Without a baseline everything
    is Other and Parsing is 0.
    """
    out: dict[Component, float] = {
        IPC: bd.ipc,
        READ: bd.read,
        WRITE: bd.write,
        NOTIFICATION: bd.notification,
    }
    if mode is Mode.TCP or tcp_baseline is None:
        out[PARSING] = 0.0
        out[OTHER] = bd.sidecar_work
    else:
        out[OTHER] = tcp_baseline.sidecar_work
        out[PARSING] = bd.sidecar_work - tcp_baseline.sidecar_work
    return out
