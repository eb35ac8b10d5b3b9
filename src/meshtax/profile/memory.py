"""Sidecar memory against open connections: memory = M + n·m, per mode, plaintext or mTLS.

Two Envoys on loopback (in the caller's namespace) form one mesh hop, as in a pod pair:

    holder A ──plain──► client sidecar (outbound) ──plain or mTLS──► server sidecar (inbound) ──► echo
    holder B ──────────────── plain or mTLS, as N peer sidecars ──────────┘

Each holder (this module run as ``python -m meshtax.profile.memory``) opens ``n``
connections, completes one exchange on each (a request in HTTP and gRPC mode, an echoed line
in TCP mode) so every connection is fully set up, then keeps them open and idle. Holder B
stands for ``n`` calling sidecars, so the server sidecar holds ``n`` downstream connections
(mTLS ones with mTLS on) even in HTTP modes, where the client sidecar pools its upstream
connections to the number of concurrent requests.
Each sidecar's resident memory is read from ``/proc/PID/status`` (VmRSS) and cross-checked
with Envoy's admin ``/memory`` (tcmalloc ``allocated``). A fresh pair of Envoys serves every
connection count, so allocator reuse between counts cannot flatten the line.

HTTP/1.1 and HTTP/2 pool upstream connections, so the upstream count can differ from ``n``;
each point records the connection gauges Envoy reports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import ssl
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from h2 import events as h2events
from h2.config import H2Configuration
from h2.connection import H2Connection

from meshtax.model.costmodel import CostModel
from meshtax.model.sidecar import Mode
from meshtax.testbed.envoy.config import EnvoyConfig, EnvoyError, EnvoyProcess
from meshtax.testbed.fortio import FortioServer
from meshtax.testbed.system import Placement, Process, RealSystem, System
from meshtax.testbed.system import free_ports as _free_ports

__all__ = [
    "CONNECTIONS",
    "QUICK_CONNECTIONS",
    "ROLES",
    "HolderTls",
    "MemoryRunError",
    "MemoryPoint",
    "MemoryResult",
    "MemorySpec",
    "fit_memory",
    "holder_argv",
    "measure_matrix",
    "measure_memory",
    "parse_vmrss",
    "raise_nofile",
    "read_rss",
]

CONNECTIONS = (1, 100, 400, 1600, 3200)
QUICK_CONNECTIONS = (1, 100, 400)
ISTIO_BREAKER_MAX = 2**32 - 1
ROLES = ("client", "server")  # the outbound (caller's) and inbound (callee's) sidecar
MODEL_NOTE = "resident bytes = M + n·m, n = the sidecar's open downstream connections (m: bytes per connection)"


class MemoryRunError(RuntimeError):
    """A memory run could not establish or hold its connections."""


@dataclass(frozen=True)
class MemorySpec:
    """One memory sweep: mode, mTLS or plaintext between the sidecars, connection counts."""

    mode: Mode = Mode.HTTP
    mtls: bool = False
    connections: tuple[int, ...] = CONNECTIONS
    tls_version: str = "1.3"
    concurrency: int = 1
    settle_s: float = 0.5
    open_parallel: int = 32

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))
        if not self.connections or min(self.connections) < 1:
            raise ValueError("connections must be positive counts")
        if len(set(self.connections)) < 2:
            raise ValueError("need at least two distinct connection counts to fit a slope")

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "mtls": self.mtls,
            "connections": list(self.connections),
            "tls_version": self.tls_version if self.mtls else None,
            "concurrency": self.concurrency,
            "settle_s": self.settle_s,
        }


@dataclass(frozen=True)
class MemoryPoint:
    """Both sidecars' memory with ``connections`` connections held open."""

    connections: int
    rss_bytes: dict[str, int]
    allocated_bytes: dict[str, int]
    heap_bytes: dict[str, int]
    # Envoy's gauges: downstream connections of the client's outbound listener, upstream
    # connections of its cluster (= the server's downstream), and of the server's cluster
    gauges: dict[str, int] = field(default_factory=dict)

    def downstream(self, role: str) -> int:
        """Connections ``role``'s sidecar holds from its callers (Envoy's gauge; the requested
        count if no gauge was read)."""
        return self.gauges.get(f"{role}_downstream", self.connections)

    def to_dict(self) -> dict[str, Any]:
        return {
            "connections": self.connections,
            "rss_bytes": dict(self.rss_bytes),
            "allocated_bytes": dict(self.allocated_bytes),
            "heap_bytes": dict(self.heap_bytes),
            "gauges": dict(self.gauges),
        }


