"""What ``/proc`` says about processes: on-CPU time per thread, Envoy's worker threads,
resident memory. Every function takes the ``/proc`` root, so tests point it at a fake tree.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PROC",
    "CpuTimes",
    "cpu_times",
    "parse_cpu_times",
    "runqueue_wait_ns",
    "ProcError",
    "cpu_cap",
    "cpu_ns",
    "listening_ports",
    "parse_listening",
    "parse_schedstat",
    "parse_vmrss",
    "read_rss",
    "schedstat",
    "worker_cpu_ns",
]

PROC = Path("/proc")


class ProcError(RuntimeError):
    """A process is gone or ``/proc`` said something unparseable."""


def parse_schedstat(text: str) -> int:
    """First field of ``/proc/.../schedstat``: ns the task has run on a CPU."""
    try:
        return int(text.split()[0])
    except (IndexError, ValueError) as e:
        raise ProcError(f"unparseable schedstat: {text!r}") from e


def schedstat(pid: int, proc: Path = PROC) -> dict[int, int]:
    """On-CPU ns per thread of ``pid`` (threads that exit while reading are skipped)."""
    out: dict[int, int] = {}
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except FileNotFoundError as e:
        raise ProcError(f"no such process {pid}") from e
    for t in tasks:
        try:
            out[int(t.name)] = parse_schedstat((t / "schedstat").read_text())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out


def cpu_ns(pids: Sequence[int], proc: Path = PROC) -> dict[int, int]:
    """On-CPU ns of each of ``pids`` (all threads); a process that has exited counts 0."""
    out: dict[int, int] = {}
    for p in pids:
        try:
            out[p] = sum(schedstat(p, proc).values())
        except ProcError:
            out[p] = 0
    return out


def worker_cpu_ns(pid: int, proc: Path = PROC) -> int:
    """On-CPU ns of ``pid``'s Envoy worker threads (``wrk:worker_*``); all threads if none is
    named so (an Envoy under valgrind has renamed threads)."""
    total, seen, every = 0, False, 0
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except FileNotFoundError as e:
        raise ProcError(f"no such process {pid}") from e
    for t in tasks:
        try:
            comm = (t / "comm").read_text().strip()
            ns = parse_schedstat((t / "schedstat").read_text())
        except (FileNotFoundError, ProcessLookupError):
            continue
        every += ns
        if comm.startswith("wrk:worker"):
            total += ns
            seen = True
    return total if seen else every


def parse_vmrss(status: str) -> int:
    """Resident set size in bytes from the text of ``/proc/PID/status``."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            value, unit = line.split()[1:3]
            if unit != "kB":
                raise ProcError(f"unexpected VmRSS unit {unit!r}")
            return int(value) * 1024
    raise ProcError("no VmRSS line (a kernel thread or a zombie?)")


def read_rss(pid: int, proc: Path = PROC) -> int:
    try:
        return parse_vmrss((proc / str(pid) / "status").read_text())
    except FileNotFoundError as e:
        raise ProcError(f"no such process {pid}") from e


def parse_listening(text: str) -> set[int]:
    """Local ports in state LISTEN (``0A``) of a ``/proc/PID/net/tcp`` table."""
    out: set[int] = set()
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) > 3 and f[3] == "0A" and ":" in f[1]:
            out.add(int(f[1].rsplit(":", 1)[1], 16))
    return out


def listening_ports(pid: int, proc: Path = PROC) -> set[int]:
    """TCP ports listening in ``pid``'s network namespace (IPv4 and IPv6)."""
    out: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            out |= parse_listening((proc / str(pid) / "net" / table).read_text())
        except FileNotFoundError:
            continue
    return out


#: /proc/stat counts in clock ticks (USER_HZ); 100 on Linux everywhere that matters
TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuTimes:
    """One CPU's cumulative time from ``/proc/stat`` (ns): in tasks (user, nice, system), in
    interrupts (irq, softirq: accounted to no task), stolen by the hypervisor, and idle
    (idle, iowait)."""

    task_ns: int
    irq_ns: int
    steal_ns: int
    idle_ns: int

    def __sub__(self, other: CpuTimes) -> CpuTimes:
        return CpuTimes(
            self.task_ns - other.task_ns,
            self.irq_ns - other.irq_ns,
            self.steal_ns - other.steal_ns,
            self.idle_ns - other.idle_ns,
        )

    @property
    def total_ns(self) -> int:
        return self.task_ns + self.irq_ns + self.steal_ns + self.idle_ns


def parse_cpu_times(text: str) -> dict[int, CpuTimes]:
    """Per-CPU times from the text of ``/proc/stat`` (the aggregate ``cpu`` line skipped)."""
    out: dict[int, CpuTimes] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        try:
            v = [int(x) for x in fields[:8]] + [0] * (8 - len(fields[:8]))
            cpu = int(name[3:])
        except ValueError as e:
            raise ProcError(f"unparseable /proc/stat line {line!r}") from e
        user, nice, system, idle, iowait, irq, softirq, steal = v
        out[cpu] = CpuTimes(
            (user + nice + system) * TICK_NS,
            (irq + softirq) * TICK_NS,
            steal * TICK_NS,
            (idle + iowait) * TICK_NS,
        )
    if not out:
        raise ProcError("no per-CPU lines in /proc/stat")
    return out


def cpu_times(proc: Path = PROC) -> dict[int, CpuTimes]:
    return parse_cpu_times((proc / "stat").read_text())


def runqueue_wait_ns(pid: int, proc: Path = PROC) -> int:
    """Time ``pid``'s threads spent runnable but waiting for a CPU (schedstat's second field)."""
    total = 0
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except FileNotFoundError as e:
        raise ProcError(f"no such process {pid}") from e
    for t in tasks:
        try:
            fields = (t / "schedstat").read_text().split()
            total += int(fields[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
    return total


CGROUP = Path("/sys/fs/cgroup")


def cpu_cap(
    pid: int | str = "self", proc: Path = PROC, cgroup: Path = CGROUP
) -> tuple[str, float] | None:
    """``(cgroup, CPUs)`` when ``pid``'s CPU cgroup (v1 ``cpu`` controller or v2 ``cpu.max``)
    has a bandwidth quota — its processes then run at most that many CPUs' worth per period
    and wait for the next period when it is spent (a whole period, 100 ms by default) — else
    None. Only the process's own cgroup is read, not its ancestors'."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError as e:
        raise ProcError(f"process {pid}: {e}") from e
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        rel = path.lstrip("/")
        try:
            if "cpu" in ctrls.split(","):
                d = cgroup / "cpu" / rel
                quota = int((d / "cpu.cfs_quota_us").read_text())
                period = int((d / "cpu.cfs_period_us").read_text())
            elif ctrls == "":
                quota_s, _, period_s = (cgroup / rel / "cpu.max").read_text().partition(" ")
                if quota_s.strip() == "max":
                    continue
                quota, period = int(quota_s), int(period_s)
            else:
                continue
        except (OSError, ValueError):
            continue
        if quota > 0 and period > 0:
            return path, quota / period
    return None
