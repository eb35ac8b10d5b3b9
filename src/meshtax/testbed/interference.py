"""What else ran during a measurement window: other processes' CPU on the CPUs the testbed
uses, time the hypervisor stole, and how long the measured threads waited for a CPU.

A window is compared with a snapshot taken before it (:meth:`InterferenceMeter.snapshot`,
:meth:`Interference.between`). "Other" CPU is every busy tick of the testbed's CPUs (from
``/proc/stat``) minus the CPU of the processes that make the measurement: the sidecar, the app
and this process with its children (the load generator of each window is a child). Shares are
of the window's wall time times the number of CPUs watched: 0.1 means a tenth of those CPUs
went to someone else.

Host wake stalls (``stalls``, per second of the window): wake-ups of the measured threads that
took 130 µs or more from the wake to the epoll return, from the probe's per-event histograms
(:func:`host_stalls`). The guest's steal time does not see the host's other tenants on this
kind of VM (/proc/stat steal stays ≈ 0), but its halted vCPUs then wake late: nine stored quick
profiles (issue #14, sittings 10–14) fell into two regimes, 8–17 and 47–57 stalls a second (the
median over their sizes), and in the second the sidecar's slow (14–130 µs) wake-ups per crossing
rose about 2–3× and tcp Notification with them (4 KB: 2.2–3.1 µs a crossing in four of the five
quiet profiles, 5.0–8.6 in the busy ones). The rate is recorded per window; judged only when
``Thresholds.stalls`` is set.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from meshtax.testbed import procfs
from meshtax.testbed.probe_reading import ProbeReading

__all__ = [
    "Interference",
    "InterferenceMeter",
    "Meter",
    "MeterFactory",
    "Snapshot",
    "Thresholds",
    "host_stalls",
    "summarize",
]


@dataclass(frozen=True)
class Thresholds:
    """A window is contaminated above any of these shares (see the module docstring).

    ``wait`` (of the window, summed over the measured processes' threads; None: recorded,
    not judged): where the sidecar and its app share a CPU, as the profiler places them, a
    closed-loop window keeps each waiting for the other — 0.7 of every window on a quiet
    machine (suite run 5, 2026-11-26: others' CPU 0 %, wait 0.71), so a wait threshold of
    0.2 refused every window and forced half of them. Others' CPU and steal say directly
    whether something else ran; the wait stays in each window's record."""

    others: float = 0.10
    steal: float = 0.05
    wait: float | None = None
    stalls: float | None = None  # host wake stalls a second (None: recorded, not judged)

    def to_dict(self) -> dict[str, float | None]:
        return {
            "others": self.others,
            "steal": self.steal,
            "wait": self.wait,
            "stalls": self.stalls,
        }


@dataclass(frozen=True)
class Snapshot:
    t_ns: int
    cpus: Mapping[int, procfs.CpuTimes]
    ours_ns: int  # CPU of the measured processes, this process and its waited-for children
    wait_ns: int  # run-queue wait of the measured processes' threads


@dataclass(frozen=True)
class Interference:
    """One window's interference, as shares (see the module docstring)."""

    window_s: float
    others: float
    steal: float
    wait: float
    stalls: float = 0.0

    @classmethod
    def between(cls, a: Snapshot, b: Snapshot) -> Interference:
        wall = max(b.t_ns - a.t_ns, 1)
        cpus = [c for c in b.cpus if c in a.cpus]
        span = wall * max(len(cpus), 1)
        busy = sum((b.cpus[c] - a.cpus[c]).task_ns for c in cpus)
        steal = sum((b.cpus[c] - a.cpus[c]).steal_ns for c in cpus)
        others = max(busy - (b.ours_ns - a.ours_ns), 0)
        return cls(wall / 1e9, others / span, steal / span, (b.wait_ns - a.wait_ns) / wall)

    def contaminated(self, t: Thresholds) -> bool:
        return self.excess(t) > 1.0

    def excess(self, t: Thresholds) -> float:
        """How far past its thresholds this window was (≤ 1: within them): the largest of
        each share over its threshold."""
        return max(
            self.others / t.others,
            self.steal / t.steal,
            0.0 if t.wait is None else self.wait / t.wait,
            0.0 if t.stalls is None else self.stalls / t.stalls,
        )

    def worst(self, other: Interference) -> Interference:
        return Interference(
            self.window_s + other.window_s,
            max(self.others, other.others),
            max(self.steal, other.steal),
            max(self.wait, other.wait),
            max(self.stalls, other.stalls),
        )

    def to_dict(self) -> dict[str, float]:
        return {
            "window_s": self.window_s,
            "others": self.others,
            "steal": self.steal,
            "wait": self.wait,
            "stalls": self.stalls,
        }


class Meter(Protocol):
    def snapshot(self) -> Snapshot: ...


#: (CPUs the measurement uses, PIDs of the processes it measures) → a meter
MeterFactory = Callable[[Sequence[int], Sequence[int]], Meter]


def _self_cpu_ns() -> int:
    t = os.times()
    return round((t.user + t.system + t.children_user + t.children_system) * 1e9)


class InterferenceMeter:
    """Snapshots of the CPUs ``cpus`` and the processes ``pids`` (``proc``: the /proc root;
    ``own``: this process's CPU with its children, in ns — both injectable for tests)."""

    def __init__(
        self,
        cpus: Sequence[int],
        pids: Sequence[int],
        *,
        proc: Path = procfs.PROC,
        own: Callable[[], int] = _self_cpu_ns,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.cpus = tuple(cpus)
        self.pids = tuple(pids)
        self.proc = proc
        self.own = own
        self.clock = clock

    def snapshot(self) -> Snapshot:
        every = procfs.cpu_times(self.proc)
        cpus = {c: every[c] for c in (self.cpus or tuple(every)) if c in every}
        ours = self.own() + sum(procfs.cpu_ns(list(self.pids), self.proc).values())
        wait = 0
        for p in self.pids:
            try:
                wait += procfs.runqueue_wait_ns(p, self.proc)
            except procfs.ProcError:
                continue
        return Snapshot(self.clock(), cpus, ours, wait)


def summarize(windows: Sequence[Interference], rejected: int, forced: int = 0) -> dict[str, Any]:
    """The interference of a measurement, for its record: medians and maxima of the accepted
    windows, how many were rejected, and how many accepted pairs were beyond the thresholds
    (``forced``: kept because every pair was)."""
    if not windows:
        return {"windows": 0, "rejected": rejected, "forced": forced}

    def med(xs: list[float]) -> float:
        s = sorted(xs)
        n = len(s)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2

    out: dict[str, Any] = {"windows": len(windows), "rejected": rejected, "forced": forced}
    for k in ("others", "steal", "wait", "stalls"):
        vals = [getattr(w, k) for w in windows]
        out[f"{k}_median"] = med(vals)
        out[f"{k}_max"] = max(vals)
    return out


#: a wake-up this slow (wake → epoll return) is the host's, not the measured threads' work
HOST_STALL_NS = 130_000


def host_stalls(reading: ProbeReading) -> float:
    """Host wake stalls a second in a probe window: wake-ups of every probed thread that took
    :data:`HOST_STALL_NS` or longer (0 for a window of no duration or a loader with no
    per-event histogram)."""
    if reading.duration_ns <= 0:
        return 0.0
    n = sum(t.notify_hist.count_from(HOST_STALL_NS) for t in reading.threads)
    return n * 1e9 / reading.duration_ns
