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
  overheads' intervals are tight (:mod:`meshtax.validate.pairing`, the one paired-run loop);
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
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from meshtax.model.profile import Profile
from meshtax.model.sidecar import Architecture, Mode, SidecarConfig
from meshtax.testbed import procfs
from meshtax.testbed.bed import mesh_pod
from meshtax.testbed.envoy.config import EnvoyConfig
from meshtax.testbed.fortio import LoadResult, run_load
from meshtax.testbed.host import this_host
from meshtax.testbed.meshes import MESHES, Service, deploy
from meshtax.testbed.nodes import NodeNet
from meshtax.testbed.paired import PairPolicy
from meshtax.testbed.pinning import Pinning, nice_of, pinning_of
from meshtax.testbed.pods import Pod, Testbed
from meshtax.testbed.proxy import Proxy
from meshtax.testbed.runstate import owned_tempdir
from meshtax.testbed.speed import speed_on
from meshtax.testbed.system import System
from meshtax.testbed.tools import tool
from meshtax.validate import appctl
from meshtax.validate.pairing import measure_pairs
from meshtax.validate.prediction import predict_traces
from meshtax.validate.result import CaseResult, Predicted, RunSample, ValidationResult

__all__ = [
    "APP_PORT",
    "KeptCase",
    "ValidateOptions",
    "app_protocol",
    "kept_cases",
    "machine",
    "node_names",
    "placement",
    "run_case",
    "run_validation",
    "sidecar_modes",
]

