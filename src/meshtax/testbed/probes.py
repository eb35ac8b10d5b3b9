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

import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol, runtime_checkable

from meshtax.testbed.probe_reading import (
    FORMAT_VERSION,
    Histogram,
    IpcStat,
    OpStat,
    ProbeError,
    ProbeReading,
    ProgramStat,
    ThreadReading,
    parse_reading,
)
from meshtax.testbed.runstate import owned_tempdir
from meshtax.testbed.system import Placement, Process, System
from meshtax.testbed.tools import tool

__all__ = [
    "FORMAT_VERSION",
    "READY_MARK",
    "FakeProbe",
    "Histogram",
    "IpcStat",
    "OpStat",
    "ProbeError",
    "ProbeReading",
    "ProbeSession",
    "ProgramStat",
    "RealProbe",
    "SnapshotSession",
    "ThreadReading",
    "parse_reading",
    "realtime",
]

READY_MARK = "sidecar: ready"


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


@dataclass
class RealProbe:
    """Runs ``sidecar -p PIDS`` as root; ``stop`` sends SIGINT and parses its JSON.

    ``all_netns`` times loopback skbs of every namespace instead of the first PID's;
    ``run_stats`` turns on kernel BPF run-time stats (``ProgramStat.run_time_ns``), which adds
    two clock reads per event.
    """

    system: System
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
        binary = self.binary or tool("probe")
        out = [str(binary), "-p", ",".join(str(int(p)) for p in pids)]
        if follow_netns:
            out += ["-f", follow_netns]
        return out + (["-a"] if self.all_netns else []) + (["-s"] if self.run_stats else [])

    def start(self, pids: Sequence[int], *, follow_netns: str | None = None) -> None:
        if self._proc is not None:
            raise ProbeError("probe already running")
        argv = self.argv(pids, follow_netns)
        self._dir = owned_tempdir("probe")
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
