"""Meshing pods on nodes one way or another: the proxies started per mesh, by role and side,
the rules installed (fakes), and every mesh carrying a call for real (root)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from meshtax.model.sidecar import Mode
from meshtax.testbed import procfs
from meshtax.testbed.fortio import FortioServer, run_load
from meshtax.testbed.meshes import MESHES, Service, deploy
from meshtax.testbed.nodes import NodeNet
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import Completed, FakeSystem, RealSystem
from meshtax.testbed.tools import find_tool
from tests.testbed.test_pods import LOCK_WAIT, alive, fake_procs, netns_now


def _live(argv: tuple[str, ...]) -> Completed | None:
    return Completed(argv, 0, "LIVE\n", "") if "curl" in argv else None


def _bed(tmp_path: Path) -> tuple[Testbed, FakeSystem]:
    sysm = FakeSystem(responders=[_live])
    return Testbed(sysm, "abc123", state_dir=tmp_path, procs=fake_procs()), sysm


def _envoy_boots(sysm: FakeSystem) -> list[dict[str, object]]:
    return [
        json.loads(p.argv[list(p.argv).index("--config-yaml") + 1])
        for p in sysm.processes
        if "--config-yaml" in p.argv
    ]


@pytest.mark.parametrize("where", ["intra", "inter"])
def test_waypoint_mesh_roles_sides_and_rules(tmp_path: Path, where: str) -> None:
    tb, sysm = _bed(tmp_path)
    with tb:
        net = NodeNet(tb)
        a = net.add_node("a")
        b = a if where == "intra" else net.add_node("b")
        client, server = net.add_pod("client", a), net.add_pod("server", b)
        d = deploy(
            tb, net, MESHES["waypoint"], client, [Service("s", server, 8080)], Mode.HTTP, tmp_path
        )
        sides = {r: sorted(s) for r, s in d.sides.items()}
        if where == "intra":
            assert sides == {"node:a": ["client", "server"], "waypoint:s": ["server"]}
        else:
            assert sides == {"node:a": ["client"], "node:b": ["server"], "waypoint:s": ["server"]}
        assert set(d.pids("client")) == {"node:a"}
        wp = tb.pods["wp-server"]
        assert wp.node == b.name
        # every node proxy sends the service's traffic to its waypoint, mTLS
        boots = _envoy_boots(sysm)
        nodes = [
            x for x in boots if x["node"] == {"id": "meshtax-node-proxy", "cluster": "meshtax"}
        ]
        assert len(nodes) == len({a.name, b.name})
        for boot in nodes:
            assert f'"address": "{wp.ip}"' in json.dumps(boot)
        # server's node: the waypoint's own calls come in as mTLS, the client's pod goes out
        rules = [" ".join(c) for c in sysm.calls if "iptables" in c]
        assert any(f"-s {wp.ip}/32 -j REDIRECT --to-ports 15008" in r for r in rules)
        assert any(f"-i {net.veth_of(client)} -j REDIRECT --to-ports 15001" in r for r in rules)
        d.stop()


def test_sidecar_meshes_intercept_in_the_pods(tmp_path: Path) -> None:
    tb, sysm = _bed(tmp_path)
    with tb:
        net = NodeNet(tb)
        a = net.add_node("a")
        client, server = net.add_pod("client", a), net.add_pod("server", a)
        d = deploy(
            tb, net, MESHES["envoy-mtls"], client, [Service("s", server, 8080)], Mode.HTTP, tmp_path
        )
        assert {r: sorted(s) for r, s in d.sides.items()} == {
            "sidecar:client": ["client"],
            "sidecar:server": ["server"],
        }
        assert set(tb.meshed) == {"client", "server"}  # istio rules in both pods
        assert not [c for c in sysm.calls if "MESHTAX_NODE" in c]  # nothing in the node
        boots = _envoy_boots(sysm)
        assert all("DownstreamTlsContext" in json.dumps(x) for x in boots)
        d.stop()
        with pytest.raises(ValueError, match="Envoy's"):
            deploy(
                tb,
                net,
                dataclasses.replace(MESHES["haproxy"], mtls=True),
                client,
                [Service("s", server, 8080)],
                Mode.HTTP,
                tmp_path,
            )
        baseline = deploy(tb, net, MESHES["baseline"], client, [], Mode.HTTP, tmp_path)
        assert not baseline.proxies


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not all(find_tool(t) for t in ("envoy", "fortio", "haproxy", "nginx")),
    reason="needs root, Envoy, fortio, HAProxy and nginx",
)


@pytest.mark.root
@needs_root
@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_real_every_mesh_carries_calls(tmp_path: Path, mesh: str) -> None:
    """Intra- and inter-node, through the mesh's proxies (every proxy saw CPU); nothing is left
    when the testbed closes."""
    with Testbed(RealSystem(), lock_timeout=LOCK_WAIT) as tb:
        net = NodeNet(tb)
        pids: list[int] = []
        for where in ("intra", "inter"):  # nodes of their own: one proxy a node
            a = net.add_node(f"{where}-a")
            node = a if where == "intra" else net.add_node(f"{where}-b")
            client = net.add_pod(f"c-{where}", a)
            server = net.add_pod(f"s-{where}", node)
            app = FortioServer(
                tb.registered,
                tmp_path / f"app-{where}",
                host="0.0.0.0",
                http_port=8080,
                place=server.place(),
            )
            app.start()
            work = tb.scratch_dir("meshtax-test-")
            d = deploy(tb, net, MESHES[mesh], client, [Service("s", server, 8080)], Mode.HTTP, work)
            before = procfs.cpu_ns(list(d.pids().values()))
            r = run_load(
                f"{server.ip}:8080",
                Mode.HTTP,
                100,
                0,
                n=200,
                system=RealSystem(),
                place=client.place(),
            )
            assert r.count == 200 and not r.errors, (mesh, where)
            after = procfs.cpu_ns(list(d.pids().values()))
            assert all(after[p] > before[p] for p in before), (mesh, where)
            pids += [*d.pids().values(), app.process.pid if app.process else 0]
        names = {n.netns for n in net.nodes.values()}
    assert not names & netns_now()
    assert not [p for p in pids if alive(p)]
