"""Nodes: network namespaces that route for their pods, joined by the testbed's bridge, so a
call between two pods is intra-node or inter-node, and a per-node proxy can take a node's
traffic (the ambient ztunnel role).

Topology (``<id>`` the run id, ``k`` the node's index from 1)::

    netns mtx-<id>-bridge:     br0 ── vn1 ── vn2 ── …                 (the link between nodes)
                                       │      │
    netns mtx-<id>-node-a:     eth0 10.77.0.x/24, ip_forward; 10.78.j.0/24 via node j's eth0
                               p1, p2 … 10.78.k.1/32, one routed veth per pod (10.78.k.n/32 dev pN)
    netns mtx-<id>-<pod>:      eth0 10.78.k.n/32, default via 10.78.k.1

Pods are routed, not bridged (as Calico lays them out): every packet between two pods passes
its node's netfilter hooks, which is where :func:`node_rules` sends a meshed pod's traffic to
the node's proxy. Namespaces are created through the :class:`~meshtax.testbed.pods.Testbed`
(recorded before they exist, removed on close, reaped after a crash), pods are registered in
``Testbed.pods`` like the bridge's.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from meshtax.testbed.pods import BRIDGE, POD_IF, Pod, Testbed
from meshtax.testbed.system import Placement

__all__ = ["MTLS_PORT", "Node", "NodeInterception", "NodeNet", "node_rules"]

#: where a node proxy terminates mTLS from its peers (Istio's HBONE port)
MTLS_PORT = 15008
NODE_IF = "eth0"
_CHAIN = "MESHTAX_NODE"
_INBOUND = "MESHTAX_NODE_IN"


@dataclass(frozen=True)
class Node:
    """A node's namespace: its address on the bridge and the subnet its pods get."""

    name: str
    netns: str
    ip: str
    pod_cidr: str
    index: int

    @property
    def gateway(self) -> str:
        """The node side of every pod's veth (the pods' default route)."""
        return str(next(ipaddress.IPv4Network(self.pod_cidr).hosts()))

    def place(self, *, cpus: tuple[int, ...] | None = None, uid: int | None = None) -> Placement:
        return Placement(netns=self.netns, cpus=cpus, uid=uid)


@dataclass(frozen=True)
class NodeInterception:
    """What a node's proxy takes (nat PREROUTING of the node; its own connections, in OUTPUT,
    are never taken).

    ``outbound_ifs``: the node sides of meshed pods' veths — their TCP goes to
    ``outbound_port``; ``inbound_pods``: local meshed pods whose inbound TCP the proxy takes,
    from ``mtls_peers`` (other nodes' proxies, waypoints) to ``mtls_port``, from anyone else
    (a client outside the mesh) to ``inbound_port``; ``exclude_ports``: destination ports
    nobody takes (the testbed's direct paths).
    """

    outbound_ifs: tuple[str, ...] = ()
    inbound_pods: tuple[str, ...] = ()
    mtls_peers: tuple[str, ...] = ()
    exclude_ports: tuple[int, ...] = ()
    outbound_port: int = 15001
    inbound_port: int = 15006
    mtls_port: int = MTLS_PORT


def node_rules(c: NodeInterception) -> list[list[str]]:
    """The iptables commands (nat table, in the node's namespace) that install ``c``, in order:
    excluded ports first, then a meshed pod's own traffic (outbound, even to a pod of the
    same node: one crossing), then inbound to a meshed pod by who sends it."""
    nat = ["iptables", "-w", "-t", "nat"]

    def redirect(port: int) -> list[str]:
        return ["-j", "REDIRECT", "--to-ports", str(port)]

    r = [nat + ["-N", _CHAIN], nat + ["-N", _INBOUND]]
    r.append(nat + ["-A", "PREROUTING", "-p", "tcp", "-j", _CHAIN])
    for port in c.exclude_ports:
        r.append(nat + ["-A", _CHAIN, "-p", "tcp", "--dport", str(port), "-j", "RETURN"])
    for ifname in c.outbound_ifs:
        r.append(nat + ["-A", _CHAIN, "-p", "tcp", "-i", ifname, *redirect(c.outbound_port)])
    for ip in c.inbound_pods:
        r.append(nat + ["-A", _CHAIN, "-p", "tcp", "-d", f"{ip}/32", "-j", _INBOUND])
    for ip in c.mtls_peers:
        r.append(nat + ["-A", _INBOUND, "-p", "tcp", "-s", f"{ip}/32", *redirect(c.mtls_port)])
    r.append(nat + ["-A", _INBOUND, "-p", "tcp", *redirect(c.inbound_port)])
    return r


