"""Counting a running proxy's events over windows of requests, from one of two sources behind
one small interface (with a fake beside them):

* :class:`ValgrindSource` — the proxy runs under callgrind with the cache and branch
  simulators; a window is ``callgrind_control -z`` … ``-d`` (every event of the dump);
* :class:`PmuSource` — the hardware counters: ``perf stat -p PID`` attached for the window.

:func:`detect_source` says which one this machine offers: the PMU when ``perf stat`` counts
instructions and cycles (it does not on most VMs), else valgrind's simulation.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from meshtax.model.microarch import CacheGeometry
from meshtax.testbed.callgrind import CallgrindDump, CallgrindSpec
from meshtax.testbed.system import CommandError, Placement, Process, System

__all__ = [
    "PMU_EVENTS",
    "TOPDOWN_EVENTS",
    "WHOLE",
    "Counted",
    "CounterSource",
    "Counts",
    "FakeCounterSource",
    "PmuSource",
    "ValgrindSource",
    "WindowCounter",
    "detect_source",
    "parse_perf_stat",
    "pmu_events",
]

#: what the PMU table counts where the CPU has it (perf's generic names)
PMU_EVENTS = (
    "instructions",
    "cycles",
    "branches",
    "branch-misses",
    "L1-icache-load-misses",
    "L1-dcache-load-misses",
    "LLC-load-misses",
)
#: the top-down level-1 split (Intel's names; counted together or not at all)
TOPDOWN_EVENTS = (
    "slots",
    "topdown-retiring",
    "topdown-bad-spec",
    "topdown-fe-bound",
    "topdown-be-bound",
)

FunctionCosts = Mapping[tuple[str, str], Mapping[str, float]]


#: the one thread key of a source that counts the process as a whole
WHOLE = 0


def _add(acc: dict[str, float], more: Mapping[str, float]) -> None:
    for e, v in more.items():
        acc[e] = acc.get(e, 0.0) + float(v)


@dataclass(frozen=True)
class Counts:
    """Events of one window per thread: valgrind's thread numbers (1: the initial thread)
    when the source counts threads apart, else one entry (:data:`WHOLE`); ``functions``:
    each thread's self cost per (object, function), when known."""

    threads: Mapping[int, Mapping[str, float]]
    functions: Mapping[int, FunctionCosts] = field(default_factory=dict)

    def events(self, threads: Collection[int] | None = None) -> dict[str, float]:
        """Events summed over ``threads`` (None: every thread)."""
        acc: dict[str, float] = {}
        for t, ev in self.threads.items():
            if threads is None or t in threads:
                _add(acc, ev)
        return acc

    def costs(
        self, threads: Collection[int] | None = None
    ) -> dict[tuple[str, str], dict[str, float]]:
        """Self cost per function summed over ``threads`` (None: every thread)."""
        acc: dict[tuple[str, str], dict[str, float]] = {}
        for t, fns in self.functions.items():
            if threads is None or t in threads:
                for k, c in fns.items():
                    _add(acc.setdefault(k, {}), c)
        return acc


class Counted(Protocol):
    """What a source needs of the counted process (:class:`EnvoyProcess` has it)."""

    @property
    def pid(self) -> int: ...

    def zero(self) -> None: ...

    def dump_threads(self, *, functions: bool = False) -> Mapping[int, CallgrindDump]: ...


class WindowCounter(Protocol):
    """Counts one process window by window."""

    def zero(self) -> None:
        """Start a window now."""
        ...

    def read(self) -> Counts:
        """The window's counts; the next window starts at once."""
        ...

    def close(self) -> None: ...


class CounterSource(Protocol):
    """Where counts come from: ``name`` is ``valgrind`` or ``pmu`` (the vocabulary of
    :data:`~meshtax.model.microarch.METRICS`); ``callgrind``: how the proxy must be started
    (None: normally)."""

    @property
    def name(self) -> str: ...

    @property
    def callgrind(self) -> CallgrindSpec | None: ...

    def open(self, process: Counted, system: System, workdir: Path) -> WindowCounter: ...

    def tool(self, system: System) -> str:
        """The counting tool and its settings, for the record."""
        ...


# --- valgrind ------------------------------------------------------------------------------


@dataclass
class _CallgrindCounter:
    process: Counted
    functions: bool
    geometry: CacheGeometry | None = None

    def zero(self) -> None:
        self.process.zero()

    def read(self) -> Counts:
        dumps = self.process.dump_threads(functions=self.functions)
        for d in dumps.values():
            self.geometry = d.geometry or self.geometry
        return Counts(
            {t: {e: float(v) for e, v in d.totals.items()} for t, d in dumps.items()},
            {t: d.functions for t, d in dumps.items() if d.functions},
        )

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class ValgrindSource:
    """Callgrind with ``spec`` (default: cache and branch simulators, valgrind's geometry,
    threads apart, so the threads that serve no request can be told apart); ``functions``:
    read each function's self cost (for attribution) too."""

    spec: CallgrindSpec = CallgrindSpec(cache_sim=True, branch_sim=True, separate_threads=True)
    functions: bool = False
    name: str = "valgrind"

    @property
    def callgrind(self) -> CallgrindSpec | None:
        return self.spec

    def open(self, process: Counted, system: System, workdir: Path) -> WindowCounter:
        return _CallgrindCounter(process, self.functions)

    def tool(self, system: System) -> str:
        try:
            version = system.run(["valgrind", "--version"], timeout=30).stdout.strip()
        except (CommandError, OSError):
            version = "valgrind"
        on = (("cache", self.spec.cache_sim), ("branch", self.spec.branch_sim))
        what = " and ".join(s for s, yes in on if yes)
        return f"{version} --tool=callgrind" + (f" ({what} simulation)" if what else "")


