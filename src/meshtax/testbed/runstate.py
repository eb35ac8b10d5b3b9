"""Run registry, exclusive lock and reaper for profiling runs.

Every network namespace, scratch directory and process a run creates is written to a state
file under ``/run/meshtax/`` *before* (namespaces, directories) or right after (processes) it
exists, so a run that
dies — exception, Ctrl-C, SIGTERM or SIGKILL — leaves a record the next run can clean up.
Processes are recorded with their ``/proc`` start time and are only ever signalled through a
pidfd after the start time was checked, so a reused PID is never killed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import select
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from meshtax.testbed.system import System

STATE_DIR = Path("/run/meshtax")
# every run's state, whatever its own state dir: no reaper deletes another live run's namespaces
INDEX_DIR = STATE_DIR / "index"
LOCK_NAME = "profile.lock"
NETNS_PREFIX = "mtx-"
STATE_VERSION = 1
#: every process a run spawns carries ``MESHTAX_RUN=<run id>`` in its environment, so one that
#: was started but not yet recorded when the run was killed is still found by the reaper
RUN_ENV = "MESHTAX_RUN"
#: scratch directories are named ``meshtax-<what>.<owner pid>.<owner start time>.<random>``:
#: the reaper removes those whose owner is dead, recorded or not
TMP_PREFIX = "meshtax-"
_OWNED = re.compile(r"^meshtax-[A-Za-z0-9_-]*\.(\d+)\.(\d+)\.")


class RunBusy(RuntimeError):
    """Another profiling run holds the lock."""

    def __init__(self, lock_path: Path, holder_pid: int | None, holder_cmd: str) -> None:
        self.lock_path = lock_path
        self.holder_pid = holder_pid
        who = f"PID {holder_pid}" if holder_pid is not None else "an unknown process"
        if holder_cmd:
            who += f" ({holder_cmd})"
        super().__init__(
            f"another meshtax profiling run holds {lock_path}: {who}; "
            "wait for it to finish or stop it, then retry"
        )


# --- processes -------------------------------------------------------------------------------


class ProcOps(Protocol):
    """How the registry looks at and ends processes (real: /proc + pidfd; fake in tests)."""

    def start_time(self, pid: int) -> int | None:
        """Start time of ``pid`` in clock ticks since boot, or None if it does not exist."""
        ...

    def terminate(
        self, pid: int, start_time: int, *, netns: str | None = None, timeout: float = 2.0
    ) -> bool:
        """End ``pid`` (and its process group if it leads one) if it still started at
        ``start_time`` (and, with ``netns``, is still in that named namespace). SIGTERM, then
        SIGKILL after ``timeout``. Returns True if a signal was sent."""
        ...

    def tagged(self, run_id: str) -> list[int]:
        """PIDs whose environment holds ``MESHTAX_RUN=<run_id>``."""
        ...


def parse_stat_start_time(stat: str) -> int:
    """Field 22 (starttime) of a ``/proc/<pid>/stat`` line; comm may contain spaces/parens."""
    rest = stat[stat.rindex(")") + 2 :].split()
    return int(rest[19])  # rest[0] is field 3 (state)


class RealProcOps:
    """Looks at /proc and signals through pidfds, so a PID reused after a check is never hit."""

    def start_time(self, pid: int) -> int | None:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return parse_stat_start_time(f.read())
        except (OSError, ValueError, IndexError):
            return None

    def tagged(self, run_id: str) -> list[int]:
        want = f"{RUN_ENV}={run_id}".encode()
        out: list[int] = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                env = (d / "environ").read_bytes()
            except OSError:
                continue
            if want in env.split(b"\0"):
                out.append(int(d.name))
        return out

    def _same_netns(self, pid: int, netns: str) -> bool:
        try:
            a = os.stat(f"/proc/{pid}/ns/net")
            b = os.stat(f"/run/netns/{netns}")
        except OSError:
            return False
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)

    def terminate(
        self, pid: int, start_time: int, *, netns: str | None = None, timeout: float = 2.0
    ) -> bool:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return False  # gone already
        try:
            # The pidfd pins the identity: checks read /proc/<pid> and are only trusted if the
            # pidfd's process is still alive afterwards (then /proc/<pid> was that process).
            if self.start_time(pid) != start_time:
                return False
            if netns is not None and not self._same_netns(pid, netns):
                return False
            try:
                signal.pidfd_send_signal(fd, 0)
            except OSError:
                return False
            group = _pgid(pid) == pid
            self._send(fd, pid, signal.SIGTERM, group)
            if not _wait_pidfd(fd, timeout):
                self._send(fd, pid, signal.SIGKILL, group)
                _wait_pidfd(fd, timeout)
            return True
        finally:
            os.close(fd)

    @staticmethod
    def _send(fd: int, pid: int, sig: int, group: bool) -> None:
        try:
            signal.pidfd_send_signal(fd, sig)
            if group:  # helpers it started (ip netns exec → setpriv → app share the group)
                os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _wait_pidfd(fd: int, timeout: float) -> bool:
    """True once the process behind ``fd`` has exited (zombies count: we may not be parent)."""
    r, _, _ = select.select([fd], [], [], timeout)
    return bool(r)


# --- state file ------------------------------------------------------------------------------


@dataclass
class ProcRecord:
    pid: int
    start_time: int | None
    argv: list[str]
    netns: str | None = None


@dataclass
class RunState:
    """What one run owns. Saved as JSON at ``<state_dir>/<run_id>.json``."""

    run_id: str
    owner_pid: int
    owner_start: int | None
    netns: list[str] = field(default_factory=list)
    processes: list[ProcRecord] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    dirs: list[str] = field(default_factory=list)  # scratch directories (configs, logs)
    version: int = STATE_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @staticmethod
    def from_json(text: str) -> RunState:
        d = json.loads(text)
        return RunState(
            run_id=str(d["run_id"]),
            owner_pid=int(d["owner_pid"]),
            owner_start=d.get("owner_start"),
            netns=[str(n) for n in d.get("netns", [])],
            processes=[
                ProcRecord(int(p["pid"]), p.get("start_time"), list(p["argv"]), p.get("netns"))
                for p in d.get("processes", [])
            ],
            created=float(d.get("created", 0.0)),
            version=int(d.get("version", STATE_VERSION)),
            dirs=[str(x) for x in d.get("dirs", [])],
        )


class Registry:
    """The state file of the current run; every change is written through atomically.

    A copy goes to the machine-wide :data:`INDEX_DIR` (best effort), so a reaper working on
    another state dir still sees this run's namespaces as live.
    """

    def __init__(self, state_dir: Path, state: RunState, index_dir: Path | None = None) -> None:
        self.state_dir = state_dir
        self.state = state
        self.path = state_dir / f"{state.run_id}.json"
        index = INDEX_DIR if index_dir is None else index_dir
        self.index_path = None if index == state_dir else index / f"{state.run_id}.json"

    def save(self) -> None:
        for path in (self.path, self.index_path):
            if path is None:
                continue
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                tmp.write_text(self.state.to_json())
                os.replace(tmp, path)
            except OSError:
                if path == self.path:
                    raise  # the run's own state file is not optional; the index copy is

    def add_netns(self, name: str) -> None:
        self.state.netns.append(name)
        self.save()

    def add_process(self, rec: ProcRecord) -> None:
        self.state.processes.append(rec)
        self.save()

    def add_dir(self, path: Path) -> None:
        self.state.dirs.append(str(path))
        self.save()

    def remove(self) -> None:
        for path in (self.path, self.index_path):
            if path is not None:
                try:
                    path.unlink()
                except OSError:
                    pass


def load_states(state_dir: Path) -> list[tuple[Path, RunState | None]]:
    """All state files; an unreadable one maps to None (it is removed by the reaper)."""
    out: list[tuple[Path, RunState | None]] = []
    if not state_dir.is_dir():
        return out
    for p in sorted(state_dir.glob("*.json")):
        try:
            out.append((p, RunState.from_json(p.read_text())))
        except (OSError, ValueError, KeyError, TypeError):
            out.append((p, None))
    return out


# --- lock ------------------------------------------------------------------------------------


class RunLock:
    """Exclusive ``flock`` on ``<state_dir>/profile.lock``; the file holds the holder's PID.

    The fd is close-on-exec, so processes a run spawns never inherit (and keep) the lock.
    """

    def __init__(self, state_dir: Path = STATE_DIR) -> None:
        self.path = state_dir / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float = 0.0) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
                if time.monotonic() >= deadline:
                    holder = _read_holder(fd)
                    os.close(fd)
                    raise RunBusy(self.path, holder, _cmdline(holder)) from None
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing drops the flock


def _read_holder(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 64, 0).decode().strip())
    except (OSError, ValueError):
        return None


def _cmdline(pid: int | None) -> str:
    if pid is None:
        return ""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return " ".join(a.decode(errors="replace") for a in f.read().split(b"\0") if a)[:120]
    except OSError:
        return ""


# --- reaper ----------------------------------------------------------------------------------


def list_netns(system: System) -> list[str]:
    """Names from ``ip netns list`` (lines look like ``name`` or ``name (id: 3)``)."""
    out = system.run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_pids(system: System, name: str) -> list[int]:
    done = system.run(["ip", "netns", "pids", name], check=False)
    return [int(t) for t in done.stdout.split() if t.isdigit()]


def delete_netns(system: System, procs: ProcOps, name: str, timeout: float = 2.0) -> list[int]:
    """End every process inside ``name`` (checked to still be there), then delete it.
    Returns the PIDs that were signalled."""
    hit: list[int] = []
    for pid in netns_pids(system, name):
        start = procs.start_time(pid)
        if start is not None and procs.terminate(pid, start, netns=name, timeout=timeout):
            hit.append(pid)
    system.run(["ip", "netns", "del", name], check=False)
    return hit


def stop_records(procs: ProcOps, records: Iterable[ProcRecord], timeout: float = 2.0) -> None:
    """End recorded processes, newest first, only where the start time still matches."""
    for rec in reversed(list(records)):
        if rec.start_time is not None:
            procs.terminate(rec.pid, rec.start_time, timeout=timeout)


@dataclass
class ReapReport:
    """What a reap removed: stale run ids, namespaces, scratch directories, and processes signalled."""

    runs: list[str] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.runs or self.netns or self.processes or self.dirs)


def owner_alive(procs: ProcOps, st: RunState) -> bool:
    return st.owner_start is not None and procs.start_time(st.owner_pid) == st.owner_start


def reap(
    system: System,
    procs: ProcOps,
    state_dir: Path = STATE_DIR,
    *,
    keep_runs: Sequence[str] = (),
    timeout: float = 2.0,
    index_dir: Path | None = None,
    tmp_dir: Path | None = None,
) -> ReapReport:
    """Remove leftovers of dead runs: their recorded processes, namespaces and scratch
    directories, their state files, and any ``mtx-*`` namespace no live run owns — live in this state dir or in the
    machine-wide index (runs of other state dirs). Call it holding the lock."""
    report = ReapReport()
    index = INDEX_DIR if index_dir is None else index_dir
    # live runs registered elsewhere keep their namespaces (never unlinked here: with fake
    # process ops every owner looks dead)
    live_netns: set[str] = (
        {
            ns
            for _, st in load_states(index)
            if st is not None and owner_alive(procs, st)
            for ns in st.netns
        }
        if index != state_dir
        else set()
    )
    for path, st in load_states(state_dir):
        if st is not None and (st.run_id in keep_runs or owner_alive(procs, st)):
            live_netns.update(st.netns)
            continue
        if st is not None:
            for rec in reversed(st.processes):
                if rec.start_time is not None and procs.terminate(
                    rec.pid, rec.start_time, timeout=timeout
                ):
                    report.processes.append(rec.pid)
            # started but killed before it was recorded: found by its environment tag
            for pid in procs.tagged(st.run_id):
                start = procs.start_time(pid)
                if start is not None and procs.terminate(pid, start, timeout=timeout):
                    report.processes.append(pid)
            for ns in reversed(st.netns):
                report.processes += delete_netns(system, procs, ns, timeout)
                report.netns.append(ns)
            for d in st.dirs:
                shutil.rmtree(d, ignore_errors=True)
                report.dirs.append(d)
            report.runs.append(st.run_id)
            if index != state_dir:
                (index / path.name).unlink(missing_ok=True)
        path.unlink(missing_ok=True)
    for ns in list_netns(system):
        if ns.startswith(NETNS_PREFIX) and ns not in live_netns and ns not in report.netns:
            report.processes += delete_netns(system, procs, ns, timeout)
            report.netns.append(ns)
    # the real /tmp is judged by the real /proc, whatever process ops a caller injects
    report.dirs += reap_tempdirs(RealProcOps() if tmp_dir is None else procs, tmp_dir)
    return report


def owned_tempdir(what: str, procs: ProcOps | None = None, tmp_dir: Path | None = None) -> Path:
    """A new scratch directory named after its owner (this process and its start time), so
    the reaper removes it once the owner is dead, even if nothing recorded it."""
    if not re.fullmatch(r"[A-Za-z0-9_-]*", what):
        raise ValueError(f"scratch directory label {what!r}: use [A-Za-z0-9_-]")
    me = os.getpid()
    start = (procs or RealProcOps()).start_time(me)
    return Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{what}.{me}.{start or 0}.", dir=tmp_dir))


def reap_tempdirs(procs: ProcOps, tmp_dir: Path | None = None) -> list[str]:
    """Remove :func:`owned_tempdir` directories whose owner is dead; returns their paths."""
    root = tmp_dir or Path(tempfile.gettempdir())
    gone: list[str] = []
    for d in root.glob(f"{TMP_PREFIX}*"):
        m = _OWNED.match(d.name)
        if m is None or not d.is_dir():
            continue
        pid, start = int(m.group(1)), int(m.group(2))
        if procs.start_time(pid) != start:
            shutil.rmtree(d, ignore_errors=True)
            gone.append(str(d))
    return gone


def cleanup_stale(
    system: System,
    procs: ProcOps | None = None,
    state_dir: Path = STATE_DIR,
    *,
    lock_timeout: float = 0.0,
) -> ReapReport:
    """Take the run lock, remove leftovers of dead runs, release the lock (for a CLI
    ``cleanup`` command; a Testbed does the same on open). Raises RunBusy if a run is live."""
    lock = RunLock(state_dir)
    lock.acquire(lock_timeout)
    try:
        return reap(system, procs or RealProcOps(), state_dir)
    finally:
        lock.release()


@dataclass
class FakeProcOps:
    """ProcOps over a table pid → start time (``default``: the start time of a PID not in the
    table, e.g. ``lambda pid: pid * 10``; None: absent). ``terminate`` honours the start-time
    (and, through ``netns_of``, the namespace) check and records what it ended; ``tags``
    answers :meth:`tagged`."""

    table: dict[int, int] = field(default_factory=dict)
    netns_of: dict[int, str] | None = None
    tags: dict[str, list[int]] = field(default_factory=dict)
    default: Callable[[int], int | None] | None = None
    terminated: list[int] = field(default_factory=list)

    def start_time(self, pid: int) -> int | None:
        if pid in self.table:
            return self.table[pid]
        return self.default(pid) if self.default is not None else None

    def terminate(
        self, pid: int, start_time: int, *, netns: str | None = None, timeout: float = 2.0
    ) -> bool:
        if self.start_time(pid) != start_time:
            return False
        if netns is not None and self.netns_of is not None and self.netns_of.get(pid) != netns:
            return False
        self.terminated.append(pid)
        self.table[pid] = -1  # gone: the start time no longer matches
        return True

    def tagged(self, run_id: str) -> list[int]:
        return list(self.tags.get(run_id, []))
