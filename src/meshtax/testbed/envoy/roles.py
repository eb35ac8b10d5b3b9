"""Envoy in the roles of a sidecarless mesh (pure: bootstraps, no process): the per-node L4
proxy (the ambient ztunnel role) and the waypoint (a shared L7 proxy in front of a service).

Node proxy (:class:`NodeProxyConfig`), ``tcp_proxy`` only, fed by
:func:`~meshtax.testbed.nodes.node_rules`::

    :15001 outbound (a meshed pod's connections; original_dst recovers where they go)
        to a service with a waypoint ─mTLS─► that waypoint
        to a pod of this node        ──────► the pod                 (one crossing, plaintext)
        anywhere else                ─mTLS─► the pod's address: its node's proxy takes it on :15008
    :15008 inbound mTLS (other nodes' proxies, waypoints) ──► the local pod
    :15006 inbound plaintext (a client outside the mesh)  ──► the local pod

mTLS rides the original connection (no HBONE tunnel: the destination node recovers the
original destination as the source node did). ``port_override``: every delivery to a local pod
goes to that port (the one-hop bed's meshed path calls a service port, and the app listens
elsewhere, as the sidecar bed's inbound forwards to the app's port).

Waypoint (:func:`waypoint_bootstrap`): the sidecar's inbound side in the service's mode on
:15008, terminating mTLS from the caller's node proxy and originating it toward the service's
address (which the service's node proxy takes on its :15008).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from meshtax.model.sidecar import Mode
from meshtax.testbed.envoy.config import EnvoyConfig, bootstrap, config_hash

__all__ = ["NodeProxyConfig", "WaypointRoute", "waypoint_bootstrap", "waypoint_key"]

_TCP = "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"
_ORIG = "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"


@dataclass(frozen=True)
class WaypointRoute:
    """Connections to ``service`` (``host``, and ``port`` unless None) go to the waypoint at
    ``waypoint``."""

    host: str
    port: int | None
    waypoint: tuple[str, int]


@dataclass(frozen=True)
class NodeProxyConfig:
    """One node's proxy. ``local_cidr``: its pods; ``downstream_tls``/``upstream_tls``: the
    transport sockets of its mTLS (:func:`~meshtax.testbed.certs.downstream_tls`, and the
    upstream one toward other nodes' proxies); ``waypoint_tls``: toward waypoints (another
    identity); ``waypoints``: services fronted by one."""

    local_cidr: str
    downstream_tls: Mapping[str, Any]
    upstream_tls: Mapping[str, Any]
    waypoint_tls: Mapping[str, Any] | None = None
    waypoints: tuple[WaypointRoute, ...] = ()
    port_override: int | None = None
    outbound_port: int = 15001
    inbound_port: int = 15006
    mtls_port: int = 15008
    admin_port: int = 15000
    concurrency: int = 1
    connect_timeout_s: float = 1.0
    extra_args: tuple[str, ...] = field(default=())

    def bootstrap(self) -> dict[str, Any]:
        """The Envoy v3 bootstrap of this node proxy."""
        local = _orig_cluster("local", self.connect_timeout_s, None, self.port_override)
        remote = _orig_cluster("remote", self.connect_timeout_s, self.upstream_tls, None)
        clusters = [local, remote]
        chains: list[dict[str, Any]] = []
        for k, w in enumerate(self.waypoints):
            name = f"waypoint_{k}"
            tls = self.waypoint_tls if self.waypoint_tls is not None else self.upstream_tls
            clusters.append(_static_cluster(name, w.waypoint, self.connect_timeout_s, tls))
            match: dict[str, Any] = {"prefix_ranges": [_prefix(f"{w.host}/32")]}
            if w.port is not None:
                match["destination_port"] = w.port
            chains.append({"filter_chain_match": match, "filters": [_tcp(name, name)]})
        chains.append(
            {
                "filter_chain_match": {"prefix_ranges": [_prefix(self.local_cidr)]},
                "filters": [_tcp("local", "local")],
            }
        )
        outbound = _listener("outbound", self.outbound_port, chains)
        outbound["default_filter_chain"] = {"filters": [_tcp("remote", "remote")]}
        mtls_chain = {
            "filters": [_tcp("inbound_mtls", "local")],
            "transport_socket": _copy(self.downstream_tls),
        }
        return {
            "node": {"id": "meshtax-node-proxy", "cluster": "meshtax"},
            "admin": {"address": _addr("127.0.0.1", self.admin_port)},
            "static_resources": {
                "listeners": [
                    outbound,
                    _listener("inbound_mtls", self.mtls_port, [mtls_chain]),
                    _listener(
                        "inbound", self.inbound_port, [{"filters": [_tcp("inbound", "local")]}]
                    ),
                ],
                "clusters": clusters,
            },
        }

    def key(self) -> str:
        """Hash of what shapes the proxy's work: not its addresses, ports or certificates,
        but whether it has waypoints to send to and how many workers it runs."""
        neutral = replace(
            self,
            local_cidr="10.0.0.0/24",
            downstream_tls=_neutral_tls(self.downstream_tls),
            upstream_tls=_neutral_tls(self.upstream_tls),
            waypoint_tls=None if self.waypoint_tls is None else _neutral_tls(self.waypoint_tls),
            waypoints=tuple(
                WaypointRoute("10.0.0.1", None, ("10.0.0.2", 1)) for _ in self.waypoints[:1]
            ),
            port_override=None,
        )
        return config_hash(
            {
                "node_proxy": neutral.bootstrap(),
                "concurrency": self.concurrency,
                "args": list(self.extra_args),
            }
        )


def waypoint_bootstrap(
    mode: Mode,
    service: tuple[str, int],
    downstream_tls: Mapping[str, Any],
    upstream_tls: Mapping[str, Any],
    *,
    port: int = 15008,
    http_filters: tuple[Mapping[str, Any], ...] = (),
) -> dict[str, Any]:
    """A waypoint in ``mode`` in front of ``service``: the sidecar's inbound listener on
    ``port`` terminating mTLS, its cluster originating mTLS to the service's address."""
    cfg = EnvoyConfig(
        mode=mode,
        inbound_port=port,
        inbound_upstream=service,
        inbound_tls=downstream_tls,
        http_filters=http_filters,
        circuit_breaker_max=2**32 - 1,
    )
    boot = bootstrap(cfg)
    res = boot["static_resources"]
    res["listeners"] = [x for x in res["listeners"] if x["name"] == "inbound"]
    res["listeners"][0].pop("listener_filters", None)  # addressed directly, not redirected
    res["clusters"] = [c for c in res["clusters"] if c["name"].startswith("inbound")]
    res["clusters"][0]["transport_socket"] = _copy(upstream_tls)
    boot["node"] = {"id": "meshtax-waypoint", "cluster": "meshtax"}
    return boot


