"""``run_profile``: measure this machine's sidecar and store a :class:`Profile`.

Testbed (one run)::

    pod client  (fortio load, no sidecar, CPU pinning.client)
       │ veth/bridge
    pod server  (meshed)  :8080 ──iptables──► Envoy :15006 (uid 1337, pinning.sidecars)
                                                 └─ 127.0.0.1:<app port> ─► fortio echo (pinning.app)
                          :<app port> (excluded from interception) ─► the same fortio echo

So "with sidecar" targets ``server:8080`` and "without" targets the app port directly — the
same echo process, in the same run, alternating. The whole run is niced (``Plan.nice``) so
other work on a shared machine does not preempt it mid-request. For each mode (TCP first, so
HTTP/gRPC parsing can subtract it) and size:

1. paired latency runs without probes → the overhead (meshed − direct mean) with a 95 %
   interval (:func:`measure_overhead`);
2. paired probe windows, meshed and direct, the probe on sidecar and app → the components
   (:mod:`~meshtax.profile.decompose`) and the overhead *in those same windows*, which the
   closure compares them with; probed − un-probed overhead is the probe's perturbation
   (:func:`probe_components`);
3. the max-rate run and fixed-rate runs under perf → CPU per component (:func:`sidecar_cpu`):
   fractions of the max rate and absolute low rates (``Plan.low_rates``; per-message CPU
   rises at low rates, where applications run).

In tcp mode, then, for each protocol of ``Plan.carried`` (gRPC): a tcp-mode sidecar forwarding
to the app's server of that protocol, driven by that protocol's client — probe windows and CPU
runs as above → ``ModeProfile.carried[protocol]`` (one gRPC call is several TCP writes each
way, which a TCP echo does not show). Then :mod:`~meshtax.profile.fit` fits models and checks
closure.

Building blocks for other profilers (filters, mTLS, memory …): :func:`echo_testbed` /
:class:`EchoBed` (testbed + app; ``start_sidecar`` with any :class:`EnvoyConfig`; ``load``),
:func:`measure_overhead`, :func:`probe_components`, :func:`sidecar_cpu`, :func:`niceness`.

Every side effect goes through :class:`System` and the injectable :class:`Backends`, so the
orchestration runs against fakes in tests.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol

from meshtax import __version__
from meshtax.model.components import Component
from meshtax.model.profile import ModeProfile, Profile, Provenance
from meshtax.model.sidecar import Mode
from meshtax.model.stats import Estimate, estimate, median, repeat_until
from meshtax.profile.decompose import (
    Breakdown,
    Window,
    assemble,
    cpu_breakdown,
    mesh_breakdown,
    per_crossing,
)
from meshtax.profile.fit import SizePoint, fit_carried, fit_mode
from meshtax.profile.plan import Plan, Step, full_plan, quick_plan
from meshtax.testbed.envoy.config import (
    EnvoyConfig,
    EnvoyProcess,
    config_hash,
    envoy_binary,
    envoy_version,
)
from meshtax.testbed.fortio import FortioServer, LoadResult, fortio_binary, fortio_version, run_load
from meshtax.testbed.host import this_host
from meshtax.testbed.perf import PerfProfile, PerfSession, schedstat
from meshtax.testbed.pinning import Pinning
from meshtax.testbed.pods import Pod, Testbed
from meshtax.testbed.probes import (
    ProbeReading,
    ProbeSession,
    RealProbe,
    SnapshotSession,
    ThreadReading,
    realtime,
)
from meshtax.testbed.runstate import STATE_DIR, ProcOps
from meshtax.testbed.system import System

__all__ = [
    "APP_PORTS",
    "SERVICE_PORT",
    "Backends",
    "ClosureWarning",
    "CpuSampler",
    "EchoBed",
    "PairedOverhead",
    "ProbeResult",
    "ProfileOptions",
    "Progress",
    "ProfileSink",
    "echo_testbed",
    "measure_overhead",
    "niceness",
    "probe_components",
    "run_profile",
    "sidecar_cpu",
]

#: the port clients call; the sidecar intercepts it and forwards to the app port
SERVICE_PORT = 8080
#: where the echo app listens (excluded from interception, so it is also the direct path)
APP_PORTS: Mapping[Mode, int] = {Mode.TCP: 9078, Mode.GRPC: 9079, Mode.HTTP: 9080}
PROXY_UID = 1337


class ClosureWarning(UserWarning):
    """A measured profile whose components do not add up to the measured overhead."""


@dataclass(frozen=True)
class ProfileOptions:
    """What ``meshtax profile`` asks for (the CLI maps argv onto this, nothing else).

    ``modes``/``sizes``/``duration_s``/``carried``/``low_rates`` override the preset (``quick``
    or full; ``()`` turns carried protocols or low-rate runs off); ``plan``, if given, replaces
    the preset entirely. ``name`` defaults to ``<hostname>-<UTC time>``.
    """

    name: str | None = None
    quick: bool = False
    modes: tuple[Mode | str, ...] | None = None
    sizes: tuple[int, ...] | None = None
    duration_s: float | None = None
    replace: bool = False
    plan: Plan | None = None
    carried: tuple[str, ...] | None = None
    low_rates: tuple[float, ...] | None = None

    def resolve_plan(self) -> Plan:
        p = self.plan or (quick_plan() if self.quick else full_plan())
        changes: dict[str, Any] = {}
        if self.modes:
            changes["modes"] = tuple(Mode(m) for m in self.modes)
        if self.sizes:
            changes["sizes"] = tuple(self.sizes)
        if self.carried is not None:
            changes["carried"] = tuple(self.carried)
        if self.low_rates is not None:
            changes["low_rates"] = tuple(self.low_rates)
        if changes:
            p = Plan(**{**_plan_fields(p), **changes})
        if self.duration_s is not None:
            p = p.with_duration(self.duration_s)
        return p

    def resolve_name(self, now: _dt.datetime) -> str:
        return self.name or f"{socket.gethostname()}-{now.strftime('%Y%m%d-%H%M%S')}"


def _plan_fields(p: Plan) -> dict[str, Any]:
    return {f: getattr(p, f) for f in p.__dataclass_fields__}


@dataclass(frozen=True)
class Progress:
    """Where a run is: step ``index`` of ``total`` (1-based), seconds elapsed and an ETA."""

    index: int
    total: int
    step: Step
    elapsed_s: float
    eta_s: float
    fraction: float

    @property
    def description(self) -> str:
        return self.step.describe()


class CpuSampler(Protocol):
    """perf-like CPU sampling (``PerfSession`` for real)."""

    def start(self) -> None: ...

    def stop(self, pids: Sequence[int] | None) -> PerfProfile: ...

    def close(self) -> None: ...


class ProfileSink(Protocol):
    def save(self, profile: Profile, *, replace: bool = False) -> None: ...


def _real_probe(system: System) -> ProbeSession:
    return RealProbe(system)


#: perf sampling rate: a 1 s run at a few thousand requests/s gives the sidecar only ~0.1
#: CPU-s; at 999 Hz that is ~100 samples and ±10 % per bucket, so sample faster
PERF_FREQ = 4999


def _real_perf(system: System) -> CpuSampler:
    return PerfSession(system, freq=PERF_FREQ)


@contextmanager
def niceness(nice: int | None) -> Iterator[None]:
    """Run the block (and every process it spawns: children inherit it) at ``nice``."""
    if nice is None:
        yield
        return
    old = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, old)


@dataclass
class Backends:
    """The measuring tools, injectable for tests (defaults are the real ones)."""

    probe: Callable[[System], ProbeSession] = _real_probe
    perf: Callable[[System], CpuSampler] = _real_perf
    schedstat: Callable[[int], Mapping[int, int]] = schedstat
    state_dir: Path = STATE_DIR
    lock_timeout: float = 0.0  # seconds to wait for another profiling run to finish
    procs: ProcOps | None = None
    envoy_binary: Path | None = None
    fortio_binary: Path | None = None
    workdir: Path | None = None
    clock: Callable[[], float] = time.monotonic
    niceness: Callable[[int | None], AbstractContextManager[None]] = niceness
    now: Callable[[], _dt.datetime] = field(default=lambda: _dt.datetime.now(_dt.UTC))


@dataclass(frozen=True)
class _CpuRun:
    """One CPU run: ``label`` ("max", "f0.25" of the max rate, "r100" requests/s), the rate
    achieved, per-crossing CPU and perf/schedstat."""

    label: str
    rate: float
    bd: Breakdown
    ratio: float


@dataclass
class _SizeResult:
    size: int
    unprobed: PairedOverhead | None  # None: only probed windows (carried protocols)
    probed: ProbeResult
    max_qps: float = 0.0
    cpu: list[_CpuRun] = field(default_factory=list)

    @property
    def overhead(self) -> Estimate:
        """Per-request overhead without probes (the profile's measured overhead; the probed
        one when no un-probed runs were made)."""
        return self.probed.overhead if self.unprobed is None else self.unprobed.estimate

    @property
    def perturbation_us(self) -> float:
        """Per-request overhead with probes minus without (both paired, same run)."""
        return self.probed.overhead.median - self.overhead.median

    @property
    def app_user_us(self) -> float:
        """The app's user-space CPU change per crossing (meshed − direct, µs; from the probe
        windows): parsing what the sidecar adds (headers, HTTP/2 control frames). Its kernel-side
        change is not counted: it depends on where client and app run (direct, the app's write
        wakes the client on the other CPU; meshed, the sidecar on its own)."""
        return self.probed.latency.user - self.probed.sidecar_only.user

    def cpu_bd(self, run: _CpuRun) -> Breakdown:
        """A CPU run's per-crossing breakdown: the sidecar's (perf split, schedstat total)
        plus the app's user-space change (:attr:`app_user_us`), as the latency counts it."""
        return replace(run.bd, user=run.bd.user + self.app_user_us)

    def cpu_like(self, run: _CpuRun) -> _CpuRun | None:
        """The run of the same label, else the one nearest in rate (the TCP baseline of an
        HTTP/gRPC run)."""
        same = [c for c in self.cpu if c.label == run.label]
        if same:
            return same[0]
        if not self.cpu or run.rate <= 0:
            return self.cpu[-1] if self.cpu else None
        return min(self.cpu, key=lambda c: abs(math.log(max(c.rate, 1e-9) / run.rate)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": self.size,
            **({} if self.unprobed is None else self.unprobed.to_dict()),
            "probe": {**self.probed.to_dict(), "perturbation_us_per_request": self.perturbation_us},
            "latency_breakdown_us": self.probed.latency.to_dict(),
            "max_qps": self.max_qps,
            "cpu": [
                {
                    "run": c.label,
                    "rate": c.rate,
                    "breakdown_us": c.bd.to_dict(),
                    "perf_over_schedstat": c.ratio,
                }
                for c in self.cpu
            ],
        }


class _Clocked:
    """Progress bookkeeping: expected seconds of each step, scaled by how the run is going."""

    def __init__(
        self,
        steps: list[Step],
        progress: Callable[[Progress], None] | None,
        clock: Callable[[], float],
    ) -> None:
        self.steps = steps
        self.total_expected = sum(s.expected_s for s in steps) or 1.0
        self.progress = progress
        self.clock = clock
        self.t0 = clock()
        self.i = 0
        self.done_expected = 0.0

    def next(
        self,
        kind: str,
        mode: Mode,
        size: int = 0,
        fraction: float = 0.0,
        *,
        rate: float = 0.0,
        protocol: str = "",
    ) -> None:
        # steps are announced in plan order; find this one (robust if the plan skips some)
        want = (kind, mode, size, fraction, rate, protocol)
        while self.i < len(self.steps):
            st = self.steps[self.i]
            self.i += 1
            if (st.kind, st.mode, st.size, st.rate_fraction, st.rate, st.protocol) == want:
                break
            self.done_expected += st.expected_s
        else:
            return
        elapsed = self.clock() - self.t0
        frac = self.done_expected / self.total_expected
        pace = elapsed / self.done_expected if self.done_expected > 0 else 1.0
        remaining = self.total_expected - self.done_expected
        if self.progress is not None:
            self.progress(
                Progress(self.i, len(self.steps), st, elapsed, remaining * max(pace, 0.5), frac)
            )
        self.done_expected += st.expected_s


def _family_hash() -> str:
    """One hash for the sidecar configs of all modes (a profile's platform key must not
    depend on which modes a run chose)."""
    return config_hash({m.value: EnvoyConfig(mode=m).key() for m in Mode})


# --- building blocks (also for other profilers: filters, mTLS, memory …) -------------------


@dataclass
class EchoBed:
    """A running testbed: a client pod, a meshed server pod (Istio interception, app ports
    excluded) and the fortio echo app serving TCP, HTTP and gRPC in it.

    ``meshed_target`` is what goes through a sidecar started with :meth:`start_sidecar`;
    ``direct_target(mode)`` reaches the same app process without it.
    """

    system: System
    testbed: Testbed
    client: Pod
    server: Pod
    app: FortioServer
    pinning: Pinning
    envoy_bin: Path
    fortio_bin: Path
    workdir: Path

    @property
    def app_pid(self) -> int:
        assert self.app.process is not None
        return self.app.process.pid

    @property
    def meshed_target(self) -> str:
        return f"{self.server.ip}:{SERVICE_PORT}"

    def direct_target(self, mode: Mode) -> str:
        return f"{self.server.ip}:{APP_PORTS[mode]}"

    @property
    def client_netns_path(self) -> str:
        """The client pod's namespace file (what the probe follows to see the load generator)."""
        return f"/run/netns/{self.client.netns}"

    def load(
        self,
        target: str,
        mode: Mode,
        size: int,
        qps: float = 0.0,
        *,
        duration_s: float | None = None,
        n: int | None = None,
        connections: int = 1,
    ) -> LoadResult:
        """One fortio run from the client pod (pinned): closed loop when ``qps`` is 0."""
        return run_load(
            target,
            mode,
            size,
            qps,
            connections=connections,
            duration_s=duration_s,
            n=n,
            system=self.system,
            place=self.client.place(cpus=self.pinning.client),
            binary=self.fortio_bin,
        )

    def start_sidecar(
        self, mode: Mode, cfg: EnvoyConfig | None = None, *, name: str | None = None
    ) -> EnvoyProcess:
        """Start (and register for cleanup) the server pod's sidecar; stop it when done.

        ``cfg`` defaults to the plain config of ``mode`` forwarding to the app's port; one
        sidecar at a time can own the intercepted ports.
        """
        cfg = cfg or EnvoyConfig(mode=mode, inbound_upstream=("127.0.0.1", APP_PORTS[mode]))
        envoy = EnvoyProcess(
            self.system,
            cfg,
            self.workdir / (name or mode.value),
            place=self.server.place(cpus=self.pinning.sidecars, uid=PROXY_UID),
            binary=self.envoy_bin,
        )
        envoy.start()
        assert envoy.process is not None
        self.testbed.adopt(envoy.process, ["envoy", name or mode.value], netns=self.server.netns)
        return envoy


@contextmanager
def echo_testbed(
    system: System, pinning: Pinning, backends: Backends | None = None, workdir: Path | None = None
) -> Iterator[EchoBed]:
    """Create the testbed of :class:`EchoBed` (taking the profiling lock), yield it, and tear
    everything down on the way out (also on exceptions and Ctrl-C), the scratch directory of
    configs and logs included when it made one (errors quote the logs they need)."""
    be = backends or Backends()
    envoy_bin = be.envoy_binary or envoy_binary()
    fortio_bin = be.fortio_binary or fortio_binary()
    with Testbed(
        system, state_dir=be.state_dir, lock_timeout=be.lock_timeout, procs=be.procs
    ) as tb:
        work = workdir or be.workdir or tb.scratch_dir("meshtax-profile-")
        client = tb.add_pod("client")
        server = tb.add_pod("server")
        tb.mesh(
            server, proxy_uid=PROXY_UID, exclude_inbound_ports=(15000, 15090, *APP_PORTS.values())
        )
        app = FortioServer(
            system,
            work / "app",
            host="0.0.0.0",
            http_port=APP_PORTS[Mode.HTTP],
            grpc_port=APP_PORTS[Mode.GRPC],
            tcp_port=APP_PORTS[Mode.TCP],
            place=server.place(cpus=pinning.app),
            binary=fortio_bin,
        )
        app.start()
        assert app.process is not None
        tb.adopt(app.process, app.argv, netns=server.netns)
        try:
            yield EchoBed(system, tb, client, server, app, pinning, envoy_bin, fortio_bin, work)
        finally:
            app.stop()


@dataclass
class PairedOverhead:
    """Per-request overhead (meshed − direct mean latency, µs) from alternating paired runs."""

    estimate: Estimate
    meshed_mean: list[float] = field(default_factory=list)
    direct_mean: list[float] = field(default_factory=list)
    meshed_p50: list[float] = field(default_factory=list)
    direct_p50: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "overhead_per_request_us": self.estimate.to_dict(),
            "meshed_mean_us": self.meshed_mean,
            "direct_mean_us": self.direct_mean,
            "meshed_p50_us": self.meshed_p50,
            "direct_p50_us": self.direct_p50,
        }


