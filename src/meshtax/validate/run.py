"""``meshtax validate``: measured vs predicted sidecar overhead on real multi-service apps.

Per case (one query of a topology × one sidecar mode), in one testbed:

- a client pod (fortio) and two copies of the query's services, one pod per service: one copy
  without mesh, one with Istio-style interception and an Envoy sidecar in every pod
  (``role: db`` services in tcp mode, as Istio treats their non-HTTP ports);
- the app speaks what the mode parses: tcp keeps the topology's protocols, http makes every
  service HTTP/1.1, grpc every service gRPC (an HTTP/1.1 app behind an HTTP/2-only sidecar
  would fail, as it would in Istio);
- fortio drives each copy in turn at the same fixed rate; the CPU of every process of every
  pod comes from ``/proc/PID/task/*/schedstat`` around each run; pairs repeat until the
  overheads' intervals are tight (:mod:`meshtax.validate.pairing`);
- both copies trace 1 in ``sample`` requests (same cost on both sides); the no-mesh copy's
  traces become the ECG, predicted with this machine's profile
  (:mod:`meshtax.validate.prediction`).

Placement: the profile's own pinning (client on one CPU, every app and sidecar on the other
on this 2-core machine), so the costs compared were measured under the same placement.

Everything (pods, iptables rules, processes) lives in the testbed and is removed when the case
ends, also on errors and Ctrl-C. The testbed lock is held per case only, so other users of the
machine can interleave.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from meshtax.model.profile import Platform, Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.profile.plan import default_pinning
from meshtax.testbed.envoy.config import EnvoyConfig, EnvoyProcess, envoy_binary
from meshtax.testbed.fortio import FortioServer, LoadResult, fortio_binary, run_load
from meshtax.testbed.host import this_host
from meshtax.testbed.perf import PerfError, schedstat
from meshtax.testbed.pinning import Pinning
from meshtax.testbed.pods import Pod, Testbed
from meshtax.testbed.system import System
from meshtax.validate import appctl
from meshtax.validate.pairing import PairPolicy, measure_pairs
from meshtax.validate.prediction import one_hop, predict_traces
from meshtax.validate.result import CaseResult, Predicted, RunSample, ValidationResult

__all__ = [
    "APP_PORT",
    "PROXY_UID",
    "SweepPoint",
    "SweepResult",
    "ValidateOptions",
    "app_protocol",
    "choose_profile",
    "pinning_of",
    "run_case",
    "run_sweep",
    "run_validation",
    "sidecar_modes",
]

APP_PORT = 9080
PROXY_UID = 1337
ECHO_PORTS = {Mode.HTTP: 8080, Mode.GRPC: 8079, Mode.TCP: 8078}

Progress = Callable[[str], None]


class ProfileSource(Protocol):
    """What run_validation needs of a store (``ProfileStore`` satisfies it)."""

    def get(self, name: str) -> Profile: ...

    def for_host(self, host: Platform) -> Profile | None: ...


@dataclass(frozen=True)
class ValidateOptions:
    """Options of ``meshtax validate``; echoed in the result document.

    ``queries``: empty → every query of the topology. ``rate``: requests/s of every run (0:
    closed loop with one request in flight, as the profiler measures latency; the prediction
    then uses the rate the no-mesh side reached).
    ``duration_s``: seconds per run. ``quick``: shorter runs and fewer pairs (CI, smoke).
    ``filters``/``mtls``: not supported yet (refused rather than silently ignored).
    ``traces_dir``: keep each case's no-mesh traces there as ``<topology>-<query>-<mode>.json``
    (the prediction's input, so another profile or model can be compared on the same runs).
    """

    topology: str
    queries: tuple[str, ...] = ()
    modes: tuple[Mode, ...] = (Mode.TCP, Mode.HTTP, Mode.GRPC)
    filters: tuple[str, ...] = ()
    mtls: bool = False
    rate: float = 200.0
    duration_s: float = 3.0
    profile_name: str | None = None
    report_path: str | None = None
    quick: bool = False
    sample: int = 10
    min_pairs: int = 6
    max_pairs: int = 10
    warmup_n: int = 300
    lock_timeout_s: float = 900.0
    keep_workdir: bool = False
    traces_dir: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "modes", tuple(Mode(m) for m in self.modes))
        if self.filters or self.mtls:
            raise ValueError("validate: filter chains and mTLS are not supported yet")
        if self.rate < 0 or self.duration_s <= 0:
            raise ValueError("rate must be >= 0 (0: closed loop) and duration positive")

    def policy(self) -> PairPolicy:
        if self.quick:
            return PairPolicy(min_pairs=3, max_pairs=3, budget_s=None)
        return PairPolicy(min_pairs=self.min_pairs, max_pairs=self.max_pairs, budget_s=None)

    def run_s(self) -> float:
        return min(self.duration_s, 1.0) if self.quick else self.duration_s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["modes"] = [m.value for m in self.modes]
        return d


def app_protocol(mode: Mode) -> appctl.Protocol | None:
    """The protocol every service speaks in ``mode`` (None: the topology's own)."""
    table: dict[Mode, appctl.Protocol | None] = {
        Mode.TCP: None,
        Mode.HTTP: "http",
        Mode.GRPC: "grpc",
    }
    return table[mode]


def sidecar_modes(
    topology: appctl.Topology, services: Sequence[str], mode: Mode
) -> dict[str, Mode]:
    """Each service's sidecar mode: ``mode``, but tcp for ``role: db`` services."""
    return {s: Mode.TCP if topology.services[s].role == "db" else mode for s in services}


def machine() -> dict[str, Any]:
    """Where the numbers come from (with the load average, as the machine is shared)."""
    h = this_host()
    return {
        "host": h.describe(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "loadavg": os.getloadavg(),
    }


def _pod_pids(system: System, pod: Pod) -> list[int]:
    out = system.run(["ip", "netns", "pids", pod.netns]).stdout
    return [int(x) for x in out.split()]


def _cpu_ns(pids: Sequence[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for p in pids:
        try:
            out[p] = sum(schedstat(p).values())
        except PerfError:
            out[p] = 0  # exited: counted as nothing (it would show in the run's errors)
    return out


@dataclass
class _Side:
    """One deployed copy: its pods, their processes, the fortio target."""

    name: str
    pods: dict[str, Pod]
    deployment: appctl.Deployment
    app: appctl.RunningApp | None = None
    envoys: dict[str, EnvoyProcess] = field(default_factory=dict)
    pids: dict[str, list[int]] = field(default_factory=dict)

    def sidecar_pids(self) -> set[int]:
        return {e.process.pid for e in self.envoys.values() if e.process is not None}


def _run_once(
    side: _Side,
    load: Callable[[str, Mode], LoadResult],
    mode: Mode,
    cpu: Callable[[Sequence[int]], dict[int, int]],
) -> RunSample:
    every = [p for ps in side.pids.values() for p in ps]
    before = cpu(every)
    r = load(side.deployment.entry_target, mode)
    after = cpu(every)
    per_service = {
        s: sum(after.get(p, 0) - before.get(p, 0) for p in ps) for s, ps in side.pids.items()
    }
    sc = side.sidecar_pids()
    sidecar_ns = sum(after.get(p, 0) - before.get(p, 0) for p in sc)
    return RunSample(
        r.p50_us, r.p90_us, r.avg_us, r.count, r.actual_qps, r.duration_s, per_service, sidecar_ns
    )


def run_case(
    topology: appctl.Topology,
    query: str,
    mode: Mode,
    profile: Profile,
    options: ValidateOptions,
    system: System,
    workdir: Path,
    pinning: Pinning,
    progress: Progress | None = None,
) -> CaseResult:
    """Measure and predict one case (see the module docstring); errors become the case's
    ``error`` after the testbed is gone."""
    say = progress or (lambda _m: None)
    t0 = time.monotonic()
    q = topology.query(query)
    names = topology.reachable(q)
    modes = sidecar_modes(topology, names, mode)
    proto = app_protocol(mode)
    meshapp = appctl.ensure_built(system)
    fortio_bin = fortio_binary()
    envoy_bin = envoy_binary()
    work = workdir / f"{topology.name}-{q.name}-{mode.value}"
    work.mkdir(parents=True, exist_ok=True)
    result = CaseResult(
        topology.name,
        q.name,
        mode.value,
        options.rate,
        sidecar_modes={s: m.value for s, m in modes.items()},
    )
    try:
        with Testbed(system, lock_timeout=options.lock_timeout_s) as tb:
            client = tb.add_pod("client")
            sides: dict[str, _Side] = {}
            for tag, sname in (("b", "no_mesh"), ("m", "mesh")):
                pods = {s: tb.add_pod(f"{tag}{i}") for i, s in enumerate(names)}
                d = appctl.plan(
                    topology,
                    q.name,
                    workdir=work / sname,
                    hosts={s: p.ip for s, p in pods.items()},
                    ports=APP_PORT,
                    binary=meshapp,
                    sample=options.sample,
                    entry_protocol=proto,
                    backend_protocol=proto,
                )
                sides[sname] = _Side(sname, pods, d)
            mesh = sides["mesh"]
            for s, pod in mesh.pods.items():
                tb.mesh(pod, proxy_uid=PROXY_UID)
                cfg = EnvoyConfig(
                    mode=modes[s],
                    inbound_upstream=("127.0.0.1", APP_PORT),
                    circuit_breaker_max=2**32 - 1,
                )
                env = EnvoyProcess(
                    system,
                    cfg,
                    work / "mesh" / f"envoy-{s}",
                    place=pod.place(cpus=pinning.sidecars, uid=PROXY_UID),
                    binary=envoy_bin,
                )
                env.start()
                assert env.process is not None
                tb.adopt(env.process, ["envoy", s], netns=pod.netns)
                mesh.envoys[s] = env
            for side in sides.values():
                (work / side.name).mkdir(parents=True, exist_ok=True)
                side.app = appctl.start(
                    side.deployment, appctl.testbed_spawner(tb, side.pods, cpus=pinning.app)
                )
                side.pids = {s: _pod_pids(system, p) for s, p in side.pods.items()}
            cplace = client.place(cpus=pinning.client)
            fmode = Mode(sides["no_mesh"].deployment.entry_mode)

            def load(target: str, m: Mode, *, n: int | None = None) -> LoadResult:
                return run_load(
                    target,
                    m,
                    0,
                    options.rate,
                    duration_s=None if n else options.run_s(),
                    n=n,
                    system=system,
                    place=cplace,
                    binary=fortio_bin,
                )

            say(f"{topology.name}/{q.name} {mode.value}: warm-up")
            for side in sides.values():
                load(side.deployment.entry_target, fmode, n=options.warmup_n)

            def one(side_name: str) -> RunSample:
                return _run_once(sides[side_name], lambda t, m: load(t, m), fmode, _cpu_ns)

            say(f"{topology.name}/{q.name} {mode.value}: paired runs")
            pairs, why = measure_pairs(one, options.policy())
            for side in sides.values():
                if side.app is not None:
                    side.app.stop()  # SIGTERM: the spans are flushed
            trace = appctl.write_merged_traces(
                sides["no_mesh"].deployment.trace_files, work / "no_mesh-traces.json"
            )
            if options.traces_dir:
                kept = Path(options.traces_dir)
                kept.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(trace, kept / f"{topology.name}-{q.name}-{mode.value}.json")
            for env in mesh.envoys.values():
                env.stop()
        say(f"{topology.name}/{q.name} {mode.value}: predict")
        rate = options.rate or statistics.median(b.actual_qps for b, _ in pairs)
        pred: Predicted = predict_traces(
            trace,
            profile,
            {s: SidecarConfig(m) for s, m in modes.items()},
            rate,
            pod_cpus=pinning.pod_cpus(),
        )
        result = CaseResult(
            topology.name,
            q.name,
            mode.value,
            rate,
            tuple(pairs),
            pred,
            result.sidecar_modes,
            wall_s=time.monotonic() - t0,
        )
        del why
    except Exception as e:  # one failed case must not lose the others
        result = CaseResult(
            topology.name,
            q.name,
            mode.value,
            options.rate,
            sidecar_modes=result.sidecar_modes,
            error=f"{type(e).__name__}: {e}",
            wall_s=time.monotonic() - t0,
        )
    return result


def pinning_of(profile: Profile) -> Pinning:
    d = profile.provenance.options.get("pinning")
    return Pinning.from_dict(d) if isinstance(d, dict) else default_pinning()


def choose_profile(store: ProfileSource, name: str | None) -> Profile:
    if name is not None:
        return store.get(name)
    p = store.for_host(this_host())
    if p is None:
        raise ValueError(
            "no profile of this machine: run `meshtax profile --quick` (as root) first, or pass --profile"
        )
    return p


def run_validation(
    options: ValidateOptions, system: System, store: ProfileSource, progress: Progress | None = None
) -> ValidationResult:
    """Every (query, mode) case of ``options.topology``; writes ``options.report_path`` (JSON,
    or HTML through the report builder when it ends in .html) when given."""
    topo = appctl.load_topology(options.topology)
    queries = options.queries or tuple(topo.queries)
    profile = choose_profile(store, options.profile_name)
    pinning = pinning_of(profile)
    work = Path(tempfile.mkdtemp(prefix="meshtax-validate-"))
    cases: list[CaseResult] = []
    load_before = os.getloadavg()
    try:
        for qn in queries:
            for m in options.modes:
                cases.append(
                    run_case(topo, qn, m, profile, options, system, work, pinning, progress)
                )
    finally:
        if not options.keep_workdir:
            shutil.rmtree(work, ignore_errors=True)
    mach = machine()
    mach["loadavg_before"] = load_before
    res = ValidationResult(
        name=topo.name,
        cases=tuple(cases),
        profile=profile.name,
        machine=mach,
        options={**options.to_dict(), "pinning": pinning.describe()},
        notes=_notes(pinning, profile),
    )
    if options.report_path:
        write_report(res.to_document(), options.report_path)
    return res


def _notes(pinning: Pinning, profile: Profile) -> tuple[str, ...]:
    col = profile.colocation
    return (
        f"placement {pinning.describe()}: the profile's own pinning (client apart, apps and sidecars together), so measured and modelled costs share it; "
        f"the prediction knows the pods share {pinning.pod_cpus()} CPU(s) (latency overhead ≥ the request's sidecar CPU work ÷ that)",
        "latency: client-side p50/p90 of fortio at a fixed rate, mesh − no mesh per pair; CPU: schedstat of every process of every pod, per request, mesh − no mesh",
        "prediction: OTLP traces of the no-mesh copy imported by meshtax.traces (sizes from span attributes, rate = the fortio rate), this machine's profile",
        "role: db services get tcp-mode sidecars (Istio does not parse their protocols)",
        "shared CPUs: messages priced at r_own^(1−α)·r_cpu^α with "
        + "; ".join(
            f"α = {c.alpha:.2f} [{c.lo:.2f}, {c.hi:.2f}] in {m.value} mode (`meshtax calibrate`: {c.note})"
            if (c := col.get(m))
            else f"α = 1 in {m.value} mode (not calibrated: `meshtax calibrate`)"
            for m in profile.modes
        ),
    )


def write_report(
    doc: Mapping[str, Any] | Sequence[Mapping[str, Any]], path: str | os.PathLike[str]
) -> Path:
    """JSON of the document(s), or an HTML report (``.html``) via the report builder."""
    import json

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    docs = [doc] if isinstance(doc, Mapping) else list(doc)
    if out.suffix == ".html":
        from meshtax.report.build import ReportInputs, build_report

        return build_report(
            extra=ReportInputs(validations=docs, title="meshtax validation"), out_path=out
        )
    out.write_text(json.dumps(docs[0] if len(docs) == 1 else docs, indent=1, default=float))
    return out


# ---- sweeps: one hop, message size and rate (Figures 10, 11) -------------------------------


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep: x (bytes or fraction of the no-mesh max) and its paired runs."""

    x: float
    size_bytes: int
    rate: float
    pairs: tuple[tuple[RunSample, RunSample], ...]
    predicted: Predicted


@dataclass(frozen=True)
class SweepResult:
    """A one-hop sweep: client (no mesh) → echo server with a sidecar in ``mode``."""

    kind: Literal["size", "rate"]
    mode: str
    points: tuple[SweepPoint, ...]
    profile: str
    max_qps_no_mesh: float = 0.0
    machine: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    def cases(self) -> list[CaseResult]:
        out = []
        for p in self.points:
            label = (
                f"{p.size_bytes} B" if self.kind == "size" else f"{p.x:.0%} of max ({p.rate:.0f}/s)"
            )
            out.append(
                CaseResult(f"one-hop {self.kind}", label, self.mode, p.rate, p.pairs, p.predicted)
            )
        return out

    def to_document(self) -> dict[str, Any]:
        v = ValidationResult(
            f"sweep-{self.kind}-{self.mode}",
            tuple(self.cases()),
            self.profile,
            self.machine,
            self.options,
        )
        doc = v.to_document()
        doc["sweep"] = {
            "kind": self.kind,
            "mode": self.mode,
            "x": [p.x for p in self.points],
            "max_qps_no_mesh": self.max_qps_no_mesh,
        }
        return doc


def run_sweep(
    kind: Literal["size", "rate"],
    system: System,
    store: ProfileSource,
    *,
    mode: Mode = Mode.HTTP,
    sizes: Sequence[int] = (100, 1024, 4096, 16384, 65536),
    fractions: Sequence[float] = (0.25, 0.5, 0.75, 1.0),
    rate: float = 200.0,
    size_bytes: int = 100,
    duration_s: float = 2.0,
    profile_name: str | None = None,
    policy: PairPolicy = PairPolicy(min_pairs=6, max_pairs=8, budget_s=None),
    progress: Progress | None = None,
) -> SweepResult:
    """One hop, fortio client → fortio echo (no mesh) and → echo behind a sidecar in ``mode``.

    ``size``: request = response = each of ``sizes`` at ``rate``. ``rate``: ``size_bytes`` at
    each of ``fractions`` of the no-mesh maximum (closed loop, one connection).
    """
    say = progress or (lambda _m: None)
    mode = Mode(mode)
    profile = choose_profile(store, profile_name)
    pinning = pinning_of(profile)
    fortio_bin = fortio_binary()
    work = Path(tempfile.mkdtemp(prefix="meshtax-sweep-"))
    points: list[SweepPoint] = []
    max_qps = 0.0
    port = ECHO_PORTS[mode]
    try:
        with Testbed(system, lock_timeout=900.0) as tb:
            client = tb.add_pod("client")
            bare, meshed = tb.add_pod("bare"), tb.add_pod("mesh")
            tb.mesh(meshed, proxy_uid=PROXY_UID)
            servers = {}
            for name, pod in (("no_mesh", bare), ("mesh", meshed)):
                srv = FortioServer(
                    system,
                    work / name,
                    host="0.0.0.0",
                    **{
                        {Mode.HTTP: "http_port", Mode.GRPC: "grpc_port", Mode.TCP: "tcp_port"}[
                            mode
                        ]: port
                    },
                    place=pod.place(cpus=pinning.app),
                    binary=fortio_bin,
                )
                srv.start()
                assert srv.process is not None
                tb.adopt(srv.process, srv.argv, netns=pod.netns)
                servers[name] = srv
            env = EnvoyProcess(
                system,
                EnvoyConfig(mode=mode, inbound_upstream=("127.0.0.1", port)),
                work / "envoy",
                place=meshed.place(cpus=pinning.sidecars, uid=PROXY_UID),
            )
            env.start()
            assert env.process is not None
            tb.adopt(env.process, ["envoy"], netns=meshed.netns)
            pods = {"no_mesh": bare, "mesh": meshed}
            pids = {k: _pod_pids(system, p) for k, p in pods.items()}
            cplace = client.place(cpus=pinning.client)

            def load(side: str, size: int, qps: float, *, n: int | None = None) -> LoadResult:
                return run_load(
                    f"{pods[side].ip}:{port}",
                    mode,
                    size,
                    qps,
                    duration_s=None if n else duration_s,
                    n=n,
                    system=system,
                    place=cplace,
                    binary=fortio_bin,
                )

            def measure(size: int, qps: float) -> list[tuple[RunSample, RunSample]]:
                for side in pods:
                    load(side, size, qps, n=200)

                def one(side: str) -> RunSample:
                    before = _cpu_ns(pids[side])
                    r = load(side, size, qps)
                    after = _cpu_ns(pids[side])
                    ns = {"echo": sum(after[p] - before.get(p, 0) for p in after)}
                    sc = env.process.pid if side == "mesh" and env.process is not None else -1
                    return RunSample(
                        r.p50_us,
                        r.p90_us,
                        r.avg_us,
                        r.count,
                        r.actual_qps,
                        r.duration_s,
                        ns,
                        after.get(sc, 0) - before.get(sc, 0),
                    )

                return measure_pairs(one, policy)[0]

            if kind == "size":
                for s in sizes:
                    say(f"sweep size {s} B")
                    pairs = measure(s, rate)
                    actual = _median_rate(pairs)
                    points.append(
                        SweepPoint(
                            float(s),
                            s,
                            actual,
                            tuple(pairs),
                            one_hop(
                                profile, SidecarConfig(mode), s, actual, pod_cpus=pinning.pod_cpus()
                            ),
                        )
                    )
            else:
                for side in pods:
                    load(side, size_bytes, 0.0, n=500)
                max_qps = load("no_mesh", size_bytes, 0.0).actual_qps
                for f in fractions:
                    say(f"sweep rate {f:.0%} of {max_qps:.0f}/s")
                    pairs = measure(size_bytes, f * max_qps)
                    actual = _median_rate(pairs)
                    points.append(
                        SweepPoint(
                            f,
                            size_bytes,
                            actual,
                            tuple(pairs),
                            one_hop(
                                profile,
                                SidecarConfig(mode),
                                size_bytes,
                                actual,
                                pod_cpus=pinning.pod_cpus(),
                            ),
                        )
                    )
            env.stop()
            for srv in servers.values():
                srv.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    opts = {
        "kind": kind,
        "mode": mode.value,
        "sizes": list(sizes),
        "fractions": list(fractions),
        "rate": rate,
        "size_bytes": size_bytes,
        "duration_s": duration_s,
        "pinning": pinning.describe(),
    }
    return SweepResult(kind, mode.value, tuple(points), profile.name, max_qps, machine(), opts)


def _median_rate(pairs: Sequence[tuple[RunSample, RunSample]]) -> float:
    """The rate both sides achieved (the mesh side may fall short near the maximum)."""
    return statistics.median(min(b.actual_qps, m.actual_qps) for b, m in pairs)