def waypoint_key(mode: Mode) -> str:
    """The waypoint's config key (as :meth:`NodeProxyConfig.key`: no addresses, no keys)."""
    tls = _neutral_tls({"on": True})
    return config_hash({"waypoint": waypoint_bootstrap(mode, ("10.0.0.1", 1), tls, tls)})


def _addr(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _prefix(cidr: str) -> dict[str, Any]:
    host, _, plen = cidr.partition("/")
    return {"address_prefix": host, "prefix_len": int(plen or 32)}


def _tcp(stat: str, cluster: str) -> dict[str, Any]:
    return {
        "name": "envoy.filters.network.tcp_proxy",
        "typed_config": {"@type": _TCP, "stat_prefix": stat, "cluster": cluster},
    }


def _listener(name: str, port: int, chains: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": name,
        "address": _addr("0.0.0.0", port),
        # recovers SO_ORIGINAL_DST after the node's REDIRECT
        "listener_filters": [
            {"name": "envoy.filters.listener.original_dst", "typed_config": {"@type": _ORIG}}
        ],
        "filter_chains": chains,
    }


def _orig_cluster(
    name: str, timeout: float, tls: Mapping[str, Any] | None, port: int | None
) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": name,
        "connect_timeout": f"{timeout}s",
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "circuit_breakers": {"thresholds": [_UNLIMITED]},
    }
    if port is not None:
        c["original_dst_lb_config"] = {"upstream_port_override": port}
    if tls is not None:
        c["transport_socket"] = _copy(tls)
    return c


def _static_cluster(
    name: str, at: tuple[str, int], timeout: float, tls: Mapping[str, Any]
) -> dict[str, Any]:
    return {
        "name": name,
        "connect_timeout": f"{timeout}s",
        "type": "STATIC",
        "circuit_breakers": {"thresholds": [_UNLIMITED]},
        "transport_socket": _copy(tls),
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _addr(*at)}}]}],
        },
    }


# Istio lifts Envoy's per-cluster limits (1024 connections) the same way
_UNLIMITED = dict.fromkeys(
    ("max_connections", "max_pending_requests", "max_requests", "max_retries"), 2**32 - 1
)


def _copy(x: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(dict(x)))
    return out


def _neutral_tls(tls: Mapping[str, Any]) -> dict[str, Any]:
    # certificates are made per run: whether there is TLS shapes the work, not which keys
    return {"tls": bool(tls)}