def measure_overhead(
    bed: EchoBed,
    mode: Mode,
    size: int,
    *,
    run_s: float,
    rel_halfwidth: float = 0.1,
    min_runs: int = 3,
    max_runs: int = 6,
    budget_s: float | None = None,
    meshed: str | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> PairedOverhead:
    """Paired closed-loop runs with and without the sidecar until the median difference is
    narrow (:func:`~meshtax.model.stats.repeat_until`); the order alternates so a drifting
    machine does not bias the difference. Means, not p50s: components are means too, and
    fortio's p50 is bucket-interpolated."""
    m_t, d_t = meshed or bed.meshed_target, bed.direct_target(mode)
    r = PairedOverhead(Estimate(0, 0, 0, 0, ()))

    def pair() -> float:
        order = (d_t, m_t) if len(r.meshed_mean) % 2 == 0 else (m_t, d_t)
        got = {t: bed.load(t, mode, size, duration_s=run_s) for t in order}
        d, m = got[d_t], got[m_t]
        r.direct_mean.append(d.avg_us)
        r.meshed_mean.append(m.avg_us)
        r.direct_p50.append(d.p50_us)
        r.meshed_p50.append(m.p50_us)
        return m.avg_us - d.avg_us

    r.estimate = repeat_until(
        pair,
        rel_halfwidth=rel_halfwidth,
        min_runs=min_runs,
        max_runs=max_runs,
        budget_s=budget_s,
        clock=clock,
    )
    return r


@dataclass
class ProbeResult:
    """Paired probe windows of one mode and size.

    ``latency``: components per crossing (µs) from all windows of a kind summed (sidecar + Δapp
    + Δclient, see :mod:`~meshtax.profile.decompose`) — the per-message mean; two consecutive
    quick profiles agreed on more components with it than with per-field medians over the
    pairs (23 vs 19 of 36, BENCHMARKS.md issue #3); ``pooled``: the same (kept for readers of
    older records); ``median``: per-field medians over the pairs; ``sidecar_only``: pooled,
    without the app and client terms; ``per_pair``: each pair alone (their spread is the
    interval);
    ``overhead``: per-request overhead measured in the same probed windows.
    """

    latency: Breakdown
    pooled: Breakdown
    median: Breakdown
    sidecar_only: Breakdown
    per_pair: list[Breakdown]
    overhead: Estimate
    meshed_mean: list[float]
    direct_mean: list[float]
    requests: int
    dropped: int
    windows: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "latency_breakdown_us": self.latency.to_dict(),
            "pooled_breakdown_us": self.pooled.to_dict(),
            "median_breakdown_us": self.median.to_dict(),
            "sidecar_only_breakdown_us": self.sidecar_only.to_dict(),
            "per_pair_breakdown_us": [b.to_dict() for b in self.per_pair],
            "overhead_per_request_us": self.overhead.to_dict(),
            "meshed_mean_us": self.meshed_mean,
            "direct_mean_us": self.direct_mean,
            "requests": self.requests,
            "dropped_events": self.dropped,
            "windows": self.windows,
        }