# --- PMU -----------------------------------------------------------------------------------


def parse_perf_stat(text: str) -> dict[str, float]:
    """``perf stat -x,`` output → {event: count} (modifiers such as ``:u`` dropped from the
    names); events perf could not count are left out."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) < 3 or line.startswith("#"):
            continue
        try:
            out[parts[2].strip().split(":")[0]] = float(parts[0])
        except ValueError:
            continue  # <not supported>, <not counted>
    return out


def pmu_events(system: System) -> tuple[str, ...]:
    """The events ``perf stat`` counts on this machine: :data:`PMU_EVENTS` one by one (an
    event perf does not know fails the whole command), the top-down group as a whole."""
    got: list[str] = []
    for group in [(e,) for e in PMU_EVENTS] + [TOPDOWN_EVENTS]:
        try:
            done = system.run(
                ["perf", "stat", "-x,", "-e", ",".join(group), "true"], check=False, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return ()
        counted = parse_perf_stat(done.stderr + done.stdout)
        if done.returncode == 0 and all(e in counted for e in group):
            got += group
    return tuple(got)


@dataclass
class _PerfStatCounter:
    system: System
    pid: int
    events: Sequence[str]
    workdir: Path
    _proc: Process | None = None
    _n: int = 0

    def zero(self) -> None:
        self._stop()
        self._n += 1
        # user space only, like valgrind's counts (the kernel's share comes from the probes)
        events = ",".join(f"{e}:u" for e in self.events)
        argv = ["perf", "stat", "-x,", "-e", events, "-p", str(self.pid)]
        self._proc = self.system.spawn([*argv, "-o", str(self._out())], place=Placement())

    def _out(self) -> Path:
        return self.workdir / f"perf-stat.{self._n}"

    def _stop(self) -> str | None:
        if self._proc is None:
            return None
        # perf stat prints its counts on SIGINT
        self.system.run(["kill", "-s", "INT", str(self._proc.pid)], check=False)
        try:
            self._proc.wait(30.0)
        except subprocess.TimeoutExpired:
            self._proc.stop()
        self._proc = None
        try:
            return self._out().read_text()
        except OSError:
            return ""

    def read(self) -> Counts:
        text = self._stop()
        if text is None:
            raise RuntimeError("perf stat window read before it was started (zero)")
        counts = parse_perf_stat(text)
        self.zero()
        return Counts({WHOLE: counts})

    def close(self) -> None:
        self._stop()


@dataclass(frozen=True)
class PmuSource:
    """The hardware counters through ``perf stat -p``, user space only, every thread of the
    process (``events``: what this CPU counts, :func:`pmu_events`)."""

    events: tuple[str, ...]
    name: str = "pmu"

    @property
    def callgrind(self) -> CallgrindSpec | None:
        return None

    def open(self, process: Counted, system: System, workdir: Path) -> WindowCounter:
        workdir.mkdir(parents=True, exist_ok=True)
        return _PerfStatCounter(system, process.pid, self.events, workdir)

    def tool(self, system: System) -> str:
        try:
            version = system.run(["perf", "--version"], timeout=30).stdout.strip()
        except (CommandError, OSError):
            version = "perf"
        return f"{version} stat -e {','.join(self.events)}"


def detect_source(
    system: System, *, valgrind: Callable[[], bool] | None = None
) -> tuple[CounterSource | None, str]:
    """The source this machine offers and why: the PMU when ``perf stat`` counts
    instructions and cycles, else valgrind's simulation when valgrind is installed."""
    have_valgrind = valgrind or (lambda: shutil.which("valgrind") is not None)
    events = pmu_events(system)
    if {"instructions", "cycles"} <= set(events):
        return PmuSource(events), f"hardware counters (perf stat: {', '.join(events)})"
    why = "no hardware counters (perf stat -e instructions,cycles: not supported)"
    if have_valgrind():
        return ValgrindSource(), f"valgrind simulation (callgrind cache and branch sim); {why}"
    return None, f"{why}, and no valgrind"


# --- fake ----------------------------------------------------------------------------------


Totals = Mapping[int, Mapping[str, float]]


@dataclass
class _FakeCounter:
    total: Callable[[], Totals]
    last: Totals = field(default_factory=dict)

    def zero(self) -> None:
        self.last = self.total()

    def read(self) -> Counts:
        now = self.total()
        diff = {
            t: {e: v - self.last.get(t, {}).get(e, 0.0) for e, v in ev.items()}
            for t, ev in now.items()
        }
        self.last = now
        return Counts(diff)

    def close(self) -> None:
        pass


@dataclass
class FakeCounterSource:
    """A source for tests: ``total()`` is the process's cumulative counts (a fake world's);
    a window is the difference since the last zero or read. ``threads()``, when given, is
    the cumulative counts per thread instead (``total`` is then not read)."""

    total: Callable[[], Mapping[str, float]]
    name: str = "valgrind"
    spec: CallgrindSpec | None = None
    threads: Callable[[], Totals] | None = None
    opened: list[int] = field(default_factory=list)

    @property
    def callgrind(self) -> CallgrindSpec | None:
        return self.spec

    def open(self, process: Counted, system: System, workdir: Path) -> WindowCounter:
        self.opened.append(process.pid)
        total = self.total
        return _FakeCounter(self.threads or (lambda: {WHOLE: dict(total())}))

    def tool(self, system: System) -> str:
        return f"fake {self.name} counters"