class NodeNet:
    """The nodes of one open testbed and the pods placed on them."""

    def __init__(self, tb: Testbed, pod_net: str = "10.78.0.0/16") -> None:
        self.tb = tb
        self.pod_net = ipaddress.IPv4Network(pod_net)
        self.nodes: dict[str, Node] = {}
        self._pods: dict[str, list[Pod]] = {}
        self._intercepted: set[str] = set()

    def add_node(self, name: str) -> Node:
        """Node ``name``: a namespace on the bridge that forwards, with routes to every other
        node's pods (and theirs to its pods)."""
        netns = self.tb.pod_netns(f"node-{name}")
        if name in self.nodes:
            raise ValueError(f"node {name!r} exists")
        k = len(self.nodes) + 1
        subnets = list(self.pod_net.subnets(new_prefix=24))
        if k >= len(subnets):
            raise RuntimeError(f"{self.pod_net} has no subnet left for node {name!r}")
        node = Node(name, netns, self.tb.claim_address(), str(subnets[k]), k)
        self.tb.add_netns(netns)
        run = self.tb.system.run
        br = ["ip", "-n", self.tb.bridge_netns]
        run(_sysctls(forward=True), place=Placement(netns=netns))
        run(br + ["link", "add", f"vn{k}", "type", "veth", "peer", "name", NODE_IF, "netns", netns])
        run(br + ["link", "set", f"vn{k}", "master", BRIDGE, "up"])
        ipn = ["ip", "-n", netns]
        run(ipn + ["addr", "add", f"{node.ip}/{self.tb.subnet.prefixlen}", "dev", NODE_IF])
        run(ipn + ["link", "set", NODE_IF, "up"])
        run(ipn + ["link", "set", "lo", "up"])
        for other in self.nodes.values():
            run(ipn + ["route", "add", other.pod_cidr, "via", other.ip])
            run(["ip", "-n", other.netns, "route", "add", node.pod_cidr, "via", node.ip])
        self.nodes[name] = node
        self._pods[name] = []
        return node

    def add_pod(self, name: str, node: Node | str) -> Pod:
        """Pod ``name`` on ``node``: its own namespace, routed through the node."""
        n = self.nodes[node if isinstance(node, str) else node.name]
        if name.startswith("node-"):
            raise ValueError(f"pod name {name!r}: 'node-' names the nodes")
        netns = self.tb.pod_netns(name)
        on = self._pods[n.name]
        hosts = ipaddress.IPv4Network(n.pod_cidr).hosts()
        next(hosts)  # .1: the node side
        ip = str([h for _, h in zip(range(len(on) + 1), hosts)][-1])
        veth = f"p{len(on) + 1}"
        self.tb.add_netns(netns)
        run = self.tb.system.run
        run(_sysctls(forward=False), place=Placement(netns=netns))
        ipn, ipp = ["ip", "-n", n.netns], ["ip", "-n", netns]
        run(ipn + ["link", "add", veth, "type", "veth", "peer", "name", POD_IF, "netns", netns])
        run(ipn + ["addr", "add", f"{n.gateway}/32", "dev", veth])
        run(ipn + ["link", "set", veth, "up"])
        run(ipn + ["route", "add", f"{ip}/32", "dev", veth])
        run(ipp + ["addr", "add", f"{ip}/32", "dev", POD_IF])
        run(ipp + ["link", "set", POD_IF, "up"])
        run(ipp + ["link", "set", "lo", "up"])
        run(ipp + ["route", "add", n.gateway, "dev", POD_IF, "scope", "link"])
        run(ipp + ["route", "add", "default", "via", n.gateway, "dev", POD_IF])
        pod = Pod(name, netns, ip, node=n.name)
        self.tb.pods[name] = pod
        on.append(pod)
        return pod

    def pods_on(self, node: Node | str) -> list[Pod]:
        return list(self._pods[node if isinstance(node, str) else node.name])

    def veth_of(self, pod: Pod) -> str:
        """The node side of ``pod``'s veth (what :attr:`NodeInterception.outbound_ifs` names)."""
        if pod.node is None:
            raise ValueError(f"pod {pod.name!r} is not on a node")
        return f"p{[p.name for p in self._pods[pod.node]].index(pod.name) + 1}"

    def intercept(self, node: Node, c: NodeInterception) -> None:
        """Install ``c`` in ``node`` (the rules vanish with its namespace); once: a node has
        one proxy."""
        if node.name in self._intercepted:
            raise ValueError(f"node {node.name!r} already sends its pods' traffic to a proxy")
        self._intercepted.add(node.name)
        for argv in node_rules(c):
            self.tb.system.run(argv, place=Placement(netns=node.netns))

    def peers_of(self, node: Node, extra: Sequence[str] = ()) -> tuple[str, ...]:
        """Who speaks mTLS to ``node``'s proxy: every other node (its proxy's connections
        leave from the node's address) and ``extra`` (waypoints)."""
        return (*(n.ip for n in self.nodes.values() if n.name != node.name), *extra)


def _sysctls(*, forward: bool) -> list[str]:
    # no IPv6 chatter while measuring; a node forwards, and checks no reverse path (pods
    # share the gateway address on every veth)
    keys = ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
    if forward:
        keys += [
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        ]
    return ["sysctl", "-q", "-w", *keys]