_BD_FIELDS = tuple(f.name for f in fields(Breakdown))


def probe_components(
    bed: EchoBed,
    mode: Mode,
    size: int,
    sidecar_pid: int,
    *,
    run_s: float,
    pairs: int,
    probe_app: bool = True,
    probe: Callable[[System], ProbeSession] = _real_probe,
    meshed: str | None = None,
    probe_client: bool = True,
    rt_priority: int | None = None,
) -> ProbeResult:
    """``pairs`` × (a meshed and a direct probe window of ``run_s``, order alternating), the
    probe on the sidecar, (``probe_app``) the app and (``probe_client``) every process of the
    client pod → components and the probed overhead. ``rt_priority``: the windows run with
    app and this process (so each window's load generator, its child) at ``SCHED_FIFO`` of
    that priority and the sidecar one above (:func:`~meshtax.testbed.probes.realtime`)."""
    m_t, d_t = meshed or bed.meshed_target, bed.direct_target(mode)
    pids = [sidecar_pid, bed.app_pid] if probe_app else [sidecar_pid]
    # the load generator is a new process per window: follow its namespace, not a PID
    follow = bed.client_netns_path if probe_client and probe_app else None
    app_tgid = bed.app_pid if probe_app else None
    m_windows: list[Window] = []
    d_windows: list[Window] = []
    m_mean: list[float] = []
    d_mean: list[float] = []
    raw: list[dict[str, Any]] = []
    dropped = 0
    # a probe that can snapshot stays attached for all windows (each window = the difference
    # of two snapshots): no attach/detach per window (≈ 0.3 s each)
    held = probe(bed.system)
    snap = held if isinstance(held, SnapshotSession) else None
    if snap is None:
        held.close()
    else:
        _start_probe(snap, pids, follow)
    # the profiler itself too: each window's load generator is its child and inherits it.
    # The sidecar one above the rest: on CFS it preempts the app that woke it (the app's Go
    # runtime then parks); at equal FIFO priorities it would wait for that (measured: gRPC
    # Notification +15 µs per crossing, closure +19 %)
    prio: dict[int, int] = {}
    if rt_priority is not None:
        prio = {p: rt_priority for p in (*pids, os.getpid())}
        prio[sidecar_pid] = rt_priority + 1
    rt = False
    try:
        with realtime(bed.system, prio) as rt:
            last = snap.snapshot() if snap is not None else None
            for i in range(pairs):
                for target in (m_t, d_t) if i % 2 == 0 else (d_t, m_t):
                    if snap is not None and last is not None:
                        res = bed.load(target, mode, size, duration_s=run_s)
                        now = snap.snapshot()
                        reading, last = now.since(last), now
                    else:
                        res, reading = _probed_load(
                            bed, probe, pids, follow, target, mode, size, run_s
                        )
                    w = Window.of(reading, res.count, sidecar_tgid=sidecar_pid, app_tgid=app_tgid)
                    dropped += reading.dropped
                    is_m = target == m_t
                    (m_windows if is_m else d_windows).append(w)
                    (m_mean if is_m else d_mean).append(res.avg_us)
                    raw.append(
                        {
                            "meshed": is_m,
                            "requests": res.count,
                            "mean_us": res.avg_us,
                            "duration_ns": reading.duration_ns,
                            "ipc_packets": w.ipc_packets,
                            "ipc_ns": w.ipc_ns,
                            "ipc_bytes": w.ipc_bytes,
                            "probe_bpf_ns": reading.probe_ns,
                            "sidecar": _thread_dict(w.sidecar),
                            "app": _thread_dict(w.app),
                            "client": _thread_dict(w.client),
                            # per-event notification latencies, [bin, count, ns] in 2^shift ns bins
                            "notify_hist": {
                                k: [list(b) for b in t.notify_hist.bins]
                                for k, t in (
                                    ("sidecar", w.sidecar),
                                    ("app", w.app),
                                    ("client", w.client),
                                )
                            },
                            "notify_hist_shift": w.sidecar.notify_hist.shift,
                            "sched": f"fifo:{rt_priority}" if rt else "other",
                        }
                    )
    finally:
        held.close()

    def pooled(ws: list[Window]) -> Window:
        out = ws[0]
        for w in ws[1:]:
            out = out + w
        return out

    pm, pd = pooled(m_windows), pooled(d_windows)
    per_pair = [mesh_breakdown(m, d if probe_app else None) for m, d in zip(m_windows, d_windows)]
    diffs = [m - d for m, d in zip(m_mean, d_mean)]
    pooled_bd = mesh_breakdown(pm, pd if probe_app else None)
    return ProbeResult(
        latency=pooled_bd,
        pooled=pooled_bd,
        median=Breakdown(**{f: median([getattr(b, f) for b in per_pair]) for f in _BD_FIELDS}),
        sidecar_only=mesh_breakdown(pm, None),
        per_pair=per_pair,
        overhead=estimate(diffs),
        meshed_mean=m_mean,
        direct_mean=d_mean,
        requests=pm.requests,
        dropped=dropped,
        windows=raw,
    )


