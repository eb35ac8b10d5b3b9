"""The one-hop bed on nodes: what ``meshtax profile --architecture node-l4|waypoint`` measures.

Two nodes (:mod:`meshtax.testbed.nodes`), a node proxy on each
(:class:`~meshtax.testbed.envoy.roles.NodeProxyConfig`, mTLS between them), the client pod
(meshed) on node ``a`` and two server pods with the fortio echo, ``server`` on ``a`` and
``remote`` on ``b``::

    node-l4, intra (the profile):   client ─► node proxy a ─────────────────────► server:app
    node-l4, inter (mTLS step):     client ─► node proxy a ─mTLS─► node proxy b ─► remote:app
    waypoint (the profile):         client ─► node proxy a ─mTLS─► waypoint (on b) ─mTLS─►
                                               node proxy b ─► remote:app

The meshed path calls a service port (:data:`SERVICE_PORT`), which the node proxies deliver
to the app's port of the mode (``port_override``), as the sidecar bed's inbound listener
forwards to the app. The comparison path (:meth:`NodeBed.direct_target`) is, for node-l4, the
app's port, which no node takes (plain routing through the nodes); for a waypoint, a second
service port without a waypoint (:data:`PLAIN_PORT`): the node-l4 path of the same pods, so
meshed − direct is what the waypoint adds. The proxy the probe watches as "the sidecar" is
node proxy ``a`` (node-l4) or the waypoint; the other proxies on both paths are
:attr:`NodeBed.path_pids`, whose change counts as the app's does
(:mod:`meshtax.profile.decompose`).

:class:`NodeBed` has the :class:`~meshtax.testbed.bed.EchoBed` interface the profiler uses.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshtax.model.proxy import ProxyChoice, ProxyError
from meshtax.model.sidecar import Architecture, Mode
from meshtax.testbed.bed import APP_PORTS, PROXY_UID, SERVICE_PORT, ClientBed
from meshtax.testbed.certs import CertAuthority, downstream_tls, upstream_tls
from meshtax.testbed.envoy.config import EnvoyConfig
from meshtax.testbed.envoy.process import EnvoyProcess
from meshtax.testbed.envoy.roles import NodeProxyConfig, WaypointRoute, waypoint_bootstrap
from meshtax.testbed.fortio import FortioServer
from meshtax.testbed.nodes import MTLS_PORT, Node, NodeInterception, NodeNet
from meshtax.testbed.pinning import Pinning
from meshtax.testbed.pods import Pod, Testbed
from meshtax.testbed.tools import tool

__all__ = ["PLAIN_PORT", "NodeBed", "RoleSet", "describe", "node_testbed"]

#: a service port with no waypoint (the waypoint bed's comparison path)
PLAIN_PORT = 8081
#: the placements a bed serves: which server pod the meshed path reaches
PLACEMENTS = ("intra", "inter")


@dataclass
class RoleSet:
    """The proxies of one measured set-up, started and stopped together; ``main`` is the one
    the probe and perf watch (it satisfies :class:`~meshtax.testbed.proxy.Proxy`)."""

    main: EnvoyProcess
    others: tuple[EnvoyProcess, ...] = ()

    @property
    def pid(self) -> int:
        return self.main.pid

    @property
    def config(self) -> object:
        return self.main.config

    @property
    def path_pids(self) -> tuple[int, ...]:
        return tuple(p.pid for p in self.others)

    @property
    def pids(self) -> tuple[int, ...]:
        return (self.main.pid, *self.path_pids)

    def start(self) -> None:
        started: list[EnvoyProcess] = []
        try:
            for p in (*self.others, self.main):
                p.start()
                started.append(p)
        except BaseException:
            for p in reversed(started):
                p.stop()
            raise

    def stop(self) -> int | None:
        codes = [p.stop() for p in (self.main, *reversed(self.others))]
        return codes[0]


@dataclass
class NodeBed(ClientBed):
    """A running node bed (see the module docstring)."""

    testbed: Testbed
    net: NodeNet
    architecture: Architecture
    placement: str
    client: Pod
    servers: Mapping[str, Pod]  # by placement
    apps: Mapping[str, FortioServer]
    waypoint: Pod | None
    pinning: Pinning
    envoy_bin: Path | None
    fortio_bin: Path
    workdir: Path
    ca: CertAuthority
    proxy: ProxyChoice = ProxyChoice()
    proxy_bin: Path | None = None
    meshed_app: FortioServer | None = None
    sockets: Path | None = None
    cgroup: str | None = None
    running: RoleSet | None = field(default=None, repr=False)

    @property
    def server(self) -> Pod:
        return self.servers[self.placement]

    @property
    def app(self) -> FortioServer:
        return self.apps[self.placement]

    @property
    def app_pid(self) -> int:
        assert self.app.process is not None
        return self.app.process.pid

    @property
    def meshed_app_pid(self) -> int:
        return self.app_pid

    @property
    def path_pids(self) -> tuple[int, ...]:
        """The running proxies on both paths besides the watched one."""
        return () if self.running is None else self.running.path_pids

    @property
    def cpu_chain(self) -> bool:
        """A waypoint's path has three busy proxies on the app's CPU; node-l4's one (the other
        node's proxy idles on the intra-node path), as a sidecar's bed."""
        return self.architecture is Architecture.WAYPOINT

    @property
    def meshed_target(self) -> str:
        return self.target(self.placement)

    def target(self, placement: str) -> str:
        """The meshed path to the server of ``placement``."""
        return f"{self.servers[placement].ip}:{SERVICE_PORT}"

    def direct_target(self, mode: Mode, placement: str | None = None) -> str:
        ip = self.servers[placement or self.placement].ip
        if self.architecture is Architecture.WAYPOINT:
            return f"{ip}:{PLAIN_PORT}"
        return f"{ip}:{APP_PORTS[mode]}"

    def start_sidecar(
        self,
        mode: Mode,
        cfg: EnvoyConfig | None = None,
        *,
        name: str | None = None,
        app: Mode | None = None,
    ) -> _Tracked:
        """Start the architecture's proxies for ``mode`` (node proxies delivering to the app's
        port of ``app``, default ``mode``; a waypoint in ``mode``); stop them when done."""
        if cfg is not None:
            raise ProxyError("a node bed builds its own proxy configs")
        if self.running is not None:
            raise ProxyError("the node bed's proxies are running; stop them first")
        work = self.workdir / (name or mode.value)
        if self.architecture is Architecture.NODE_L4 and mode is not Mode.TCP:
            raise ProxyError("a node proxy is L4: tcp mode (carrying http or grpc)")
        nodes = {n.name: self._node_proxy(n, APP_PORTS[app or mode], work) for n in self._nodes()}
        if self.architecture is Architecture.NODE_L4:
            roles = RoleSet(nodes["a"], (nodes["b"],))
        else:
            roles = RoleSet(self._waypoint(mode, work), (nodes["a"], nodes["b"]))
        roles.start()
        self.running = roles
        return _Tracked(self, roles)

    def _nodes(self) -> list[Node]:
        return [self.net.nodes["a"], self.net.nodes["b"]]

    def _node_proxy(self, node: Node, port: int, work: Path) -> EnvoyProcess:
        cred = self.ca.issue("node-proxy")
        peer = cred.spiffe_id
        routes: tuple[WaypointRoute, ...] = ()
        wp_tls = None
        if self.waypoint is not None:
            wp_id = self.ca.issue("waypoint").spiffe_id
            routes = (WaypointRoute(self.server.ip, SERVICE_PORT, (self.waypoint.ip, MTLS_PORT)),)
            wp_tls = upstream_tls(cred, self.ca.cert_pem, wp_id)
        cfg = NodeProxyConfig(
            local_cidr=node.pod_cidr,
            downstream_tls=downstream_tls(cred, self.ca.cert_pem),
            upstream_tls=upstream_tls(cred, self.ca.cert_pem, peer),
            waypoint_tls=wp_tls,
            waypoints=routes,
            port_override=port,
        )
        return EnvoyProcess(
            self.testbed.registered,
            cfg.bootstrap(),
            work / f"node-{node.name}",
            node.place(cpus=self.pinning.sidecars, uid=PROXY_UID),
            self.envoy_bin,
        )

    def _waypoint(self, mode: Mode, work: Path) -> EnvoyProcess:
        assert self.waypoint is not None
        cred = self.ca.issue("waypoint")
        node_id = self.ca.issue("node-proxy").spiffe_id
        boot = waypoint_bootstrap(
            mode,
            (self.server.ip, SERVICE_PORT),
            downstream_tls(cred, self.ca.cert_pem),
            upstream_tls(cred, self.ca.cert_pem, node_id),
        )
        return EnvoyProcess(
            self.testbed.registered,
            boot,
            work / "waypoint",
            self.waypoint.place(cpus=self.pinning.sidecars, uid=PROXY_UID),
            self.envoy_bin,
        )


class _Tracked:
    """A started :class:`RoleSet` that tells its bed when it stops."""

    def __init__(self, bed: NodeBed, roles: RoleSet) -> None:
        self.bed, self.roles = bed, roles

    @property
    def pid(self) -> int:
        return self.roles.pid

    @property
    def config(self) -> object:
        return self.roles.config

    @property
    def pids(self) -> tuple[int, ...]:
        return self.roles.pids

    def start(self) -> None:
        self.roles.start()
        self.bed.running = self.roles

    def stop(self) -> int | None:
        try:
            return self.roles.stop()
        finally:
            self.bed.running = None


@contextmanager
def node_testbed(
    tb: Testbed,
    pinning: Pinning,
    architecture: Architecture | str,
    *,
    placement: str | None = None,
    envoy_bin: Path | None = None,
    fortio_bin: Path | None = None,
) -> Iterator[NodeBed]:
    """Build the :class:`NodeBed` of ``architecture`` (node-l4 or waypoint) in the open
    testbed ``tb`` and yield it; ``placement``: where the meshed path's server is (default:
    intra for node-l4, inter for a waypoint, which runs on the server's node)."""
    arch = Architecture(architecture)
    if arch not in (Architecture.NODE_L4, Architecture.WAYPOINT):
        raise ProxyError(f"a node bed measures node-l4 or waypoint, not {arch.value}")
    where = placement or ("intra" if arch is Architecture.NODE_L4 else "inter")
    if where not in PLACEMENTS:
        raise ValueError(f"placement {where!r}: expected one of {', '.join(PLACEMENTS)}")
    envoy_bin = envoy_bin or tool("envoy")
    fortio_bin = fortio_bin or tool("fortio")
    work = tb.scratch_dir("meshtax-nodes-")
    net = NodeNet(tb)
    a, b = net.add_node("a"), net.add_node("b")
    client = net.add_pod("client", a)
    servers = {"intra": net.add_pod("server", a), "inter": net.add_pod("remote", b)}
    waypoint = net.add_pod("waypoint", b) if arch is Architecture.WAYPOINT else None
    peers_extra = (waypoint.ip,) if waypoint is not None else ()
    excluded = tuple(APP_PORTS.values())
    for node in (a, b):
        meshed = [p for p in net.pods_on(node) if p is not waypoint]
        net.intercept(
            node,
            NodeInterception(
                outbound_ifs=tuple(net.veth_of(p) for p in meshed if p is client),
                inbound_pods=tuple(p.ip for p in meshed if p is not client),
                mtls_peers=net.peers_of(node, peers_extra),
                exclude_ports=excluded,
            ),
        )
    apps: dict[str, FortioServer] = {}
    with ExitStack() as stack:
        for where_, pod in servers.items():
            app = FortioServer(
                tb.registered,
                work / f"app-{pod.name}",
                host="0.0.0.0",
                http_port=APP_PORTS[Mode.HTTP],
                grpc_port=APP_PORTS[Mode.GRPC],
                tcp_port=APP_PORTS[Mode.TCP],
                place=pod.place(cpus=pinning.app),
                binary=fortio_bin,
            )
            app.start()
            stack.callback(app.stop)
            apps[where_] = app
        yield NodeBed(
            tb,
            net,
            arch,
            where,
            client,
            servers,
            apps,
            waypoint,
            pinning,
            envoy_bin,
            fortio_bin,
            work,
            CertAuthority.generate(),
        )


def describe(bed: NodeBed) -> dict[str, Any]:
    """Where everything ran, for a profile's record."""
    return {
        "architecture": bed.architecture.value,
        "placement": bed.placement,
        "nodes": {n.name: {"ip": n.ip, "pods": n.pod_cidr} for n in bed.net.nodes.values()},
        "client": bed.client.node,
        "servers": {k: p.node for k, p in bed.servers.items()},
        "waypoint": None if bed.waypoint is None else bed.waypoint.node,
    }
