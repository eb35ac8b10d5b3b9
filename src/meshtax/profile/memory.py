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

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshtax.model.costmodel import CostModel
from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends
from meshtax.testbed.certs import CertAuthority, sidecar_mtls
from meshtax.testbed.envoy.config import EnvoyConfig
from meshtax.testbed.envoy.process import EnvoyError, EnvoyProcess
from meshtax.testbed.holder import (
    HolderError,
    HolderSpec,
    HolderTls,
    holder_argv,
    raise_nofile,
    wait_status,
)
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import Process

__all__ = [
    "CONNECTIONS",
    "QUICK_CONNECTIONS",
    "ROLES",
    "MemoryPoint",
    "MemoryResult",
    "MemoryRunError",
    "MemorySpec",
    "fit_memory",
    "measure_memory",
    "measure_point",
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


def _sidecars(
    spec: MemorySpec, echo: tuple[str, int], ports: Sequence[int], workdir: Path
) -> tuple[EnvoyConfig, EnvoyConfig, HolderTls | None]:
    """(client, server) sidecar configs and the peer holder's TLS; ``ports``: client
    in/out/admin, server in/out/admin."""
    lo = "127.0.0.1"
    # Istio's unlimited circuit breakers: Envoy's default caps a cluster at 1024 connections
    common: dict[str, Any] = dict(
        mode=spec.mode,
        listen_address=lo,
        concurrency=spec.concurrency,
        circuit_breaker_max=ISTIO_BREAKER_MAX,
        inbound_upstream=echo,
    )
    server = EnvoyConfig(
        inbound_port=ports[3], outbound_port=ports[4], admin_port=ports[5],
        outbound_upstream=echo, **common,
    )  # fmt: skip
    client = EnvoyConfig(
        inbound_port=ports[0], outbound_port=ports[1], admin_port=ports[2],
        outbound_upstream=(lo, ports[3]), **common,
    )  # fmt: skip
    if not spec.mtls:
        return client, server, None
    ca = CertAuthority.generate()
    s_cred, c_cred = ca.issue("server"), ca.issue("client")
    version: Any = spec.tls_version
    server = sidecar_mtls(server, ca, s_cred, version=version)
    client = sidecar_mtls(client, ca, c_cred, peer_id=s_cred.spiffe_id, version=version)
    crt, key = ca.issue("peer").write(workdir, "peer")
    (workdir / "ca.crt").write_text(ca.cert_pem)
    return client, server, HolderTls(str(crt), str(key), str(workdir / "ca.crt"), spec.tls_version)


def _gauges(client: EnvoyProcess, server: EnvoyProcess) -> dict[str, int]:
    c = client.stats("downstream_cx_active|upstream_cx_active")
    s = server.stats("downstream_cx_active|upstream_cx_active")
    assert client.cfg is not None and server.cfg is not None
    out_l = f"listener.127.0.0.1_{client.cfg.outbound_port}.downstream_cx_active"
    in_l = f"listener.127.0.0.1_{server.cfg.inbound_port}.downstream_cx_active"
    return {
        "client_downstream": c.get(out_l, 0),
        "client_upstream": c.get("cluster.outbound_static.upstream_cx_active", 0),
        "server_downstream": s.get(in_l, 0),
        "server_upstream": s.get("cluster.inbound_static.upstream_cx_active", 0),
    }


def measure_point(
    tb: Testbed, be: Backends, spec: MemorySpec, n: int, echo: tuple[str, int], workdir: Path
) -> tuple[MemoryPoint, str]:
    """Fresh sidecar pair, ``n`` connections held through it, both sidecars' memory read."""
    system = tb.registered
    workdir.mkdir(parents=True, exist_ok=True)
    client_cfg, server_cfg, peer_tls = _sidecars(spec, echo, be.free_ports(6), workdir)
    lo = "127.0.0.1"
    targets = {
        "client": ((lo, client_cfg.outbound_port), None),  # the app's plaintext connections
        "server": ((lo, server_cfg.inbound_port), peer_tls),  # n calling sidecars
    }
    with (
        be.envoy(system, server_cfg, workdir / f"server-{n}") as server,
        be.envoy(system, client_cfg, workdir / f"client-{n}") as client,
    ):
        holders: list[Process] = []
        try:
            for role, (target, tls) in targets.items():
                status = workdir / f"hold-{role}-{n}.json"
                hspec = HolderSpec(
                    target[0], target[1], spec.mode.value, n, str(status), spec.open_parallel, tls
                )
                spec_file = workdir / f"hold-{role}-{n}.spec.json"
                spec_file.write_text(hspec.to_json())
                holders.append(system.spawn(holder_argv(spec_file)))
                doc = wait_status(status, holders[-1], 30.0 + n * 0.02)
                if doc["open"] != n:
                    raise MemoryRunError(
                        f"{role}: held {doc['open']} of {n} connections; errors: {doc['errors']}"
                    )
            time.sleep(spec.settle_s)  # lazy per-connection allocations (buffers, TLS) settle
            gauges = _gauges(client, server)
            if gauges["client_downstream"] < n or gauges["server_downstream"] < n:
                raise MemoryRunError(f"sidecars see fewer than {n} connections: {gauges}")
            rss, alloc, heap = {}, {}, {}
            for role, e in (("client", client), ("server", server)):
                rss[role] = be.rss(e.pid)
                m = e.memory()
                alloc[role], heap[role] = m.get("allocated", 0), m.get("heap_size", 0)
        finally:
            for h in reversed(holders):
                h.stop()
    return MemoryPoint(n, rss, alloc, heap, gauges), server_cfg.key()


def measure_memory(tb: Testbed, be: Backends, spec: MemorySpec) -> MemoryResult:
    """The sweep of ``spec`` on loopback, with its own echo app, and the fitted models."""
    raise_nofile(3 * max(spec.connections) + 256)
    wd = tb.scratch_dir(f"meshtax-memory-{spec.mode.value}-")
    (port,) = be.free_ports(1)
    points, key = [], ""
    with be.echo(tb.registered, wd / "echo", spec.mode, port):
        for n in spec.connections:
            try:
                p, key = measure_point(tb, be, spec, n, ("127.0.0.1", port), wd)
            except (EnvoyError, HolderError) as e:
                raise MemoryRunError(f"{spec.mode.value} n={n}: {e}") from e
            points.append(p)
    return MemoryResult(
        spec, tuple(points), fit_memory(points), fit_memory(points, "allocated_bytes"), key
    )