def _start_probe(session: ProbeSession, pids: list[int], follow: str | None) -> None:
    if follow is None:
        session.start(pids)  # sessions written before namespaces could be followed
    else:
        session.start(pids, follow_netns=follow)


def _probed_load(
    bed: EchoBed,
    probe: Callable[[System], ProbeSession],
    pids: list[int],
    follow: str | None,
    target: str,
    mode: Mode,
    size: int,
    run_s: float,
) -> tuple[LoadResult, ProbeReading]:
    """One load with a probe attached just for it (sessions that cannot snapshot)."""
    session = probe(bed.system)
    try:
        _start_probe(session, pids, follow)
        res = bed.load(target, mode, size, duration_s=run_s)
        return res, session.stop()
    finally:
        session.close()


def _thread_dict(t: ThreadReading) -> dict[str, int]:
    """The raw totals of a thread sum, for the record (ns and counts)."""
    return {
        "read_ns": t.read.ns,
        "read_n": t.read.count,
        "write_ns": t.write.ns,
        "write_n": t.write.count,
        "epoll_ns": t.epoll.ns,
        "epoll_n": t.epoll.count,
        "notify_ns": t.notify.ns,
        "notify_n": t.notify.count,
        "syscalls": t.syscalls,
        "sys_ns": t.sys_ns,
        "oncpu_ns": t.oncpu_ns,
        "user_ns": t.user_ns,
        "sys_cpu_ns": t.sys_cpu_ns,
        "switches_in": t.switches_in,
    }


