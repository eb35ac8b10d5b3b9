"""``run_profile``: measure this machine's sidecar and store a :class:`Profile`.

Testbed (one run)::

    pod client  (fortio load, no sidecar, CPU pinning.client)
       │ veth/bridge
    pod server  (meshed)  :8080 ──iptables──► Envoy :15006 (uid 1337, pinning.sidecars)
                                                 └─ 127.0.0.1:<app port> ─► fortio echo (pinning.app)
                          :<app port> (excluded from interception) ─► the same fortio echo

So "with sidecar" targets ``server:8080`` and "without" targets the app port directly — the
same echo process, in the same run, alternating. For each mode (TCP first, so HTTP/gRPC
parsing can subtract it) and size: paired latency runs → measured overhead with a 95 %
interval; one probe window → components; a max-rate run; fixed-rate runs under perf → CPU
per component. Then :mod:`~meshtax.profile.fit` fits models and checks closure.

Every side effect goes through :class:`System` and the injectable :class:`Backends`, so the
orchestration runs against fakes in tests.
"""

from __future__ import annotations

import datetime as _dt
import socket
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from meshtax import __version__
from meshtax.model.components import Component
from meshtax.model.profile import ModeProfile, Profile, Provenance
from meshtax.model.sidecar import Mode
from meshtax.host import this_host
from meshtax.profile.decompose import (
    Breakdown,
    assemble,
    cpu_breakdown,
    latency_breakdown,
    per_crossing,
)
from meshtax.profile.envoy import EnvoyConfig, EnvoyProcess, config_hash, envoy_binary, envoy_version
from meshtax.profile.fit import SizePoint, fit_mode
from meshtax.profile.fortio import FortioServer, LoadResult, fortio_binary, fortio_version, run_load
from meshtax.profile.perfcpu import PerfProfile, PerfSession, schedstat
from meshtax.profile.plan import Plan, Step, full_plan, quick_plan
from meshtax.profile.probes import ProbeSession, RealProbe
from meshtax.profile.runstate import STATE_DIR, ProcOps
from meshtax.profile.stats import Estimate, median, repeat_until
from meshtax.profile.system import System
from meshtax.profile.testbed import Pod, Testbed

