"""The tools a measurement uses, in one injectable bag (real by default, fakes in tests)."""

from __future__ import annotations

import datetime as _dt
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from meshtax.model.sidecar import Mode
from meshtax.model.speed import Speed
from meshtax.testbed import procfs
from meshtax.testbed.callgrind import CallgrindSpec, host_geometry
from meshtax.testbed.connect import ConnectFn, connect_loop
from meshtax.testbed.counters import CounterSource, ValgrindSource, detect_source
from meshtax.testbed.envoy.process import EnvoyProcess
from meshtax.testbed.fortio import FortioServer, LoadResult, LoadSpec, run_spec
from meshtax.testbed.interference import InterferenceMeter, MeterFactory
from meshtax.testbed.perf import PerfProfile, PerfSession
from meshtax.testbed.pinning import niceness
from meshtax.testbed.pods import Testbed
from meshtax.testbed.probes import ProbeSession, RealProbe
from meshtax.testbed.runstate import STATE_DIR, ProcOps
from meshtax.testbed.speed import measure_speed_and_sidecar
from meshtax.testbed.system import Placement, System, free_ports
from meshtax.testbed.tools import tool

__all__ = [
    "Backends",
    "CpuSampler",
    "LoadFn",
    "PERF_FREQ",
    "echo_server",
    "loopback_load",
    "niceness",
]

#: perf sampling rate: a 1 s run at a few thousand requests/s gives the sidecar only ~0.1
#: CPU-s; at 999 Hz that is ~100 samples and ±10 % per bucket, so sample faster
PERF_FREQ = 4999
LO = "127.0.0.1"

LoadFn = Callable[[str, Mode, int, int], LoadResult]  # (host:port, mode, size, n) → result


class CpuSampler(Protocol):
    """perf-like CPU sampling (``PerfSession`` for real)."""

    def start(self) -> None: ...

    def stop(self, pids: Sequence[int] | None) -> PerfProfile: ...

    def close(self) -> None: ...


def echo_server(
    system: System, workdir: Path, mode: Mode, port: int, place: Placement = Placement()
) -> FortioServer:
    """A fortio echo app for ``mode`` on ``127.0.0.1:port``."""
    ports: dict[str, Any] = {f"{m.value}_port": port if m is mode else None for m in Mode}
    return FortioServer(system, workdir, host=LO, place=place, **ports)


def loopback_load(
    system: System, *, stdclient: bool = False, place: Placement = Placement()
) -> LoadFn:
    """fortio closed-loop runs of n requests on loopback.

    ``stdclient``: Go's standard HTTP client; fortio's fast client fails every other request
    with bodies above ~64 KiB (seen with fortio 1.68.2, with and without a sidecar), so the
    large-message sweep uses it at every size (one client for the whole curve).
    """
    binary = tool("fortio")
    extra = ("-stdclient",) if stdclient else ()

    def load(target: str, mode: Mode, size: int, n: int) -> LoadResult:
        args = extra if mode is Mode.HTTP else ()
        spec = LoadSpec(target, mode, size, 0.0, n=n, timeout_s=30.0, extra_args=args)
        return run_spec(spec, system, binary=binary, place=place)

    return load


def _real_probe(system: System) -> ProbeSession:
    return RealProbe(system)


def _real_perf(system: System) -> CpuSampler:
    return PerfSession(system, freq=PERF_FREQ)


@dataclass
class Backends:
    """Every measuring tool and run setting a profile step may need; the defaults are real.

    ``probe``/``perf``: sessions on a (registered) system; ``schedstat``: per-thread CPU of a
    process; ``cpu_ns``: a multi-variant Envoy's worker CPU; ``rss``: resident bytes;
    ``load``: loopback loads (None: fortio on the testbed's system); ``envoy``/``echo``:
    process factories; ``connect``: the new-connection loop; ``memory``: one memory sweep
    (None: the real one); run settings: the state dir and lock of the testbed, process ops,
    binaries, clocks and niceness.
    """

    probe: Callable[[System], ProbeSession] = _real_probe
    perf: Callable[[System], CpuSampler] = _real_perf
    schedstat: Callable[[int], Mapping[int, int]] = procfs.schedstat
    cpu_ns: Callable[[int], int] = procfs.worker_cpu_ns
    rss: Callable[[int], int] = procfs.read_rss
    load: LoadFn | None = None
    envoy: Callable[..., EnvoyProcess] = EnvoyProcess
    echo: Callable[..., AbstractContextManager[Any]] = echo_server
    free_ports: Callable[[int], list[int]] = free_ports
    connect: ConnectFn = connect_loop
    memory: Callable[..., Any] | None = None
    # what else ran in each probe window (None: not measured, nothing refused)
    meter: MeterFactory | None = InterferenceMeter
    # the machine's speed now, on the reference workload ((system, CPU a, CPU b) → Speed;
    # None: not measured)
    speed: Callable[[System, int | None, int | None], Speed] | None = measure_speed_and_sidecar
    callgrind_available: Callable[[], bool] = field(
        default=lambda: shutil.which("valgrind") is not None
    )
    state_dir: Path = STATE_DIR
    lock_timeout: float = 0.0  # seconds to wait for another profiling run to finish
    procs: ProcOps | None = None
    envoy_binary: Path | None = None
    fortio_binary: Path | None = None
    proxy_binary: Path | None = None  # the profiled proxy's, when it is not Envoy
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    niceness: Callable[[int | None], AbstractContextManager[None]] = niceness
    now: Callable[[], _dt.datetime] = field(default=lambda: _dt.datetime.now(_dt.UTC))
    counters: Callable[[System], tuple[CounterSource | None, str]] = detect_source

    def testbed(self, system: System) -> Testbed:
        """A testbed with these settings (not yet open)."""
        return Testbed(
            system, state_dir=self.state_dir, lock_timeout=self.lock_timeout, procs=self.procs
        )

    def counter_source(self, system: System, which: str = "auto") -> CounterSource:
        """The microarch counter source: ``auto`` (what :attr:`counters` finds: the PMU, else
        valgrind), ``valgrind`` or ``pmu``; valgrind simulates this host's caches where it can
        (:func:`~meshtax.testbed.callgrind.host_geometry`). ``ValueError`` when the machine
        does not offer the source asked for."""
        if which not in ("auto", "valgrind", "pmu"):
            raise ValueError(f"unknown counter source {which!r} (auto, valgrind, pmu)")
        spec = CallgrindSpec(True, True, host_geometry(), separate_threads=True)
        if which == "valgrind":
            if not self.callgrind_available():
                raise ValueError("valgrind is not installed (apt-get install valgrind)")
            return ValgrindSource(spec, functions=True)
        found, why = self.counters(system)
        if found is None or (which == "pmu" and found.name != "pmu"):
            raise ValueError(
                f"no {'hardware counters' if which == 'pmu' else 'counter source'}: {why}"
            )
        return ValgrindSource(spec, functions=True) if isinstance(found, ValgrindSource) else found

    def loads(self, system: System, *, stdclient: bool = False) -> LoadFn:
        return self.load or loopback_load(system, stdclient=stdclient)