@dataclass(frozen=True)
class MemoryResult:
    """A sweep's points and, per sidecar role, RSS and allocated-bytes models in connections."""

    spec: MemorySpec
    points: tuple[MemoryPoint, ...]
    rss_models: dict[str, CostModel]
    allocated_models: dict[str, CostModel]
    envoy_key: str = ""

    def per_connection_bytes(self, role: str = "server") -> float:
        """Slope m of RSS: bytes one more open connection costs that sidecar."""
        return self.rss_models[role].slope

    def base_bytes(self, role: str = "server") -> float:
        return self.rss_models[role].intercept

    def r2(self, role: str = "server") -> float | None:
        st = self.rss_models[role].stats
        return None if st is None else st.r2

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict(),
            "envoy_key": self.envoy_key,
            "points": [p.to_dict() for p in self.points],
            "rss_models": {r: m.to_dict() for r, m in self.rss_models.items()},
            "allocated_models": {r: m.to_dict() for r, m in self.allocated_models.items()},
        }


# ---- pure pieces -----------------------------------------------------------------------------


def parse_vmrss(status: str) -> int:
    """Resident set size in bytes from the text of ``/proc/PID/status``."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            value, unit = line.split()[1:3]
            if unit != "kB":
                raise ValueError(f"unexpected VmRSS unit {unit!r}")
            return int(value) * 1024
    raise ValueError("no VmRSS line (a kernel thread or a zombie?)")


def read_rss(pid: int, proc: Path = Path("/proc")) -> int:
    return parse_vmrss((proc / str(pid) / "status").read_text())


def fit_memory(points: Sequence[MemoryPoint], attr: str = "rss_bytes") -> dict[str, CostModel]:
    """Per role, ``CostModel.fit(n, bytes)``: intercept M, slope m, R² in stats.

    ``n`` is the sidecar's own downstream connection count: in TCP mode the server sidecar
    holds the client sidecar's connections as well as the peers', twice the requested count.
    """
    out = {}
    for role in ROLES:
        ns = [p.downstream(role) for p in points]
        values = [float(getattr(p, attr)[role]) for p in points]
        out[role] = CostModel.fit(ns, values, note=MODEL_NOTE)
    return out


@dataclass(frozen=True)
class HolderTls:
    """Client-side TLS for a holder that stands in for calling sidecars (PEM file paths)."""

    cert: Path
    key: Path
    ca: Path
    version: str = "1.3"


def holder_argv(
    target: tuple[str, int],
    mode: Mode,
    n: int,
    status: Path,
    parallel: int = 32,
    tls: HolderTls | None = None,
) -> list[str]:
    """Argv of the connection holder (this module run by the current interpreter)."""
    argv = [
        sys.executable,
        "-m",
        "meshtax.profile.memory",
        "hold",
        "--host",
        target[0],
        "--port",
        str(target[1]),
        "--mode",
        Mode(mode).value,
        "-n",
        str(n),
        "--status",
        str(status),
        "--parallel",
        str(parallel),
    ]
    if tls is not None:
        argv += [
            "--tls-cert",
            str(tls.cert),
            "--tls-key",
            str(tls.key),
            "--tls-ca",
            str(tls.ca),
            "--tls-version",
            tls.version,
        ]
    return argv


def _client_ssl(tls: HolderTls, mode: Mode) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # peers are named by URI SANs, checked by the sidecar's CA
    ctx.load_verify_locations(cafile=str(tls.ca))
    ctx.load_cert_chain(str(tls.cert), str(tls.key))
    v = ssl.TLSVersion.TLSv1_3 if tls.version == "1.3" else ssl.TLSVersion.TLSv1_2
    ctx.minimum_version = ctx.maximum_version = v
    alpn = {Mode.GRPC: ["h2"], Mode.HTTP: ["http/1.1"], Mode.TCP: []}[mode]
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


def raise_nofile(needed: int) -> int:
    """Raise this process's RLIMIT_NOFILE soft limit (and, as root, the hard one) to at least
    ``needed``; children (Envoy, the holder) inherit it. Returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return soft
    if hard < needed:
        if os.geteuid() != 0:
            raise MemoryRunError(
                f"RLIMIT_NOFILE hard limit {hard} < {needed}; raise it (ulimit -Hn) or run as root"
            )
        hard = needed
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return needed