def sidecar_cpu(
    bed: EchoBed,
    mode: Mode,
    size: int,
    qps: float,
    pid: int,
    *,
    run_s: float,
    perf: Callable[[System], CpuSampler] = _real_perf,
    schedstat_of: Callable[[int], Mapping[int, int]] = schedstat,
    meshed: str | None = None,
) -> tuple[LoadResult, Breakdown, float]:
    """One run at ``qps`` (0: as fast as possible) under perf → (load result, per-crossing
    CPU-µs of the sidecar process ``pid``, perf/schedstat ratio).

    perf gives the split, schedstat the total: perf starts sampling a few hundred ms after it
    is spawned and misses the start of the run, schedstat misses nothing; the buckets are
    scaled so their sum is schedstat's.
    """
    sampler = perf(bed.system)
    try:
        before = sum(schedstat_of(pid).values())
        sampler.start()
        res = bed.load(meshed or bed.meshed_target, mode, size, qps, duration_s=run_s)
        prof = sampler.stop([pid])
        after = sum(schedstat_of(pid).values())
    finally:
        sampler.close()
    buckets = {b.value: ns for b, ns in prof.process(pid).items() if b.value != "probe"}
    sampled = sum(buckets.values())
    ratio = sampled / (after - before) if after > before else 0.0
    if ratio > 0:
        buckets = {b: round(ns / ratio) for b, ns in buckets.items()}
    return res, cpu_breakdown(buckets, res.count), ratio


