"""The one door to the operating system for the profiler.

Everything in ``meshtax.profile`` that runs a command or starts a process goes through a
:class:`System`. :class:`RealSystem` does it for real; :class:`FakeSystem` records what would
have happened and replays scripted results, so orchestration logic is tested without root.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Protocol


class CommandError(RuntimeError):
    """A command exited non-zero; carries what it printed so the user sees why."""

    def __init__(self, argv: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        tail = (stderr or stdout).strip().splitlines()[-5:]
        super().__init__(f"`{' '.join(self.argv)}` exited {returncode}: " + " | ".join(tail))


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Placement:
    """Where a process runs: network namespace, CPUs it is pinned to, user it runs as, and
    the cgroup-v2 directory it starts in (its sockets belong to that cgroup from the first)."""

    netns: str | None = None
    cpus: tuple[int, ...] | None = None
    uid: int | None = None
    gid: int | None = None
    cgroup: str | None = None

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """The argv that places ``argv`` (cgroup → ip netns exec → taskset → setpriv; every
        step execs the next, so the PID is the program's)."""
        out: list[str] = []
        if self.cgroup:
            out += ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', self.cgroup]
        if self.netns:
            out += ["ip", "netns", "exec", self.netns]
        if self.cpus is not None:
            out += ["taskset", "-c", ",".join(str(c) for c in self.cpus)]
        if self.uid is not None:
            gid = self.gid if self.gid is not None else self.uid
            out += ["setpriv", f"--reuid={self.uid}", f"--regid={gid}", "--clear-groups"]
        return out + list(argv)


class Process(Protocol):
    """A started process: enough to wait for it and end it by PID."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit code."""
        ...


class System(Protocol):
    def run(
        self,
        argv: Sequence[str],
        *,
        place: Placement = Placement(),
        check: bool = True,
        input: str | None = None,
        timeout: float | None = 120.0,
        env: Mapping[str, str] | None = None,
    ) -> Completed: ...

    def spawn(
        self,
        argv: Sequence[str],
        *,
        place: Placement = Placement(),
        stdout: IO[bytes] | int | None = subprocess.DEVNULL,
        stderr: IO[bytes] | int | None = subprocess.DEVNULL,
        env: Mapping[str, str] | None = None,
    ) -> Process: ...


class _RealProcess:
    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._p = popen

    @property
    def pid(self) -> int:
        return self._p.pid

    def poll(self) -> int | None:
        return self._p.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._p.wait(timeout)

    def stop(self, timeout: float = 5.0) -> int | None:
        if self._p.poll() is not None:
            return self._p.returncode
        # the process leads its own group (start_new_session): signal the group, by PID
        try:
            os.killpg(self._p.pid, signal.SIGTERM)
        except ProcessLookupError:
            return self._p.poll()
        try:
            return self._p.wait(timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self._p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return self._p.wait(timeout)


class RealSystem:
    """Runs commands for real. Spawned processes get their own session (process group)."""

    def run(
        self,
        argv: Sequence[str],
        *,
        place: Placement = Placement(),
        check: bool = True,
        input: str | None = None,
        timeout: float | None = 120.0,
        env: Mapping[str, str] | None = None,
    ) -> Completed:
        full = place.wrap(argv)
        p = subprocess.run(
            full,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=None if env is None else {**os.environ, **env},
        )
        done = Completed(tuple(full), p.returncode, p.stdout, p.stderr)
        if check and p.returncode != 0:
            raise CommandError(full, p.returncode, p.stdout, p.stderr)
        return done

    def spawn(
        self,
        argv: Sequence[str],
        *,
        place: Placement = Placement(),
        stdout: IO[bytes] | int | None = subprocess.DEVNULL,
        stderr: IO[bytes] | int | None = subprocess.DEVNULL,
        env: Mapping[str, str] | None = None,
    ) -> Process:
        popen = subprocess.Popen(
            place.wrap(argv),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env=None if env is None else {**os.environ, **env},
            start_new_session=True,
        )
        return _RealProcess(popen)


@dataclass
class FakeProcess:
    pid: int
    argv: tuple[str, ...]
    returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = 0
        return self.returncode

    def stop(self, timeout: float = 5.0) -> int | None:
        if self.returncode is None:
            self.returncode = -signal.SIGTERM
        return self.returncode


Responder = Callable[[tuple[str, ...]], Completed | None]


@dataclass
class FakeSystem:
    """Records every command; answers from ``responders`` (first non-None wins), else success.

    ``calls`` holds the full (placed) argv of every run and spawn, in order.
    """

    responders: list[Responder] = field(default_factory=list)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    processes: list[FakeProcess] = field(default_factory=list)
    _next_pid: int = 40000

    def run(
        self,
        argv: Sequence[str],
        *,
        place: Placement = Placement(),
        check: bool = True,
        input: str | None = None,
        timeout: float | None = 120.0,
        env: Mapping[str, str] | None = None,
    ) -> Completed:
        full = tuple(place.wrap(argv))
        self.calls.append(full)
        for r in self.responders:
            got = r(full)
            if got is not None:
                if check and got.returncode != 0:
                    raise CommandError(full, got.returncode, got.stdout, got.stderr)
                return got
        return Completed(full, 0, "", "")

    def spawn(
        self,
        argv: Sequence[str],
        *,
        place: Placement = Placement(),
        stdout: IO[bytes] | int | None = None,
        stderr: IO[bytes] | int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Process:
        full = tuple(place.wrap(argv))
        self.calls.append(full)
        self._next_pid += 1
        p = FakeProcess(self._next_pid, full)
        self.processes.append(p)
        return p


def free_ports(k: int) -> list[int]:
    """``k`` TCP ports free on 127.0.0.1 right now (bound together, so they are distinct)."""
    socks = [socket.socket() for _ in range(k)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_until(pred: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``pred`` until true or ``timeout`` seconds pass; returns the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