GRPC_HEALTH_HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/grpc.health.v1.Health/Check"),
    (":authority", "app"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]
#: an empty, uncompressed gRPC message (HealthCheckRequest{})
GRPC_EMPTY_MESSAGE = b"\x00\x00\x00\x00\x00"


# ---- the holder (a child process) --------------------------------------------------------


async def _exchange(mode: Mode, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    if mode is Mode.TCP:
        writer.write(b"meshtax\n")
        await writer.drain()
        if await reader.readexactly(8) != b"meshtax\n":
            raise MemoryRunError("tcp echo mismatch")
        return
    if mode is Mode.HTTP:
        writer.write(b"GET /echo HTTP/1.1\r\nHost: app\r\n\r\n")
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        if b" 200 " not in status + b" ":
            raise MemoryRunError(f"http status {status!r}")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        await reader.readexactly(length)
        return
    # HTTP/2 (the h2 library): one unary gRPC health check, a real stream through both sidecars
    conn = H2Connection(H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, GRPC_HEALTH_HEADERS)
    conn.send_data(1, GRPC_EMPTY_MESSAGE, end_stream=True)
    while True:  # until the call's trailers end stream 1
        writer.write(conn.data_to_send())  # the request, then SETTINGS/PING acks and window updates
        await writer.drain()
        chunk = await reader.read(65536)
        if not chunk:
            raise MemoryRunError("h2 connection closed by the sidecar before the call ended")
        for ev in conn.receive_data(chunk):
            if isinstance(ev, (h2events.StreamReset, h2events.ConnectionTerminated)):
                raise MemoryRunError(f"h2 {type(ev).__name__} from the sidecar")
            if isinstance(ev, h2events.StreamEnded) and ev.stream_id == 1:
                writer.write(conn.data_to_send())
                await writer.drain()
                return


async def _hold(
    host: str,
    port: int,
    mode: Mode,
    n: int,
    parallel: int,
    status: Path,
    ctx: ssl.SSLContext | None,
) -> None:
    gate = asyncio.Semaphore(parallel)
    held: list[asyncio.StreamWriter] = []
    errors: list[str] = []

    async def one() -> None:
        async with gate:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port, ssl=ctx), 10
                )
                await asyncio.wait_for(_exchange(mode, reader, writer), 10)
                held.append(writer)
            except (
                TimeoutError,
                OSError,
                asyncio.IncompleteReadError,
                MemoryRunError,
                ValueError,
            ) as e:
                errors.append(f"{type(e).__name__}: {e}")

    t0 = time.monotonic()
    await asyncio.gather(*(one() for _ in range(n)))
    doc = {
        "open": len(held),
        "failed": len(errors),
        "errors": errors[:5],
        "seconds": time.monotonic() - t0,
    }
    tmp = status.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(status)  # atomic: the parent never reads half a file
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for w in held:
        w.close()


def _main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m meshtax.profile.memory")
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("hold", help="open N connections through a sidecar and keep them open")
    h.add_argument("--host", required=True)
    h.add_argument("--port", type=int, required=True)
    h.add_argument("--mode", choices=[m.value for m in Mode], required=True)
    h.add_argument("-n", type=int, required=True)
    h.add_argument("--status", type=Path, required=True)
    h.add_argument("--parallel", type=int, default=32)
    h.add_argument("--tls-cert", type=Path)
    h.add_argument("--tls-key", type=Path)
    h.add_argument("--tls-ca", type=Path)
    h.add_argument("--tls-version", default="1.3")
    a = ap.parse_args(argv)
    raise_nofile(a.n + 64)
    mode = Mode(a.mode)
    ctx = (
        _client_ssl(HolderTls(a.tls_cert, a.tls_key, a.tls_ca, a.tls_version), mode)
        if a.tls_cert
        else None
    )
    asyncio.run(_hold(a.host, a.port, mode, a.n, a.parallel, a.status, ctx))
    return 0