# --- the profile -----------------------------------------------------------------------------


def run_profile(
    options: ProfileOptions,
    system: System,
    store: ProfileSink | None,
    progress: Callable[[Progress], None] | None = None,
    *,
    backends: Backends | None = None,
) -> Profile:
    """Measure, decompose, fit, check closure, and save (when ``store`` is given).

    Raises whatever a tool raises (``LoadFailed``, ``EnvoyError``, ``ProbeError`` …) after the
    testbed is torn down; a profile that does not close is still returned and saved, with a
    provenance note and a :class:`ClosureWarning`.
    """
    be = backends or Backends()
    plan = options.resolve_plan()
    created = be.now()
    name = options.resolve_name(created)
    envoy_bin = be.envoy_binary or envoy_binary()
    fortio_bin = be.fortio_binary or fortio_binary()
    versions = {
        "envoy": envoy_version(system, envoy_bin),
        "fortio": fortio_version(system, fortio_bin),
    }
    be = replace(be, envoy_binary=envoy_bin, fortio_binary=fortio_bin)
    ticker = _Clocked(plan.steps(), progress, be.clock)
    t_start = be.clock()
    results: dict[Mode, list[_SizeResult]] = {}
    carried: dict[str, list[_SizeResult]] = {}
    with be.niceness(plan.nice), echo_testbed(system, plan.pinning, be) as bed:
        for mode in plan.modes:
            ticker.next("setup", mode)
            results[mode] = _measure_mode(mode, plan, bed, be, ticker)
            if mode is Mode.TCP:
                for proto in plan.carried:
                    carried[proto] = _measure_carried(proto, plan, bed, be, ticker)
    wall_s = be.clock() - t_start
    return _build_profile(
        name, created, plan, results, versions, wall_s, store, options.replace, carried=carried
    )