APP_PORT = 9080

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ValidateOptions:
    """Options of ``meshtax validate``; echoed in the result document.

    ``queries``: empty → every query of the topology. ``rate``: requests/s of every run (0:
    closed loop with one request in flight, as the profiler measures latency; the prediction
    then uses the rate the no-mesh side reached).
    ``duration_s``: seconds per run. ``quick``: shorter runs and fewer pairs (CI, smoke).
    ``profile_name``: as given (the caller resolves it and passes the profile in).
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
    accept_unclosed: bool = False
    quick: bool = False
    sample: int = 10
    min_pairs: int = 6
    max_pairs: int = 10
    warmup_n: int = 300
    lock_timeout_s: float = 900.0
    keep_workdir: bool = False
    traces_dir: str | None = None
    # "now": the reference workload before each prediction, costs scaled by it. Not the default:
    # on a loaded machine its fastest burst moved 4× within minutes (cross-CPU 95–397 µs),
    # and the scaling doubled the suite's error (BENCHMARKS.md, issue #14)
    speed: str = "profile"
    # the mesh copy's architecture (node-l4, waypoint: both copies' pods on nodes, this many
    # services to a node, in the order the query reaches them; the client on a node of its own)
    architecture: str = "sidecar"
    pods_per_node: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "modes", tuple(Mode(m) for m in self.modes))
        if self.filters or self.mtls:
            raise ValueError("validate: filter chains and mTLS are not supported yet")
        if self.rate < 0 or self.duration_s <= 0:
            raise ValueError("rate must be >= 0 (0: closed loop) and duration positive")
        if Architecture(self.architecture) is Architecture.NONE or self.pods_per_node < 1:
            raise ValueError("validate: an architecture with proxies, at least 1 pod per node")

    def policy(self) -> PairPolicy:
        if self.quick:
            return PairPolicy.fixed(3)
        return PairPolicy(self.min_pairs, self.max_pairs)

    def run_s(self) -> float:
        return min(self.duration_s, 1.0) if self.quick else self.duration_s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["modes"] = [m.value for m in self.modes]
        return d


def placement(services: Sequence[str], pods_per_node: int) -> dict[str, int]:
    """Each service's node (an index): ``pods_per_node`` to a node, in the given order."""
    return {s: i // pods_per_node for i, s in enumerate(services)}


def node_names(services: Sequence[str], pods_per_node: int) -> dict[str, str]:
    """Each service's node as a prediction names it (``n<index>`` of :func:`placement`)."""
    return {s: f"n{k}" for s, k in placement(services, pods_per_node).items()}


@dataclass(frozen=True)
class KeptCase:
    """A measured case of a kept validation (``benchmarks/bench_validate.py --keep-traces``:
    ``all.json`` with the no-mesh traces in ``traces`` beside it), with what predicting it
    again needs: ``record`` (the case as the document has it), its traces, the services its
    query reaches (the entry first), their sidecars and nodes, and its measured p50 latency and
    CPU overheads (µs, CPU-µs a request)."""

    record: Mapping[str, Any]
    trace: Path
    services: tuple[str, ...]
    sidecars: dict[str, SidecarConfig]
    nodes: dict[str, str]
    p50_us: float
    cpu_us: float

    def predict(
        self,
        profile: Profile,
        *,
        pod_cpus: int | None,
        architecture: Architecture,
        roles: Mapping[Architecture, Profile],
    ) -> Predicted:
        """The case predicted again from its traces (as the validation predicted it)."""
        return predict_traces(
            self.trace,
            profile,
            self.sidecars,
            float(self.record["rate"]),
            pod_cpus=pod_cpus,
            architecture=architecture,
            nodes=self.nodes,
            roles=roles,
        )


def kept_cases(path: str | os.PathLike[str], doc: Mapping[str, Any]) -> Iterator[KeptCase]:
    """The measured cases of the kept validation ``doc`` read from ``path`` (failed ones left
    out), each placed on nodes as the validation placed it."""
    ppn = int(doc["options"].get("pods_per_node", 1))
    for c in doc["cases"]:
        if c.get("error"):
            continue
        topo_name, query = c["name"].split("/")
        topo = appctl.load_topology(topo_name)
        names = tuple(topo.reachable(topo.query(query)))
        yield KeptCase(
            c,
            Path(path).parent / "traces" / f"{topo_name}-{query}-{c['mode']}.json",
            names,
            {s: SidecarConfig(Mode(m)) for s, m in c["sidecar_modes"].items()},
            node_names(names, ppn),
            float(c["latency"]["measured"]),
            float(c["cpu"]["per_request_us"]["measured"]),
        )


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


@dataclass
class _Side:
    """One deployed copy: its pods, their processes, the fortio target; ``proxies`` by role
    (a pod's sidecar by its service's name; node proxies and waypoints, which are in no
    service's pod, by :mod:`~meshtax.testbed.meshes` role)."""

    name: str
    pods: dict[str, Pod]
    deployment: appctl.Deployment
    app: appctl.RunningApp | None = None
    proxies: dict[str, Proxy] = field(default_factory=dict)
    pids: dict[str, list[int]] = field(default_factory=dict)

    def sidecar_pids(self) -> set[int]:
        return {p.pid for p in self.proxies.values()}


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
    roles: Mapping[Architecture, Profile] | None = None,
) -> CaseResult:
    """Measure and predict one case (see the module docstring); errors become the case's
    ``error`` after the testbed is gone. ``roles``: the profiles measured as node-l4 and as a
    waypoint that price those crossings (none: the sidecar profile stands in)."""
    say = progress or (lambda _m: None)
    t0 = time.monotonic()
    q = topology.query(query)
    names = topology.reachable(q)
    modes = sidecar_modes(topology, names, mode)
    proto = app_protocol(mode)
    meshapp = appctl.ensure_built(system)
    fortio_bin = tool("fortio")
    envoy_bin = tool("envoy")
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
            arch = Architecture(options.architecture)
            net = NodeNet(tb)
            on_nodes = arch is not Architecture.SIDECAR
            client = net.add_pod("client", net.add_node("c")) if on_nodes else tb.add_pod("client")
            at = placement(names, options.pods_per_node)
            sides: dict[str, _Side] = {}
            for tag, sname in (("b", "no_mesh"), ("m", "mesh")):
                if on_nodes:
                    nodes = [net.add_node(f"{tag}{k}") for k in sorted(set(at.values()))]
                    pods = {s: net.add_pod(f"{tag}{i}", nodes[at[s]]) for i, s in enumerate(names)}
                else:
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
            if on_nodes:
                dep = deploy(
                    tb,
                    net,
                    MESHES[arch.value],
                    None,
                    [Service(s, p, APP_PORT, modes[s]) for s, p in mesh.pods.items()],
                    Mode.TCP,
                    work / "mesh",
                    cpus=pinning.sidecars,
                )
                mesh.proxies = dict(dep.proxies)
            else:
                for s, pod in mesh.pods.items():
                    cfg = EnvoyConfig(
                        mode=modes[s],
                        inbound_upstream=("127.0.0.1", APP_PORT),
                        circuit_breaker_max=2**32 - 1,
                    )
                    mesh.proxies[s] = mesh_pod(
                        tb,
                        pod,
                        cfg,
                        work / "mesh" / f"envoy-{s}",
                        cpus=pinning.sidecars,
                        binary=envoy_bin,
                    )
            for side in sides.values():
                (work / side.name).mkdir(parents=True, exist_ok=True)
                side.app = appctl.start(
                    side.deployment, appctl.testbed_spawner(tb, side.pods, cpus=pinning.app)
                )
                side.pids = {s: tb.pod_pids(p) for s, p in side.pods.items()}
                # node proxies and waypoints are in no service's pod: their CPU by role
                side.pids.update({r: [p.pid] for r, p in side.proxies.items() if r not in names})
            cplace = client.place(cpus=pinning.client)
            fmode = Mode(sides["no_mesh"].deployment.entry_mode)
            entry_bytes = topology.services[q.service].endpoints[q.endpoint].response_bytes

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
                    response_bytes=entry_bytes,
                    # p50/p90 from every request's latency: fortio's buckets are 1 ms wide
                    # from 1 to 5 ms, where these apps' latencies are (issue #18)
                    access_log=str((work / "fortio-access.jsonl").resolve()),
                )

            say(f"{topology.name}/{q.name} {mode.value}: warm-up")
            for side in sides.values():
                load(side.deployment.entry_target, fmode, n=options.warmup_n)

            def one(side_name: str) -> RunSample:
                return _run_once(sides[side_name], lambda t, m: load(t, m), fmode, procfs.cpu_ns)

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
            for px in mesh.proxies.values():
                px.stop()
        say(f"{topology.name}/{q.name} {mode.value}: predict")
        rate = options.rate or statistics.median(b.actual_qps for b, _ in pairs)
        speed, speed_note = (
            speed_on(system, pinning, nice=nice_of(profile))
            if options.speed == "now"
            else (None, None)
        )
        pred: Predicted = predict_traces(
            trace,
            profile,
            {s: SidecarConfig(m) for s, m in modes.items()},
            rate,
            pod_cpus=pinning.pod_cpus(),
            speed=speed,
            architecture=Architecture(options.architecture),
            nodes=node_names(names, options.pods_per_node),
            roles=roles,
        )
        if speed_note:
            pred = replace(pred, warnings=(*pred.warnings, speed_note))
        result = CaseResult(
            topology.name,
            q.name,
            mode.value,
            rate,
            tuple(pairs),
            pred,
            result.sidecar_modes,
            wall_s=time.monotonic() - t0,
            speed=speed,
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


def run_validation(
    options: ValidateOptions,
    system: System,
    profile: Profile,
    progress: Progress | None = None,
    *,
    warnings: Sequence[str] = (),
    roles: Mapping[Architecture, Profile] | None = None,
) -> ValidationResult:
    """Every (query, mode) case of ``options.topology``, predicted with ``profile`` (resolved
    by the caller; its ``warnings`` go into the result's notes)."""
    topo = appctl.load_topology(options.topology)
    queries = options.queries or tuple(topo.queries)
    pinning = pinning_of(profile)
    work = owned_tempdir("validate")
    cases: list[CaseResult] = []
    load_before = os.getloadavg()
    try:
        for qn in queries:
            for m in options.modes:
                cases.append(
                    run_case(topo, qn, m, profile, options, system, work, pinning, progress, roles)
                )
    finally:
        if not options.keep_workdir:
            shutil.rmtree(work, ignore_errors=True)
    mach = machine()
    mach["loadavg_before"] = load_before
    return ValidationResult(
        name=topo.name,
        cases=tuple(cases),
        profile=profile.name,
        machine=mach,
        options={**options.to_dict(), "pinning": pinning.describe()},
        notes=(*warnings, *_notes(pinning, profile)),
    )


def _notes(pinning: Pinning, profile: Profile) -> tuple[str, ...]:
    return (
        f"placement {pinning.describe()}: the profile's own pinning (client apart, apps and "
        "sidecars together), so measured and modelled costs share it; "
        f"the prediction knows the pods share {pinning.pod_cpus()} CPU(s) (latency overhead ≥ the "
        "request's sidecar CPU work ÷ that)",
        "latency: client-side p50/p90 of fortio at a fixed rate (every request's latency, from its "
        "access log), mesh − no mesh per pair; CPU: "
        "schedstat of every process of every pod, per request, mesh − no mesh",
        "prediction: OTLP traces of the no-mesh copy imported by meshtax.traces (sizes from span "
        "attributes, rate = the fortio rate), this machine's profile",
        "role: db services get tcp-mode sidecars (Istio does not parse their protocols)",
        "shared CPUs: every message priced at the one-hop rate that loads the CPU alike "
        "(meshtax.predict.shared_cpu)",
    )