# ---- the measurement --------------------------------------------------------------------------


def _sidecars(
    spec: MemorySpec, echo: tuple[str, int], ports: Sequence[int], workdir: Path
) -> tuple[EnvoyConfig, EnvoyConfig, HolderTls | None]:
    """(client, server) sidecar configs and the peer holder's TLS; ``ports``: client
    in/out/admin, server in/out/admin."""
    lo = "127.0.0.1"
    # Istio's unlimited circuit breakers: Envoy's default caps a cluster at 1024 connections
    server = EnvoyConfig(
        mode=spec.mode,
        listen_address=lo,
        inbound_port=ports[3],
        outbound_port=ports[4],
        admin_port=ports[5],
        concurrency=spec.concurrency,
        circuit_breaker_max=ISTIO_BREAKER_MAX,
        inbound_upstream=echo,
        outbound_upstream=echo,
    )
    client = EnvoyConfig(
        mode=spec.mode,
        listen_address=lo,
        inbound_port=ports[0],
        outbound_port=ports[1],
        admin_port=ports[2],
        concurrency=spec.concurrency,
        circuit_breaker_max=ISTIO_BREAKER_MAX,
        inbound_upstream=echo,
        outbound_upstream=(lo, ports[3]),
    )
    if spec.mtls:
        from meshtax.testbed.certs import CertAuthority, sidecar_mtls

        ca = CertAuthority.generate()
        s_cred, c_cred = ca.issue("server"), ca.issue("client")
        version: Any = spec.tls_version
        server = sidecar_mtls(server, ca, s_cred, version=version)
        client = sidecar_mtls(client, ca, c_cred, peer_id=s_cred.spiffe_id, version=version)
        crt, key = ca.issue("peer").write(workdir, "peer")
        (workdir / "ca.crt").write_text(ca.cert_pem)
        return client, server, HolderTls(crt, key, workdir / "ca.crt", spec.tls_version)
    return client, server, None


def _gauges(client: EnvoyProcess, server: EnvoyProcess) -> dict[str, int]:
    c = client.stats("downstream_cx_active|upstream_cx_active")
    s = server.stats("downstream_cx_active|upstream_cx_active")
    out_l = f"listener.127.0.0.1_{client.cfg.outbound_port}.downstream_cx_active"
    in_l = f"listener.127.0.0.1_{server.cfg.inbound_port}.downstream_cx_active"
    return {
        "client_downstream": c.get(out_l, 0),
        "client_upstream": c.get("cluster.outbound_static.upstream_cx_active", 0),
        "server_downstream": s.get(in_l, 0),
        "server_upstream": s.get("cluster.inbound_static.upstream_cx_active", 0),
    }


