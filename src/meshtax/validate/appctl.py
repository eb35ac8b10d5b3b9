"""Run the topology-driven microservice application (``app/``, the ``meshapp`` binary).

One ``meshapp`` process per service, each told where its downstream services listen. In the
testbed every service gets its own pod (and later a sidecar); on loopback every service gets
its own port. Each process writes its spans as OTLP/JSON lines to its own file;
:func:`merge_traces` joins them into one OTLP/JSON document for :mod:`meshtax.traces`.

Pure parts: :func:`load_topology` (the topology model, with the same defaults as the Go
parser, which stays the authority and validates fully), :func:`plan` (argv, ports, files).
Side effects: :func:`build` and :func:`start`, through :class:`~meshtax.testbed.system.System`
or a :class:`~meshtax.testbed.pods.Testbed`.
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import yaml

from meshtax.testbed.pods import Pod, Testbed
from meshtax.testbed.system import Placement, Process, System, wait_until
from meshtax.testbed.tools import INSTALLED

__all__ = [
    "APP_DIR",
    "AppError",
    "Call",
    "Deployment",
    "Endpoint",
    "Protocol",
    "Query",
    "RunningApp",
    "Service",
    "ServiceLaunch",
    "Spawner",
    "Topology",
    "binary_path",
    "build",
    "bundled_topologies",
    "ensure_built",
    "load_topology",
    "loopback_spawner",
    "merge_traces",
    "plan",
    "start",
    "testbed_spawner",
    "write_merged_traces",
]

Protocol = Literal["http", "grpc"]
_PROTOCOLS: tuple[str, ...] = ("http", "grpc")


def _find_app_dir() -> Path:
    for parent in Path(__file__).resolve().parents:
        if (parent / "app" / "go.mod").is_file():
            return parent / "app"
    return Path(__file__).resolve().parents[3] / "app"


APP_DIR = _find_app_dir()
TOPOLOGY_DIR = APP_DIR / "topologies"


class AppError(RuntimeError):
    """The application could not be built, planned or started."""


# ---- topology model (pure) ------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One downstream call of an endpoint."""

    service: str
    endpoint: str
    request_bytes: int


@dataclass(frozen=True)
class Endpoint:
    """One operation: compute, then stages in sequence, the calls of a stage in parallel."""

    name: str
    compute_us: float
    compute: Literal["spin", "sleep"]
    response_bytes: int
    stages: tuple[tuple[Call, ...], ...]


@dataclass(frozen=True)
class Service:
    """One microservice (one process, one pod). ``role`` is ``"db"`` for database stand-ins."""

    name: str
    protocol: Protocol
    role: str
    endpoints: Mapping[str, Endpoint]


@dataclass(frozen=True)
class Query:
    """A named entry point (service, endpoint) the load generator drives."""

    name: str
    service: str
    endpoint: str


@dataclass(frozen=True)
class Topology:
    """An application: services and queries, read from a topology YAML file."""

    name: str
    path: Path
    services: Mapping[str, Service]
    queries: Mapping[str, Query]

    def query(self, name: str | None = None) -> Query:
        """The query ``name``; without a name, the file's first query."""
        if name is None:
            if not self.queries:
                raise AppError(f"topology {self.name} defines no queries")
            return next(iter(self.queries.values()))
        try:
            return self.queries[name]
        except KeyError:
            raise AppError(
                f"topology {self.name} has no query {name!r} (has: {', '.join(self.queries)})"
            ) from None

    def reachable(self, query: Query) -> tuple[str, ...]:
        """Services one request of ``query`` touches, in first-call (depth-first) order."""
        seen: dict[str, None] = {}

        def walk(svc: str, ep: str) -> None:
            seen.setdefault(svc)
            for stage in self.services[svc].endpoints[ep].stages:
                for c in stage:
                    walk(c.service, c.endpoint)

        walk(query.service, query.endpoint)
        return tuple(seen)

    def invocations(self, query: Query) -> list[tuple[str, str, Call, int]]:
        """Every call one request of ``query`` makes, depth-first: (caller, caller endpoint,
        call, response bytes)."""
        out: list[tuple[str, str, Call, int]] = []

        def walk(svc: str, ep: str) -> None:
            for stage in self.services[svc].endpoints[ep].stages:
                for c in stage:
                    out.append(
                        (svc, ep, c, self.services[c.service].endpoints[c.endpoint].response_bytes)
                    )
                    walk(c.service, c.endpoint)

        walk(query.service, query.endpoint)
        return out


def bundled_topologies() -> tuple[str, ...]:
    """Names of the topologies shipped in ``app/topologies``."""
    return tuple(sorted(p.stem for p in TOPOLOGY_DIR.glob("*.yaml")))