def _cpu_runs(
    bed: EchoBed,
    load_mode: Mode,
    size: int,
    pid: int,
    plan: Plan,
    be: Backends,
    ticker: _Clocked,
    *,
    fractions: Sequence[float],
    step_mode: Mode,
    protocol: str = "",
) -> tuple[float, list[_CpuRun]]:
    """The max-rate run, the fixed-rate runs at ``fractions`` of it, and the plan's low rates
    (at the sizes it gives them) → (max rate, CPU runs). ``load_mode``: the protocol the
    client speaks; ``step_mode``/``protocol``: the sidecar's mode and the carried protocol
    (progress steps)."""
    runs: list[_CpuRun] = []

    def cpu(qps: float, run_s: float) -> tuple[float, Breakdown, float]:
        res, bd, ratio = sidecar_cpu(
            bed, load_mode, size, qps, pid, run_s=run_s, perf=be.perf, schedstat_of=be.schedstat
        )
        return res.actual_qps, bd, ratio

    ticker.next("maxqps", step_mode, size, protocol=protocol)
    if 1.0 in fractions:
        max_run = _CpuRun("max", *cpu(0.0, plan.maxqps_run_s))
        max_qps = max_run.rate
    else:
        max_qps = bed.load(
            bed.meshed_target, load_mode, size, duration_s=plan.maxqps_run_s
        ).actual_qps
    for f in fractions:
        if f >= 1.0:
            runs.append(max_run)
            continue
        ticker.next("cpu", step_mode, size, f, protocol=protocol)
        runs.append(_CpuRun(f"f{f:g}", *cpu(max(f * max_qps, 1.0), plan.cpu_run_s)))
    if size in plan.low_rate_size_list():
        for rate in plan.low_rates:
            # a fixed rate near the maximum is not a low rate (and may not be sustained)
            if rate >= LOW_RATE_MAX_SHARE * max_qps:
                continue
            ticker.next("lowrate", step_mode, size, rate=rate, protocol=protocol)
            runs.append(_CpuRun(f"r{rate:g}", *cpu(rate, plan.low_rate_run_s)))
    return max_qps, runs


#: low-rate runs are skipped at sizes where they would exceed this share of the max rate
LOW_RATE_MAX_SHARE = 0.5


def _measure_carried(
    proto: str, plan: Plan, bed: EchoBed, be: Backends, ticker: _Clocked
) -> list[_SizeResult]:
    """A tcp-mode sidecar in front of the app's ``proto`` server, driven by ``proto``'s client:
    probe windows and CPU runs at the plan's carried sizes (no un-probed latency runs: the
    closure compares with the overhead of the same probed windows, as for the modes)."""
    load_mode = Mode(proto)
    ticker.next("setup", Mode.TCP, protocol=proto)
    cfg = EnvoyConfig(mode=Mode.TCP, inbound_upstream=("127.0.0.1", APP_PORTS[load_mode]))
    envoy = bed.start_sidecar(Mode.TCP, cfg, name=f"tcp-{proto}")
    assert envoy.process is not None
    pid = envoy.process.pid
    out: list[_SizeResult] = []
    try:
        for size in plan.carried_sizes():
            ticker.next("probe", Mode.TCP, size, protocol=proto)
            bed.load(bed.direct_target(load_mode), load_mode, size, n=plan.warmup_n)
            bed.load(bed.meshed_target, load_mode, size, n=plan.warmup_n)
            pr = probe_components(
                bed,
                load_mode,
                size,
                pid,
                run_s=plan.probe_run_s,
                pairs=plan.carried_probe_pairs,
                probe_app=plan.probe_app,
                probe=be.probe,
                rt_priority=plan.probe_rt_priority,
            )
            r = _SizeResult(size, None, pr)
            r.max_qps, r.cpu = _cpu_runs(
                bed,
                load_mode,
                size,
                pid,
                plan,
                be,
                ticker,
                fractions=plan.carried_rate_fractions,
                step_mode=Mode.TCP,
                protocol=proto,
            )
            out.append(r)
    finally:
        envoy.stop()
    return out


def _measure_mode(
    mode: Mode, plan: Plan, bed: EchoBed, be: Backends, ticker: _Clocked
) -> list[_SizeResult]:
    envoy = bed.start_sidecar(mode)
    assert envoy.process is not None
    pid = envoy.process.pid
    meshed, direct = bed.meshed_target, bed.direct_target(mode)
    out: list[_SizeResult] = []
    try:
        for size in plan.sizes:
            ticker.next("latency", mode, size)
            # warm both paths (connection set-up, allocator, caches) before anything counts
            bed.load(direct, mode, size, n=plan.warmup_n)
            bed.load(meshed, mode, size, n=plan.warmup_n)
            po = measure_overhead(
                bed,
                mode,
                size,
                run_s=plan.latency_run_s,
                rel_halfwidth=plan.latency_rel_halfwidth,
                min_runs=plan.latency_min_runs,
                max_runs=plan.latency_max_runs,
                budget_s=plan.latency_budget_s,
                clock=be.clock,
            )
            ticker.next("probe", mode, size)
            pr = probe_components(
                bed,
                mode,
                size,
                pid,
                run_s=plan.probe_run_s,
                pairs=plan.probe_pairs,
                probe_app=plan.probe_app,
                probe=be.probe,
                rt_priority=plan.probe_rt_priority,
            )
            r = _SizeResult(size, po, pr)
            r.max_qps, r.cpu = _cpu_runs(
                bed,
                mode,
                size,
                pid,
                plan,
                be,
                ticker,
                fractions=plan.rate_fractions,
                step_mode=mode,
            )
            out.append(r)
    finally:
        envoy.stop()
    return out


def _points(mode: Mode, rs: list[_SizeResult], tcp: Mapping[int, _SizeResult]) -> list[SizePoint]:
    pts: list[SizePoint] = []
    for r in rs:
        base = tcp.get(r.size)
        lat = assemble(mode, r.probed.latency, base.probed.latency if base else None)
        cpu: list[tuple[float, Mapping[Component, float]]] = []
        for run in r.cpu:
            like = base.cpu_like(run) if base else None
            cpu.append(
                (
                    run.rate,
                    assemble(mode, r.cpu_bd(run), base.cpu_bd(like) if base and like else None),
                )
            )
        # closure against the overhead of the same (probed) windows: like with like
        o = r.probed.overhead
        pts.append(
            SizePoint(
                r.size,
                lat,
                per_crossing(o.median),
                per_crossing(o.lo),
                per_crossing(o.hi),
                tuple(cpu),
            )
        )
    return pts


