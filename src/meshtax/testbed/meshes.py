"""A set of pods on nodes meshed one way: sidecars (Envoy, HAProxy, nginx; Envoy with mTLS if
asked), per-node L4 proxies (Envoy, mTLS between nodes) or waypoints on them, or nothing — for
comparisons of meshes on the same app (``benchmarks/bench_meshes.py``, ``meshtax validate
--architecture``).

:func:`deploy` installs the interception and starts the proxies of one :class:`Mesh` for a
client pod and service pods already placed on nodes (:class:`~meshtax.testbed.nodes.NodeNet`);
the apps are the caller's. Each proxy is named by role (``sidecar:<pod>``, ``node:<node>``,
``waypoint:<service>``) and belongs to a side of every call (:meth:`Deployed.side`): the
client's sidecar or the client's node proxy is the client side, the rest the server side —
as the published comparisons count them. Every process is the testbed's: stopped on close,
reaped after a crash.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from meshtax.model.sidecar import Architecture, Mode
from meshtax.testbed.bed import PROXY_UID
from meshtax.testbed.certs import CertAuthority, downstream_tls, sidecar_mtls, upstream_tls
from meshtax.testbed.envoy.config import EnvoyConfig
from meshtax.testbed.envoy.process import EnvoyProcess
from meshtax.testbed.envoy.roles import NodeProxyConfig, WaypointRoute, waypoint_bootstrap
from meshtax.testbed.fileproxy import FileProxy
from meshtax.testbed.haproxy import HaproxyConfig
from meshtax.testbed.nginx import NginxConfig
from meshtax.testbed.nodes import MTLS_PORT, NodeInterception, NodeNet
from meshtax.testbed.pods import Pod, Testbed
from meshtax.testbed.proxy import Proxy
from meshtax.testbed.tools import tool

__all__ = ["MESHES", "Deployed", "Mesh", "Service", "deploy"]


@dataclass(frozen=True)
class Mesh:
    """One way to mesh the pods: an architecture, the proxy (sidecars), mTLS (Envoy only;
    node proxies and waypoints always speak it)."""

    name: str
    architecture: Architecture
    proxy: str = "envoy"
    mtls: bool = False


#: the meshes compared in BENCHMARKS.md (issue #18)
MESHES: Mapping[str, Mesh] = {
    m.name: m
    for m in (
        Mesh("baseline", Architecture.NONE),
        Mesh("envoy-mtls", Architecture.SIDECAR, "envoy", True),
        Mesh("envoy", Architecture.SIDECAR),
        Mesh("haproxy", Architecture.SIDECAR, "haproxy"),
        Mesh("nginx", Architecture.SIDECAR, "nginx"),
        Mesh("node-l4", Architecture.NODE_L4),
        Mesh("waypoint", Architecture.WAYPOINT),
    )
}


@dataclass(frozen=True)
class Service:
    """A service's pod (on a node), the port its app listens on, and its proxies' mode (None:
    the deployment's)."""

    name: str
    pod: Pod
    port: int
    mode: Mode | None = None


@dataclass
class Deployed:
    """The proxies of one deployment, by role, and the sides each serves (a node proxy of a
    node with the client and a service: both)."""

    mesh: Mesh
    proxies: dict[str, Proxy] = field(default_factory=dict)
    sides: dict[str, frozenset[str]] = field(default_factory=dict)

    def pids(self, side: str | None = None) -> dict[str, int]:
        """The PID of every proxy (serving ``side``: ``client`` or ``server``), by role."""
        return {r: p.pid for r, p in self.proxies.items() if side is None or side in self.sides[r]}

    def stop(self) -> None:
        for p in reversed(list(self.proxies.values())):
            p.stop()


def deploy(
    tb: Testbed,
    net: NodeNet,
    mesh: Mesh,
    client: Pod | None,
    services: Sequence[Service],
    mode: Mode,
    work: Path,
    *,
    cpus: tuple[int, ...] | None = None,
    ca: CertAuthority | None = None,
) -> Deployed:
    """Mesh ``client`` (a caller only; None: the client stays outside the mesh) and
    ``services`` (every pod on a node of ``net``) as ``mesh`` says, proxies in ``mode`` or the
    service's own (node proxies: L4), on ``cpus``; see the module docstring."""
    out = Deployed(mesh)
    arch = mesh.architecture
    if arch is Architecture.NONE:
        return out
    job = _Job(
        tb, net, mesh, client, tuple(services), mode, work, cpus, ca or CertAuthority.generate()
    )
    try:
        (_sidecars if arch is Architecture.SIDECAR else _nodes)(job, out)
    except BaseException:
        out.stop()
        raise
    return out


def _start(out: Deployed, role: str, proxy: Proxy, *sides: str) -> None:
    proxy.start()
    out.proxies[role] = proxy
    out.sides[role] = frozenset(sides)


@dataclass(frozen=True)
class _Job:
    """What :func:`deploy` was asked (see there)."""

    tb: Testbed
    net: NodeNet
    mesh: Mesh
    client: Pod | None
    services: tuple[Service, ...]
    mode: Mode
    work: Path
    cpus: tuple[int, ...] | None
    ca: CertAuthority


def _sidecars(j: _Job, out: Deployed) -> None:
    if j.mesh.mtls and j.mesh.proxy != "envoy":
        raise ValueError(f"{j.mesh.name}: mTLS between sidecars is Envoy's here")
    cred = j.ca.issue("workload")
    pods = [(s.pod, s.port, s.mode or j.mode, False) for s in j.services]
    if j.client is not None:
        pods.insert(0, (j.client, 1, j.mode, True))
    if j.mesh.proxy == "nginx" and len(j.services) != 1:
        raise ValueError("nginx forwards outbound traffic to one fixed upstream: one service")
    if j.mesh.proxy != "envoy":
        j.work.mkdir(parents=True, exist_ok=True)
        j.tb.system.run(["chmod", "0711", str(j.work)])  # its uid reaches its own directory
    for pod, port, m, is_client in pods:
        j.tb.mesh(pod, proxy_uid=PROXY_UID)
        place = pod.place(cpus=j.cpus, uid=PROXY_UID)
        app = ("127.0.0.1", port)
        d = j.work / f"sidecar-{pod.name}"
        px: Proxy
        if j.mesh.proxy == "envoy":
            cfg = EnvoyConfig(mode=m, inbound_upstream=app, circuit_breaker_max=2**32 - 1)
            if j.mesh.mtls:
                cfg = sidecar_mtls(cfg, j.ca, cred)
            px = EnvoyProcess(j.tb.registered, cfg, d, place, tool("envoy"))
        elif j.mesh.proxy == "haproxy":
            px = FileProxy(j.tb.registered, HaproxyConfig(m, app), d, place, Path(tool("haproxy")))
        elif j.mesh.proxy == "nginx":
            up = (j.services[0].pod.ip, j.services[0].port)
            cfg_n = NginxConfig(m, app, outbound_upstream=up)
            px = FileProxy(j.tb.registered, cfg_n, d, place, Path(tool("nginx")))
        else:
            raise ValueError(f"{j.mesh.name}: no sidecar {j.mesh.proxy!r}")
        _start(out, f"sidecar:{pod.name}", px, "client" if is_client else "server")


def _nodes(j: _Job, out: Deployed) -> None:
    if j.mesh.proxy != "envoy":
        raise ValueError(f"{j.mesh.name}: node proxies and waypoints are Envoy here")
    node_cred, wp_cred = j.ca.issue("node-proxy"), j.ca.issue("waypoint")
    waypoints: dict[str, Pod] = {}
    if j.mesh.architecture is Architecture.WAYPOINT:
        for s in j.services:  # each on its service's node
            assert s.pod.node is not None
            waypoints[s.name] = j.net.add_pod(f"wp-{s.pod.name}"[:20], s.pod.node)
    routes = tuple(
        WaypointRoute(s.pod.ip, s.port, (waypoints[s.name].ip, MTLS_PORT))
        for s in j.services
        if s.name in waypoints
    )
    pods = [s.pod for s in j.services] + ([] if j.client is None else [j.client])
    used = {p.node for p in pods if p.node is not None}
    extra = tuple(w.ip for w in waypoints.values())
    for name in sorted(used):
        node = j.net.nodes[name]
        j.net.intercept(
            node,
            NodeInterception(
                outbound_ifs=tuple(j.net.veth_of(p) for p in pods if p.node == name),
                inbound_pods=tuple(s.pod.ip for s in j.services if s.pod.node == name),
                mtls_peers=j.net.peers_of(node, extra),
            ),
        )
        cfg = NodeProxyConfig(
            local_cidr=node.pod_cidr,
            downstream_tls=downstream_tls(node_cred, j.ca.cert_pem),
            upstream_tls=upstream_tls(node_cred, j.ca.cert_pem, node_cred.spiffe_id),
            waypoint_tls=upstream_tls(node_cred, j.ca.cert_pem, wp_cred.spiffe_id),
            waypoints=routes,
        )
        px = EnvoyProcess(
            j.tb.registered,
            cfg.bootstrap(),
            j.work / f"node-{name}",
            node.place(cpus=j.cpus, uid=PROXY_UID),
            tool("envoy"),
        )
        serves = {s.pod.node for s in j.services}
        _start(
            out,
            f"node:{name}",
            px,
            *(["client"] if j.client is not None and name == j.client.node else []),
            *(["server"] if name in serves else []),
        )
    for s in j.services:
        wp = waypoints.get(s.name)
        if wp is None:
            continue
        boot = waypoint_bootstrap(
            s.mode or j.mode,
            (s.pod.ip, s.port),
            downstream_tls(wp_cred, j.ca.cert_pem),
            upstream_tls(wp_cred, j.ca.cert_pem, node_cred.spiffe_id),
        )
        px = EnvoyProcess(
            j.tb.registered, boot, j.work / f"wp-{s.name}", wp.place(cpus=j.cpus, uid=PROXY_UID)
        )
        _start(out, f"waypoint:{s.name}", px, "server")