def _path_of(name_or_path: str | os.PathLike[str]) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    cand = TOPOLOGY_DIR / f"{name_or_path}.yaml"
    if cand.is_file():
        return cand
    raise AppError(
        f"no topology {str(name_or_path)!r}: not a file, not one of {', '.join(bundled_topologies())}"
    )


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise AppError(f"{where}: {v!r} is not a non-negative integer")
    return v


def load_topology(name_or_path: str | os.PathLike[str]) -> Topology:
    """Read a topology by bundled name (``bookinfo``) or path, applying the file's defaults.

    Checks what this side needs (names, calls that resolve); ``meshapp`` checks the rest
    (unknown fields, cycles) when it starts.
    """
    path = _path_of(name_or_path)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise AppError(f"{path}: cannot read ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict):
        raise AppError(f"{path}: expected a mapping with 'services'")
    d = doc.get("defaults") or {}
    services: dict[str, Service] = {}
    for sname, sdoc in doc["services"].items():
        sdoc = sdoc or {}
        proto = sdoc.get("protocol", d.get("protocol", "grpc"))
        if proto not in _PROTOCOLS:
            raise AppError(f"{path}: services.{sname}.protocol: {proto!r} is not http or grpc")
        eps: dict[str, Endpoint] = {}
        for ename, edoc in (sdoc.get("endpoints") or {}).items():
            edoc = edoc or {}
            where = f"{path}: services.{sname}.endpoints.{ename}"
            stages: list[tuple[Call, ...]] = []
            for si, st in enumerate(edoc.get("stages") or []):
                calls = [st] if isinstance(st, dict) else list(st)
                out: list[Call] = []
                for ci, c in enumerate(calls):
                    target = str(c.get("call", ""))
                    svc, dot, ep = target.partition(".")
                    if not dot:
                        raise AppError(
                            f"{where}.stages[{si}][{ci}]: {target!r} is not <service>.<endpoint>"
                        )
                    rb = _int(
                        c.get("request_bytes", d.get("request_bytes", 0)),
                        f"{where}.stages[{si}][{ci}].request_bytes",
                    )
                    out.append(Call(svc, ep, rb))
                stages.append(tuple(out))
            mode = edoc.get("compute", d.get("compute", "spin"))
            if mode not in ("spin", "sleep"):
                raise AppError(f"{where}.compute: {mode!r} is not spin or sleep")
            eps[ename] = Endpoint(
                name=ename,
                compute_us=float(edoc.get("compute_us", d.get("compute_us", 0.0))),
                compute=mode,
                response_bytes=_int(
                    edoc.get("response_bytes", d.get("response_bytes", 0)),
                    f"{where}.response_bytes",
                ),
                stages=tuple(stages),
            )
        services[sname] = Service(sname, proto, str(sdoc.get("role", "")), eps)
    for s in services.values():
        for endpoint in s.endpoints.values():
            for st in endpoint.stages:
                for c in st:
                    if (
                        c.endpoint
                        not in (services.get(c.service) or Service("", "http", "", {})).endpoints
                    ):
                        raise AppError(
                            f"{path}: {s.name}.{endpoint.name} calls unknown {c.service}.{c.endpoint}"
                        )
    queries: dict[str, Query] = {}
    for qname, q in (doc.get("queries") or {}).items():
        query = Query(qname, str(q.get("service")), str(q.get("endpoint")))
        if (
            query.endpoint
            not in (services.get(query.service) or Service("", "http", "", {})).endpoints
        ):
            raise AppError(f"{path}: queries.{qname}: no endpoint {query.service}.{query.endpoint}")
        queries[qname] = query
    return Topology(str(doc.get("name", path.stem)), path, services, queries)


# ---- deployment plan (pure) -----------------------------------------------------------------


@dataclass(frozen=True)
class ServiceLaunch:
    """One service process: where it listens, what it speaks, its argv and its files."""

    service: str
    host: str  # the address its callers use
    port: int
    protocol: Protocol
    argv: tuple[str, ...]
    trace_file: Path
    ready_file: Path
    log_file: Path

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Deployment:
    """Everything needed to start one query of a topology; the entry is what fortio drives."""

    topology: Topology
    query: Query
    services: tuple[ServiceLaunch, ...]
    sample: int

    @property
    def entry(self) -> ServiceLaunch:
        return self.launch(self.query.service)

    def launch(self, service: str) -> ServiceLaunch:
        for s in self.services:
            if s.service == service:
                return s
        raise KeyError(service)

    @property
    def entry_mode(self) -> Protocol:
        """fortio's mode for the entry: ``http`` (GET on the endpoint) or ``grpc`` (ping)."""
        return self.entry.protocol

    @property
    def entry_target(self) -> str:
        """fortio's target: ``http://host:port/<endpoint>``, or ``host:port`` for ``-grpc -ping``
        (meshapp runs the entry endpoint for fortio's Ping and health calls)."""
        e = self.entry
        if e.protocol == "http":
            return f"http://{e.address}/{self.query.endpoint}"
        return e.address

    @property
    def trace_files(self) -> tuple[Path, ...]:
        return tuple(s.trace_file for s in self.services)


def binary_path() -> Path:
    """Where :func:`build` puts meshapp: ``<repo>/.tools/bin/meshapp``."""
    return INSTALLED["meshapp"][0]


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def plan(
    topology: Topology,
    query: str | None = None,
    *,
    workdir: Path,
    hosts: Mapping[str, str] | str = "127.0.0.1",
    ports: Mapping[str, int] | int = 9080,
    binary: Path | None = None,
    sample: int = 1,
    entry_protocol: Protocol | None = None,
    backend_protocol: Protocol | None = None,
    listen_host: str | None = None,
    trace_batch_timeout_s: float = 1.0,
    procs: int = 1,
) -> Deployment:
    """The processes for one query: only the services its requests reach.

    ``hosts``: one address for all (loopback) or one per service (pod IPs). ``ports``: one per
    service, or one number: with one shared host service *i* gets number + *i*, with a host
    per service every service gets the number.
    ``sample``: trace 1 in N requests (0: no tracing). ``entry_protocol``/``backend_protocol``
    override the topology's protocols for the entry service / all others. ``listen_host``:
    default 127.0.0.1 for loopback hosts, else 0.0.0.0 (inside a pod's namespace).
    ``procs``: GOMAXPROCS of each service (0: Go's default). 1 by default: on a 2-core machine
    Bookinfo's loopback p50 fell from 1.34 to 0.82 ms, as idle Go Ps no longer spin for work
    against the other services (and, in the testbed, the sidecars).
    """
    q = topology.query(query)
    names = topology.reachable(q)
    binary = binary or binary_path()
    if sample < 0:
        raise AppError("sample must be >= 0")

    def host(s: str) -> str:
        if isinstance(hosts, str):
            return hosts
        try:
            return hosts[s]
        except KeyError:
            raise AppError(f"no host for service {s!r}") from None

    def port(i: int, s: str) -> int:
        if isinstance(ports, int):
            # one shared host: base + i; a host (pod) per service: the same port everywhere
            return ports + i if isinstance(hosts, str) else ports
        try:
            return ports[s]
        except KeyError:
            raise AppError(f"no port for service {s!r}") from None

    def proto(s: str) -> Protocol:
        override = entry_protocol if s == q.service else backend_protocol
        return override or topology.services[s].protocol

    where = {s: (host(s), port(i, s)) for i, s in enumerate(names)}
    if len(set(where.values())) != len(where):
        raise AppError(f"two services share an address: {where}")
    callees: dict[str, set[str]] = {s: set() for s in names}
    for caller, _, c, _ in topology.invocations(q):
        callees[caller].add(c.service)
    launches = []
    for s in names:
        h, p = where[s]
        lh = listen_host or ("127.0.0.1" if _is_loopback(h) else "0.0.0.0")
        trace_file = workdir / f"{s}.otlp.jsonl"
        ready = workdir / f"{s}.ready"
        argv = [
            str(binary),
            "--topology",
            str(topology.path.resolve()),
            "--service",
            s,
            "--listen",
            f"{lh}:{p}",
            "--protocol",
            proto(s),
            "--ping-endpoint",
            q.endpoint if s == q.service else next(iter(topology.services[s].endpoints)),
            "--sample",
            str(sample),
            "--trace-file",
            str(trace_file) if sample > 0 else "",
            "--trace-batch-timeout",
            f"{trace_batch_timeout_s:g}s",
            "--ready-file",
            str(ready),
            "--procs",
            str(procs),
        ]
        for callee in sorted(callees[s]):
            ch, cp = where[callee]
            argv += ["--peer", f"{callee}={proto(callee)}://{ch}:{cp}"]
        launches.append(
            ServiceLaunch(s, h, p, proto(s), tuple(argv), trace_file, ready, workdir / f"{s}.log")
        )
    return Deployment(topology, q, tuple(launches), sample)


# ---- build and run (side effects) -----------------------------------------------------------


def build(system: System, *, out: Path | None = None, app_dir: Path = APP_DIR) -> Path:
    """``bash app/build.sh OUT``: compile meshapp (Go modules from the Go module proxy)."""
    out = out or binary_path()
    system.run(["bash", str(app_dir / "build.sh"), str(out)], timeout=900.0)
    return out


def _newest_source(app_dir: Path) -> float:
    files = [p for p in app_dir.rglob("*") if p.suffix == ".go" or p.name in ("go.mod", "go.sum")]
    return max((p.stat().st_mtime for p in files), default=0.0)


def ensure_built(system: System, *, out: Path | None = None, app_dir: Path = APP_DIR) -> Path:
    """The meshapp binary, (re)built first if missing or older than its sources."""
    out = out or binary_path()
    if not out.is_file() or out.stat().st_mtime < _newest_source(app_dir):
        build(system, out=out, app_dir=app_dir)
    return out


def _up(ready: Callable[[ServiceLaunch], bool], s: ServiceLaunch, p: Process) -> Callable[[], bool]:
    """Has ``s`` come up (or its process ended)?"""
    return lambda: ready(s) or p.poll() is not None


Spawner = Callable[[ServiceLaunch, int], Process]
"""Starts one service: (launch, log file descriptor) → process."""


def loopback_spawner(system: System, place: Placement = Placement()) -> Spawner:
    """Every service on this host (use 127.0.0.1 hosts), placed by ``place``."""

    def spawn(launch: ServiceLaunch, log: int) -> Process:
        return system.spawn(launch.argv, place=place, stdout=log, stderr=log)

    return spawn


def testbed_spawner(
    testbed: Testbed,
    pods: Mapping[str, Pod],
    *,
    cpus: Mapping[str, tuple[int, ...]] | tuple[int, ...] | None = None,
    uid: int | None = None,
) -> Spawner:
    """Each service in its own pod (``pods[service]``), registered with the testbed so it is
    stopped on close; ``cpus`` pins all services, or each one."""

    def spawn(launch: ServiceLaunch, log: int) -> Process:
        c = cpus.get(launch.service) if isinstance(cpus, Mapping) else cpus
        return testbed.spawn(
            pods[launch.service],
            launch.argv,
            place=Placement(cpus=c, uid=uid),
            stdout=log,
            stderr=log,
        )

    return spawn


@dataclass
class RunningApp:
    """Started services; a context manager. ``stop`` ends them by PID (SIGTERM: they flush
    their spans), callers first so no request is cut mid-way by a vanished callee."""

    deployment: Deployment
    processes: dict[str, Process] = field(default_factory=dict)

    def stop(self, timeout: float = 5.0) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for s in self.deployment.services:  # depth-first order: callers before callees
            p = self.processes.pop(s.service, None)
            if p is not None:
                codes[s.service] = p.stop(timeout)
        return codes

    def __enter__(self) -> RunningApp:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _tail(path: Path, n: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return "(no log)"


def start(
    deployment: Deployment,
    spawn: Spawner,
    *,
    timeout: float = 10.0,
    is_ready: Callable[[ServiceLaunch], bool] | None = None,
) -> RunningApp:
    """Start every service (callees first) and wait until each listens; on failure, stop
    what started and raise :class:`AppError` with the failing service's log."""
    ready = is_ready or (lambda s: s.ready_file.is_file())
    app = RunningApp(deployment)
    try:
        for s in reversed(deployment.services):
            for f in (s.ready_file, s.trace_file):
                f.unlink(missing_ok=True)
            s.log_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(s.log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                app.processes[s.service] = spawn(s, fd)
            finally:
                os.close(fd)  # the child has its own copy
        for s in reversed(deployment.services):
            p = app.processes[s.service]
            if not wait_until(_up(ready, s, p), timeout):
                raise AppError(
                    f"{s.service} not listening on {s.address} after {timeout:g}s: {_tail(s.log_file)}"
                )
            if p.poll() is not None:
                raise AppError(f"{s.service} exited {p.poll()}: {_tail(s.log_file)}")
    except BaseException:
        app.stop()
        raise
    return app


# ---- traces ---------------------------------------------------------------------------------


def merge_traces(paths: Iterable[Path]) -> dict[str, Any]:
    """One OTLP/JSON ``TracesData`` from meshapp's per-service OTLP/JSON-lines files."""
    merged: list[Any] = []
    for path in paths:
        if not path.exists():
            continue  # a service that traced nothing (sample 0, no sampled request)
        for i, line in enumerate(path.read_text().splitlines()):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                raise AppError(
                    f"{path}:{i + 1}: not JSON ({e.msg}); truncated by a kill?"
                ) from None
            merged.extend(doc.get("resourceSpans") or [])
    return {"resourceSpans": merged}


def write_merged_traces(paths: Iterable[Path], out: Path) -> Path:
    """:func:`merge_traces` into ``out`` (readable by ``meshtax.traces``' OTLP importer)."""
    out.write_text(json.dumps(merge_traces(paths)))
    return out