def _wait_status(path: Path, proc: Process, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise MemoryRunError(
                f"connection holder exited {proc.poll()} before holding its connections"
            )
        if time.monotonic() > deadline:
            raise MemoryRunError(f"connection holder not done after {timeout:.0f}s")
        time.sleep(0.05)
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def measure_point(
    spec: MemorySpec,
    n: int,
    echo: tuple[str, int],
    workdir: Path,
    system: System,
    place: Placement = Placement(),
    rss_reader: Callable[[int], int] = read_rss,
) -> tuple[MemoryPoint, str]:
    """Fresh sidecar pair, ``n`` connections held through it, both sidecars' memory read."""
    workdir.mkdir(parents=True, exist_ok=True)
    client_cfg, server_cfg, peer_tls = _sidecars(spec, echo, _free_ports(6), workdir)
    envoy_place = Placement(netns=place.netns, cpus=place.cpus)
    lo = "127.0.0.1"
    targets = {
        "client": ((lo, client_cfg.outbound_port), None),  # the app's plaintext connections
        "server": ((lo, server_cfg.inbound_port), peer_tls),  # n calling sidecars
    }
    with (
        EnvoyProcess(system, server_cfg, workdir / f"server-{n}", envoy_place) as server,
        EnvoyProcess(system, client_cfg, workdir / f"client-{n}", envoy_place) as client,
    ):
        holders: list[Process] = []
        try:
            for role, (target, tls) in targets.items():
                status = workdir / f"hold-{role}-{n}.json"
                argv = holder_argv(target, spec.mode, n, status, spec.open_parallel, tls)
                holders.append(system.spawn(argv, place=Placement(netns=place.netns)))
                doc = _wait_status(status, holders[-1], 30.0 + n * 0.02)
                if doc["open"] != n:
                    raise MemoryRunError(
                        f"{role}: held {doc['open']} of {n} connections; errors: {doc['errors']}"
                    )
            time.sleep(spec.settle_s)  # lazy per-connection allocations (buffers, TLS) settle
            gauges = _gauges(client, server)
            if gauges["client_downstream"] < n or gauges["server_downstream"] < n:
                raise MemoryRunError(f"sidecars see fewer than {n} connections: {gauges}")
            procs = {"client": client, "server": server}
            rss, alloc, heap = {}, {}, {}
            for role, e in procs.items():
                assert e.process is not None
                rss[role] = rss_reader(e.process.pid)
                m = e.memory()
                alloc[role], heap[role] = m.get("allocated", 0), m.get("heap_size", 0)
        finally:
            for h in reversed(holders):
                h.stop()
    return MemoryPoint(n, rss, alloc, heap, gauges), server_cfg.key()


def measure_memory(
    spec: MemorySpec,
    *,
    system: System | None = None,
    place: Placement = Placement(),
    workdir: Path | None = None,
    rss_reader: Callable[[int], int] = read_rss,
    echo: tuple[str, int] | None = None,
) -> MemoryResult:
    """Run the sweep of ``spec`` on loopback in ``place``'s namespace and fit the models.

    ``echo``: an already running echo server for ``spec.mode`` (host, port); else one is
    started for the sweep.
    """
    system = system or RealSystem()
    raise_nofile(3 * max(spec.connections) + 256)
    with tempfile.TemporaryDirectory(prefix="meshtax-memory-") as tmp:
        wd = workdir or Path(tmp)
        if echo is not None:
            return _sweep(spec, echo, wd, system, place, rss_reader)
        (port,) = _free_ports(1)
        ports = {m: (port if m is spec.mode else None) for m in Mode}
        with FortioServer(
            system,
            wd / "echo",
            place=Placement(netns=place.netns),
            http_port=ports[Mode.HTTP],
            grpc_port=ports[Mode.GRPC],
            tcp_port=ports[Mode.TCP],
        ):
            return _sweep(spec, ("127.0.0.1", port), wd, system, place, rss_reader)


def _sweep(
    spec: MemorySpec,
    echo: tuple[str, int],
    wd: Path,
    system: System,
    place: Placement,
    rss_reader: Callable[[int], int],
) -> MemoryResult:
    points, key = [], ""
    for n in spec.connections:
        try:
            p, key = measure_point(spec, n, echo, wd, system, place, rss_reader)
        except EnvoyError as e:
            raise MemoryRunError(f"{spec.mode.value} n={n}: {e}") from e
        points.append(p)
    return MemoryResult(
        spec, tuple(points), fit_memory(points), fit_memory(points, "allocated_bytes"), key
    )


def measure_matrix(
    modes: Sequence[Mode] = tuple(Mode),
    connections: tuple[int, ...] = CONNECTIONS,
    *,
    tls_version: str = "1.3",
    system: System | None = None,
    place: Placement = Placement(),
) -> list[MemoryResult]:
    """Every mode, plaintext and mTLS: the comparison of item 4."""
    return [
        measure_memory(
            MemorySpec(mode=m, mtls=t, connections=connections, tls_version=tls_version),
            system=system,
            place=place,
        )
        for m in modes
        for t in (False, True)
    ]


if __name__ == "__main__":
    sys.exit(_main())
