"""Nodes: exact commands and rules against FakeSystem, and the real thing as root (routing
between nodes, each node's interception, nothing left behind)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshtax.testbed.nodes import NodeInterception, NodeNet, node_rules
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import Placement, RealSystem
from tests.testbed.test_pods import (
    LOCK_WAIT,
    fake_bed,
    needs_root,
    netns_now,
    probe,
    start_listener,
)

NODE_RULES = """\
-N MESHTAX_NODE
-N MESHTAX_NODE_IN
-A PREROUTING -p tcp -j MESHTAX_NODE
-A MESHTAX_NODE -p tcp --dport 9078 -j RETURN
-A MESHTAX_NODE -p tcp -i p1 -j REDIRECT --to-ports 15001
-A MESHTAX_NODE -p tcp -d 10.78.1.3/32 -j MESHTAX_NODE_IN
-A MESHTAX_NODE_IN -p tcp -s 10.77.0.3/32 -j REDIRECT --to-ports 15008
-A MESHTAX_NODE_IN -p tcp -j REDIRECT --to-ports 15006"""


def test_node_rules_exact() -> None:
    c = NodeInterception(("p1",), ("10.78.1.3",), ("10.77.0.3",), (9078,))
    rules = node_rules(c)
    assert all(r[:4] == ["iptables", "-w", "-t", "nat"] for r in rules)
    assert "\n".join(" ".join(r[4:]) for r in rules) == NODE_RULES


def test_nodes_and_pods_commands(tmp_path: Path) -> None:
    tb, sysm, _ = fake_bed(tmp_path)
    with tb:
        net = NodeNet(tb)
        a = net.add_node("a")
        start = len(sysm.calls)
        b = net.add_node("b")
        assert (a.netns, a.ip, a.pod_cidr, a.gateway) == (
            "mtx-abc123-node-a",
            "10.77.0.2",
            "10.78.1.0/24",
            "10.78.1.1",
        )
        assert (b.ip, b.pod_cidr) == ("10.77.0.3", "10.78.2.0/24")
        issued = sysm.calls[start:]
        assert issued[0] == ("ip", "netns", "add", "mtx-abc123-node-b")
        assert issued[1][4:] == (
            "sysctl",
            "-q",
            "-w",
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        )
        # each node routes to the other's pods through its address on the bridge
        assert issued[-2:] == [
            ("ip", "-n", b.netns, "route", "add", "10.78.1.0/24", "via", "10.77.0.2"),
            ("ip", "-n", a.netns, "route", "add", "10.78.2.0/24", "via", "10.77.0.3"),
        ]
        start = len(sysm.calls)
        c1, c2 = net.add_pod("c1", a), net.add_pod("c2", "a")
        assert (c1.ip, c1.node, c2.ip) == ("10.78.1.2", "a", "10.78.1.3")
        assert net.veth_of(c2) == "p2" and tb.pods["c1"] is c1
        pod_calls = sysm.calls[start : start + 11]
        assert pod_calls[2:] == [
            ("ip", "-n", a.netns, "link", "add", "p1", "type", "veth", "peer", "name", "eth0")
            + ("netns", c1.netns),
            ("ip", "-n", a.netns, "addr", "add", "10.78.1.1/32", "dev", "p1"),
            ("ip", "-n", a.netns, "link", "set", "p1", "up"),
            ("ip", "-n", a.netns, "route", "add", "10.78.1.2/32", "dev", "p1"),
            ("ip", "-n", c1.netns, "addr", "add", "10.78.1.2/32", "dev", "eth0"),
            ("ip", "-n", c1.netns, "link", "set", "eth0", "up"),
            ("ip", "-n", c1.netns, "link", "set", "lo", "up"),
            ("ip", "-n", c1.netns, "route", "add", "10.78.1.1", "dev", "eth0", "scope", "link"),
            ("ip", "-n", c1.netns, "route", "add", "default", "via", "10.78.1.1", "dev", "eth0"),
        ]
        assert net.peers_of(a, ("10.78.2.9",)) == ("10.77.0.3", "10.78.2.9")
        start = len(sysm.calls)
        c = NodeInterception(("p1",))
        net.intercept(a, c)
        assert sysm.calls[start:] == [
            tuple(Placement(netns=a.netns).wrap(r)) for r in node_rules(c)
        ]
        with pytest.raises(ValueError, match="already sends"):
            net.intercept(a, c)  # one proxy a node
        with pytest.raises(ValueError, match="exists"):
            net.add_node("a")
        with pytest.raises(ValueError, match="names the nodes"):
            net.add_pod("node-x", a)
        with pytest.raises(ValueError, match="exists"):
            net.add_pod("c1", b)
    # every namespace goes with the testbed, newest first
    dels = [c[3] for c in sysm.calls if c[:3] == ("ip", "netns", "del")]
    assert dels == [c2.netns, c1.netns, b.netns, a.netns, "mtx-abc123-bridge"]


@pytest.mark.root
@needs_root
def test_real_nodes_route_and_intercept(tmp_path: Path) -> None:
    """A meshed pod's call is taken by its node's proxy port, original destination kept; a
    node's own connection to another node's pod is taken there as mTLS (it comes from a
    peer), an outsider's as plaintext; excluded ports and unmeshed pods route plainly."""
    with Testbed(RealSystem(), lock_timeout=LOCK_WAIT) as tb:
        net = NodeNet(tb)
        a, b = net.add_node("a"), net.add_node("b")
        client, server = net.add_pod("client", a), net.add_pod("server", a)
        remote, outsider = net.add_pod("remote", b), net.add_pod("outsider", b)
        names = {n.netns for n in (a, b)} | {p.netns for p in (client, server, remote, outsider)}
        assert names <= netns_now()
        for node, meshed_out, inbound in ((a, [client], [server]), (b, [], [remote])):
            net.intercept(
                node,
                NodeInterception(
                    tuple(net.veth_of(p) for p in meshed_out),
                    tuple(p.ip for p in inbound),
                    net.peers_of(node),
                    (9078,),
                ),
            )
        for node in (a, b):  # the node proxies' ports, as a proxy's uid
            start_listener(tb, node, 1337, [15001, 15006, 15008], tmp_path)
        for pod in (server, remote):
            start_listener(tb, pod, 0, [8080, 9078], tmp_path)
        srv, rem = f"{server.ip}:8080", f"{remote.ip}:8080"
        assert probe(client, server.ip, 8080) == f"port=15001 orig={srv} uid=1337"
        assert probe(client, remote.ip, 8080) == f"port=15001 orig={rem} uid=1337"
        assert probe(client, remote.ip, 9078).startswith("port=9078 orig=- ")
        assert probe(a, remote.ip, 8080) == f"port=15008 orig={rem} uid=1337"
        assert probe(outsider, remote.ip, 8080) == f"port=15006 orig={rem} uid=1337"
        assert probe(outsider, server.ip, 8080) == f"port=15006 orig={srv} uid=1337"
        assert probe(a, server.ip, 8080).startswith("port=8080 ")  # a node's own: no rule
    assert not names & netns_now()