__all__ = [
    "APP_PORTS",
    "SERVICE_PORT",
    "Backends",
    "ClosureWarning",
    "CpuSampler",
    "ProfileOptions",
    "Progress",
    "ProfileSink",
    "run_profile",
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

    ``modes``/``sizes``/``duration_s`` override the preset (``quick`` or full); ``plan``, if
    given, replaces the preset entirely. ``name`` defaults to ``<hostname>-<UTC time>``.
    """

    name: str | None = None
    quick: bool = False
    modes: tuple[Mode | str, ...] | None = None
    sizes: tuple[int, ...] | None = None
    duration_s: float | None = None
    replace: bool = False
    plan: Plan | None = None

    def resolve_plan(self) -> Plan:
        p = self.plan or (quick_plan() if self.quick else full_plan())
        changes: dict[str, Any] = {}
        if self.modes:
            changes["modes"] = tuple(Mode(m) for m in self.modes)
        if self.sizes:
            changes["sizes"] = tuple(self.sizes)
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
    now: Callable[[], _dt.datetime] = field(default=lambda: _dt.datetime.now(_dt.timezone.utc))


@dataclass
class _SizeResult:
    size: int
    overhead: Estimate  # per request, µs (meshed − direct mean)
    meshed_mean: list[float]
    direct_mean: list[float]
    meshed_p50: list[float]
    direct_p50: list[float]
    probe_mean_us: float = 0.0
    probe_requests: int = 0
    probe_dropped: int = 0
    probe_bpf_us: float = 0.0  # the probe's own BPF run time per crossing
    latency: Breakdown = field(default_factory=Breakdown)
    max_qps: float = 0.0
    cpu: list[tuple[float, Breakdown, float]] = field(default_factory=list)  # rate, bd, perf/schedstat

    @property
    def perturbation_us(self) -> float:
        """Probe run mean latency minus the un-probed meshed mean, per request."""
        return self.probe_mean_us - median(self.meshed_mean)

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "overhead_per_request_us": self.overhead.to_dict(),
            "meshed_mean_us": self.meshed_mean,
            "direct_mean_us": self.direct_mean,
            "meshed_p50_us": self.meshed_p50,
            "direct_p50_us": self.direct_p50,
            "probe": {
                "mean_us": self.probe_mean_us,
                "requests": self.probe_requests,
                "perturbation_us": self.perturbation_us,
                "dropped_events": self.probe_dropped,
                "bpf_us_per_message": self.probe_bpf_us,
            },
            "latency_breakdown_us": self.latency.to_dict(),
            "max_qps": self.max_qps,
            "cpu": [
                {"rate": r, "breakdown_us": bd.to_dict(), "perf_over_schedstat": ratio}
                for r, bd, ratio in self.cpu
            ],
        }


class _Clocked:
    """Progress bookkeeping: expected seconds of each step, scaled by how the run is going."""

    def __init__(self, steps: list[Step], progress: Callable[[Progress], None] | None,
                 clock: Callable[[], float]) -> None:  # fmt: skip
        self.steps = steps
        self.total_expected = sum(s.expected_s for s in steps) or 1.0
        self.progress = progress
        self.clock = clock
        self.t0 = clock()
        self.i = 0
        self.done_expected = 0.0

    def next(self, kind: str, mode: Mode, size: int = 0, fraction: float = 0.0) -> None:
        # steps are announced in plan order; find this one (robust if the plan skips some)
        while self.i < len(self.steps):
            st = self.steps[self.i]
            self.i += 1
            if (st.kind, st.mode, st.size, st.rate_fraction) == (kind, mode, size, fraction):
                break
            self.done_expected += st.expected_s
        else:
            return
        elapsed = self.clock() - self.t0
        frac = self.done_expected / self.total_expected
        pace = elapsed / self.done_expected if self.done_expected > 0 else 1.0
        remaining = self.total_expected - self.done_expected
        if self.progress is not None:
            self.progress(Progress(self.i, len(self.steps), st, elapsed, remaining * max(pace, 0.5), frac))
        self.done_expected += st.expected_s


def _family_hash() -> str:
    """One hash for the sidecar configs of all modes (a profile's platform key must not
    depend on which modes a run chose)."""
    return config_hash({m.value: EnvoyConfig(mode=m).key() for m in Mode})


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
    ticker = _Clocked(plan.steps(), progress, be.clock)
    t_start = be.clock()
    work = be.workdir or Path(tempfile.mkdtemp(prefix="meshtax-profile-"))
    results: dict[Mode, list[_SizeResult]] = {}

    with Testbed(system, state_dir=be.state_dir, lock_timeout=be.lock_timeout, procs=be.procs) as tb:
        client = tb.add_pod("client")
        server = tb.add_pod("server")
        tb.mesh(server, proxy_uid=PROXY_UID,
                exclude_inbound_ports=(15000, 15090, *APP_PORTS.values()))  # fmt: skip
        app = FortioServer(
            system, work / "app", host="0.0.0.0",
            http_port=APP_PORTS[Mode.HTTP], grpc_port=APP_PORTS[Mode.GRPC], tcp_port=APP_PORTS[Mode.TCP],
            place=server.place(cpus=plan.pinning.app), binary=fortio_bin,
        )  # fmt: skip
        app.start()
        assert app.process is not None
        tb.adopt(app.process, app.argv, netns=server.netns)
        for mode in plan.modes:
            ticker.next("setup", mode)
            results[mode] = _measure_mode(mode, plan, system, tb, client, server, envoy_bin, fortio_bin, work, be, ticker)
        app.stop()

    wall_s = be.clock() - t_start
    return _build_profile(name, created, plan, results, versions, wall_s, store, options.replace)


def _measure_mode(
    mode: Mode, plan: Plan, system: System, tb: Testbed, client: Pod, server: Pod,
    envoy_bin: Path, fortio_bin: Path, work: Path, be: Backends, ticker: _Clocked,
) -> list[_SizeResult]:  # fmt: skip
    cfg = EnvoyConfig(mode=mode, inbound_upstream=("127.0.0.1", APP_PORTS[mode]))
    envoy = EnvoyProcess(system, cfg, work / mode.value,
                         place=server.place(cpus=plan.pinning.sidecars, uid=PROXY_UID), binary=envoy_bin)  # fmt: skip
    envoy.start()
    assert envoy.process is not None
    tb.adopt(envoy.process, ["envoy", mode.value], netns=server.netns)
    pid = envoy.process.pid
    meshed = f"{server.ip}:{SERVICE_PORT}"
    direct = f"{server.ip}:{APP_PORTS[mode]}"
    cplace = client.place(cpus=plan.pinning.client)

    def load(target: str, size: int, qps: float = 0.0, *, duration: float | None = None,
             n: int | None = None) -> LoadResult:  # fmt: skip
        return run_load(target, mode, size, qps, duration_s=duration, n=n, system=system,
                        place=cplace, binary=fortio_bin)  # fmt: skip

    out: list[_SizeResult] = []
    try:
        for size in plan.sizes:
            ticker.next("latency", mode, size)
            # warm both paths (connection set-up, allocator, caches) before anything counts
            load(direct, size, n=plan.warmup_n)
            load(meshed, size, n=plan.warmup_n)
            r = _latency(plan, size, load, meshed, direct, be.clock)

            ticker.next("probe", mode, size)
            probe = be.probe(system)
            try:
                probe.start([pid])
                pr = load(meshed, size, duration=plan.probe_run_s)
                reading = probe.stop()
            finally:
                probe.close()
            r.probe_mean_us = pr.avg_us
            r.probe_requests = pr.count
            r.probe_dropped = reading.dropped
            r.probe_bpf_us = reading.probe_ns * 1e-3 / (2 * pr.count)
            r.latency = latency_breakdown(reading, pr.count)

            ticker.next("maxqps", mode, size)
            r.max_qps = load(meshed, size, duration=plan.maxqps_run_s).actual_qps

            for f in plan.rate_fractions:
                ticker.next("cpu", mode, size, f)
                r.cpu.append(_cpu_run(f * r.max_qps, size, plan, load, meshed, pid, system, be))
            out.append(r)
    finally:
        envoy.stop()
    return out


def _latency(
    plan: Plan, size: int, load: Callable[..., LoadResult], meshed: str, direct: str,
    clock: Callable[[], float],
) -> _SizeResult:  # fmt: skip
    r = _SizeResult(size, Estimate(0, 0, 0, 0, ()), [], [], [], [])

    def pair() -> float:
        # alternate which side goes first so a drifting machine does not bias the difference
        first_direct = len(r.meshed_mean) % 2 == 0
        order = (direct, meshed) if first_direct else (meshed, direct)
        got = {t: load(t, size, duration=plan.latency_run_s) for t in order}
        d, m = got[direct], got[meshed]
        r.direct_mean.append(d.avg_us)
        r.meshed_mean.append(m.avg_us)
        r.direct_p50.append(d.p50_us)
        r.meshed_p50.append(m.p50_us)
        # means, not p50s: components are means too, and fortio's p50 is bucket-interpolated
        return m.avg_us - d.avg_us

    r.overhead = repeat_until(pair, rel_halfwidth=plan.latency_rel_halfwidth,
                              min_runs=plan.latency_min_runs, max_runs=plan.latency_max_runs,
                              budget_s=plan.latency_budget_s, clock=clock)  # fmt: skip
    return r


def _cpu_run(
    qps: float, size: int, plan: Plan, load: Callable[..., LoadResult], meshed: str, pid: int,
    system: System, be: Backends,
) -> tuple[float, Breakdown, float]:  # fmt: skip
    perf = be.perf(system)
    try:
        before = sum(be.schedstat(pid).values())
        perf.start()
        res = load(meshed, size, max(qps, 1.0), duration=plan.cpu_run_s)
        prof = perf.stop([pid])
        after = sum(be.schedstat(pid).values())
    finally:
        perf.close()
    buckets = {b.value: ns for b, ns in prof.process(pid).items() if b.value != "probe"}
    sampled = sum(buckets.values())
    ratio = sampled / (after - before) if after > before else 0.0
    if ratio > 0:
        # perf gives the split, schedstat the total: perf starts sampling a few hundred ms
        # after it is spawned and misses the start of the run, schedstat misses nothing
        buckets = {b: round(ns / ratio) for b, ns in buckets.items()}
    return res.actual_qps, cpu_breakdown(buckets, res.count), ratio


def _points(mode: Mode, rs: list[_SizeResult], tcp: Mapping[int, _SizeResult]) -> list[SizePoint]:
    pts: list[SizePoint] = []
    for r in rs:
        base = tcp.get(r.size)
        lat = assemble(mode, r.latency, base.latency if base else None)
        cpu: list[tuple[float, Mapping[Component, float]]] = []
        for i, (rate, bd, _) in enumerate(r.cpu):
            bbd = base.cpu[min(i, len(base.cpu) - 1)][1] if base and base.cpu else None
            cpu.append((rate, assemble(mode, bd, bbd)))
        o = r.overhead
        pts.append(SizePoint(r.size, lat, per_crossing(o.median), per_crossing(o.lo),
                             per_crossing(o.hi), tuple(cpu)))  # fmt: skip
    return pts


def _build_profile(
    name: str, created: _dt.datetime, plan: Plan, results: Mapping[Mode, list[_SizeResult]],
    versions: Mapping[str, str], wall_s: float, store: ProfileSink | None, replace: bool,
) -> Profile:  # fmt: skip
    tcp = {r.size: r for r in results.get(Mode.TCP, [])}
    modes: list[ModeProfile] = []
    notes: list[str] = [
        "models are per message crossing one sidecar one way; measured per request through "
        "one inbound sidecar (request + response = 2 crossings), halved",
        "latency components from one eBPF probe window; overhead = mean latency with sidecar "
        "minus without, paired runs in the same testbed",
    ]
    if Mode.TCP not in results:
        notes.append("no TCP mode measured: Parsing is not separated from Other")
    for mode, rs in results.items():
        mp = fit_mode(mode, _points(mode, rs, tcp), candidates=plan.split_candidates,
                      tolerance=plan.closure_tolerance)  # fmt: skip
        modes.append(mp)
        c = mp.closure
        if c is not None and not c.closes:
            msg = (f"{mode.value}: components sum to {c.components_us:.1f} µs per message but the "
                   f"measured overhead is {c.measured_us:.1f} µs [{c.measured_lo_us:.1f}, "
                   f"{c.measured_hi_us:.1f}]: error {c.error:+.0%} exceeds ±{c.tolerance:.0%} "
                   "— this profile does NOT close")  # fmt: skip
            notes.append("NOT CLOSED: " + msg)
            warnings.warn(msg, ClosureWarning, stacklevel=2)
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