def _unprobed_closure(rs: Sequence[_SizeResult]) -> float:
    """Mean over sizes of the un-probed overhead per crossing (µs)."""
    return sum(per_crossing(r.overhead.median) for r in rs) / len(rs) if rs else 0.0


def _build_profile(
    name: str,
    created: _dt.datetime,
    plan: Plan,
    results: Mapping[Mode, list[_SizeResult]],
    versions: Mapping[str, str],
    wall_s: float,
    store: ProfileSink | None,
    replace: bool,
    *,
    carried: Mapping[str, list[_SizeResult]] | None = None,
) -> Profile:
    tcp = {r.size: r for r in results.get(Mode.TCP, [])}
    carried = {p: rs for p, rs in (carried or {}).items() if rs}
    modes: list[ModeProfile] = []
    notes: list[str] = [
        "models are per message crossing one sidecar one way; measured per request through "
        "one inbound sidecar (request + response = 2 crossings), halved",
        "latency components = the sidecar's on-path time + the change of the app's own path "
        "(meshed − direct), from paired eBPF probe windows on sidecar and app (definitions: "
        "meshtax.profile.decompose); the closure compares them with the overhead measured in "
        "those same probed windows (mean latency with sidecar minus without)",
        "the un-probed overhead (paired runs, no probe) and the probe perturbation (probed − "
        "un-probed overhead) are in options.measurements and "
        "options.probe_perturbation_us_per_request",
        "CPU components = the sidecar's CPU (perf split scaled to schedstat) + the app's "
        "user-space CPU change (meshed − direct, from the probe windows: it parses what the "
        "sidecar adds), so Parsing counts both; the app's kernel-side change is not counted "
        "(it depends on the placement of client and app)",
    ]
    if Mode.TCP not in results:
        notes.append("no TCP mode measured: Parsing is not separated from Other")
    for mode, rs in results.items():
        mp = fit_mode(
            mode,
            _points(mode, rs, tcp),
            candidates=plan.split_candidates,
            tolerance=plan.closure_tolerance,
        )
        if mode is Mode.TCP and carried:
            mp = fit_carried(
                mp,
                {p: _points(Mode.TCP, crs, {}) for p, crs in carried.items()},
                candidates=plan.split_candidates,
                tolerance=plan.closure_tolerance,
            )
            for p, cmp_ in sorted(mp.carried.items()):
                cc = cmp_.closure
                notes.append(
                    f"tcp carrying {p}: a tcp-mode sidecar in front of the app's {p} server, "
                    f"driven by fortio's {p} client; per crossing = per message direction of "
                    "one call; latency components from probe windows only (closure against "
                    "their own overhead"
                    + (
                        f": components {cc.components_us:.1f} µs vs {cc.measured_us:.1f} µs, "
                        f"{cc.error:+.0%})"
                        if cc is not None
                        else ")"
                    )
                )
        modes.append(mp)
        c = mp.closure
        if c is not None and not c.closes:
            msg = (
                f"{mode.value}: components sum to {c.components_us:.1f} µs per message but the "
                f"measured overhead is {c.measured_us:.1f} µs [{c.measured_lo_us:.1f}, "
                f"{c.measured_hi_us:.1f}]: error {c.error:+.0%} exceeds ±{c.tolerance:.0%} "
                "— this profile does NOT close"
            )
            notes.append("NOT CLOSED: " + msg)
            warnings.warn(msg, ClosureWarning, stacklevel=2)
        un = _unprobed_closure(rs)
        if c is not None:
            notes.append(
                f"{mode.value}: un-probed overhead {un:.1f} µs per message; components "
                f"{c.components_us:.1f} µs are {c.components_us / un - 1:+.0%} of it"
                if un
                else f"{mode.value}: un-probed overhead 0"
            )
    perturb = {m.value: {str(r.size): r.perturbation_us for r in rs} for m, rs in results.items()}
    options: dict[str, Any] = {
        **plan.to_dict(),
        "pinning_described": plan.pinning.describe(),
        "envoy_version": versions["envoy"],
        "fortio_version": versions["fortio"],
        "config_hash": _family_hash(),
        "probe_perturbation_us_per_request": perturb,
        "wall_time_s": wall_s,
        "measurements": {m.value: [r.to_dict() for r in rs] for m, rs in results.items()},
        "carried_measurements": {p: [r.to_dict() for r in rs] for p, rs in carried.items()},
    }
    profile = Profile(
        name=name,
        platform=this_host("envoy", versions["envoy"], _family_hash()),
        provenance=Provenance(
            source="measured",
            by="meshtax profile",
            created=created.isoformat(timespec="seconds"),
            tool_version=__version__,
            options=options,
            notes=tuple(notes),
        ),
        modes={m.mode: m for m in modes},
    )
    if store is not None:
        store.save(profile, replace=replace)
    return profile
