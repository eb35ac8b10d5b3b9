"""Envoy bootstrap configs of a sidecar (pure: no process, no files).

Layout follows Istio: an inbound listener (default 0.0.0.0:15006) and an outbound listener
(default 0.0.0.0:15001), both with the ``original_dst`` listener filter, so that after an
iptables ``REDIRECT`` the connection's real destination (``SO_ORIGINAL_DST``) is recovered and
an ``ORIGINAL_DST`` cluster forwards to it.

Inbound uses the ``ORIGINAL_DST`` cluster too: after ``REDIRECT`` of ``podIP:appPort`` to
15006, the recovered destination *is* the local app (``podIP:appPort``), so no per-app static
cluster is needed, and the same config serves any app port. Envoy's own upstream connection is
not re-intercepted because the testbed exempts the proxy's UID in the nat OUTPUT chain (as
Istio does with UID 1337). A static upstream (``inbound_upstream``/``outbound_upstream``) is
available for setups without iptables, e.g. loopback tests in the root namespace.

Unix-socket IPC (``--ipc uds``): ``inbound_upstream`` may be a socket path (the app's), which
becomes a ``pipe`` endpoint of a STATIC cluster (an ORIGINAL_DST cluster cannot target a
pipe), and ``outbound_pipe`` puts the outbound listener on a socket (mode 0666: the app may
run as another uid than the proxy) without the ``original_dst`` listener filter (a Unix
socket has no original destination). Checked with Envoy 1.40 (experiments/uds_envoy.py).

The running process is :mod:`meshtax.testbed.envoy.process`; several sidecars in one process
(one listener each) are :mod:`meshtax.testbed.envoy.variants`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from meshtax.model.sidecar import Mode

__all__ = ["CONNECT_TIMEOUT_S", "EnvoyConfig", "bootstrap", "config_hash"]

ROUTER = "envoy.filters.http.router"
HCM_TYPE = (
    "type.googleapis.com/"
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
ORIG_DST_CLUSTER = "original_dst"
#: Envoy's connect timeout per cluster, Istio's default; it covers a TLS cluster's handshake
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class EnvoyConfig:
    """Options of one sidecar's bootstrap.

    ``inbound_upstream``/``outbound_upstream``: ``None`` forwards to the original destination
    (needs iptables REDIRECT in front); ``(host, port)`` forwards to a static endpoint; a
    ``str`` (inbound only) is the app's Unix socket. ``outbound_pipe``: the outbound listener
    on this Unix socket path instead of ``listen_address:outbound_port``.
    ``http_filters`` are inserted, in order, before the router (http and grpc modes only).
    ``network_filters`` are inserted, in order, before ``tcp_proxy``/the HTTP connection
    manager on both listeners (e.g. network RBAC). ``hcm_patch``: top-level keys merged into
    the HTTP connection manager config (lists such as ``access_log`` are appended to).
    ``inbound_tls``: a ``transport_socket`` for the inbound listener (downstream TLS, the
    server side of sidecar-to-sidecar mTLS); ``outbound_tls``: a ``transport_socket`` for the
    outbound cluster (upstream TLS, the client side). See :mod:`meshtax.testbed.certs`.
    ``circuit_breaker_max``: connection/request thresholds of both clusters; ``None`` keeps
    Envoy's defaults (1024 connections per cluster); Istio sets them to 2**32 - 1.
    ``connect_timeout_s``: each cluster's connect timeout, which in Envoy runs until the
    upstream's transport socket is connected — for a TLS cluster, until the handshake is done.
    Istio's 10 s (:data:`CONNECT_TIMEOUT_S`): with 1 s, a client opening 400 connections at once
    on a CPU-starved machine (25 % of a CPU) lost all but ~50 to the timeout: the handshakes
    queue on one worker (issue #18).
    """

    mode: Mode = Mode.HTTP
    inbound_port: int = 15006
    outbound_port: int = 15001
    listen_address: str = "0.0.0.0"
    admin_address: str = "127.0.0.1"
    admin_port: int = 15000
    concurrency: int = 1
    access_log_path: str | None = None
    http_filters: tuple[Mapping[str, Any], ...] = ()
    network_filters: tuple[Mapping[str, Any], ...] = ()
    hcm_patch: Mapping[str, Any] = field(default_factory=dict)
    inbound_tls: Mapping[str, Any] | None = None
    outbound_tls: Mapping[str, Any] | None = None
    circuit_breaker_max: int | None = None
    inbound_upstream: tuple[str, int] | str | None = None
    outbound_upstream: tuple[str, int] | None = None
    outbound_pipe: str | None = None
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    log_level: str = "info"
    extra_args: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))
        if self.http_filters and self.mode is Mode.TCP:
            raise ValueError("http_filters need mode http or grpc, not tcp")
        if self.hcm_patch and self.mode is Mode.TCP:
            raise ValueError("hcm_patch needs mode http or grpc, not tcp")
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if isinstance(self.inbound_upstream, str) and not self.inbound_upstream:
            raise ValueError("inbound_upstream: an empty Unix socket path")
        if self.outbound_pipe is not None and not self.outbound_pipe:
            raise ValueError("outbound_pipe: an empty Unix socket path")

    def key(self) -> str:
        """Hash of what shapes the proxy's work, independent of ports and addresses.

        Two sidecars that differ only in where they listen or which static endpoint they use
        share a key, so a profile measured on loopback keys the same as one in a pod; which
        socket paths a Unix-socket sidecar uses does not count, that it uses them does.
        """
        neutral = replace(
            self,
            inbound_port=15006,
            outbound_port=15001,
            listen_address="0.0.0.0",
            admin_address="127.0.0.1",
            admin_port=15000,
            inbound_upstream=_NEUTRAL_PIPE if isinstance(self.inbound_upstream, str) else None,
            outbound_upstream=None,
            outbound_pipe=None if self.outbound_pipe is None else _NEUTRAL_PIPE,
            log_level="info",
            # a failure timer: how long it is does not shape the work (and profiles stored
            # while it was 1 s keep their keys)
            connect_timeout_s=1.0,
            # certificates are regenerated per run; which ones does not shape the work
            inbound_tls=_redact_inline(self.inbound_tls),
            outbound_tls=_redact_inline(self.outbound_tls),
        )
        # worker count and extra flags live on the command line, not in the bootstrap
        return config_hash(
            {
                "bootstrap": bootstrap(neutral),
                "concurrency": self.concurrency,
                "args": list(self.extra_args),
            }
        )


_NEUTRAL_PIPE = "/uds"  # the socket path a key is computed with


def _redact_inline(tls: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``tls`` with every inline PEM (``inline_string``/``inline_bytes``) replaced by a marker."""

    def walk(x: Any) -> Any:
        if isinstance(x, Mapping):
            return {
                k: "<inline>" if k in ("inline_string", "inline_bytes") else walk(v)
                for k, v in x.items()
            }
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    return None if tls is None else walk(tls)


def config_hash(cfg: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of a bootstrap."""
    canon = json.dumps(cfg, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def _addr(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _endpoint_address(upstream: tuple[str, int] | str) -> dict[str, Any]:
    return {"pipe": {"path": upstream}} if isinstance(upstream, str) else _addr(*upstream)


def _cluster(
    name: str,
    mode: Mode,
    upstream: tuple[str, int] | str | None,
    timeout: float,
    tls: Mapping[str, Any] | None = None,
    breaker_max: int | None = None,
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "connect_timeout": f"{timeout}s"}
    if breaker_max is not None:
        limits = ("max_connections", "max_pending_requests", "max_requests", "max_retries")
        c["circuit_breakers"] = {"thresholds": [dict.fromkeys(limits, breaker_max)]}
    if tls is not None:
        c["transport_socket"] = json.loads(json.dumps(tls))  # a deep, JSON-clean copy
    if upstream is None:
        c.update(type="ORIGINAL_DST", lb_policy="CLUSTER_PROVIDED")
    else:
        c.update(
            type="STATIC",
            load_assignment={
                "cluster_name": name,
                "endpoints": [
                    {"lb_endpoints": [{"endpoint": {"address": _endpoint_address(upstream)}}]}
                ],
            },
        )
    if mode is Mode.GRPC:
        # gRPC needs HTTP/2 to the app as well, not only from the client
        c["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return c


def _access_log(path: str | None) -> list[dict[str, Any]]:
    if path is None:
        return []
    return [
        {
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": path,
            },
        }
    ]


def _network_filter(cfg: EnvoyConfig, direction: str, cluster: str) -> dict[str, Any]:
    if cfg.mode is Mode.TCP:
        tcp: dict[str, Any] = {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": direction,
            "cluster": cluster,
        }
        if cfg.access_log_path:
            tcp["access_log"] = _access_log(cfg.access_log_path)
        return {"name": "envoy.filters.network.tcp_proxy", "typed_config": tcp}
    router = {
        "name": ROUTER,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
        },
    }
    hcm: dict[str, Any] = {
        "@type": HCM_TYPE,
        "stat_prefix": direction,
        "codec_type": "HTTP2" if cfg.mode is Mode.GRPC else "HTTP1",
        "route_config": {
            "name": direction,
            "virtual_hosts": [
                {
                    "name": direction,
                    "domains": ["*"],
                    # timeout 0: no route timeout, so long gRPC streams are not cut
                    "routes": [
                        {"match": {"prefix": "/"}, "route": {"cluster": cluster, "timeout": "0s"}}
                    ],
                }
            ],
        },
        "http_filters": [dict(f) for f in cfg.http_filters] + [router],
    }
    if cfg.mode is Mode.GRPC:
        hcm["http2_protocol_options"] = {}
    if cfg.access_log_path:
        hcm["access_log"] = _access_log(cfg.access_log_path)
    for k, v in json.loads(json.dumps(dict(cfg.hcm_patch))).items():
        if isinstance(v, list) and isinstance(hcm.get(k), list):
            hcm[k] = hcm[k] + v
        else:
            hcm[k] = v
    return {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}


def _listener(cfg: EnvoyConfig, direction: str, port: int, cluster: str) -> dict[str, Any]:
    chain: dict[str, Any] = {
        "filters": [dict(f) for f in cfg.network_filters]
        + [_network_filter(cfg, direction, cluster)]
    }
    if direction == "inbound" and cfg.inbound_tls is not None:
        chain["transport_socket"] = json.loads(json.dumps(cfg.inbound_tls))
    if direction == "outbound" and cfg.outbound_pipe is not None:
        # a Unix socket has no original destination: the cluster decides where it goes
        return {
            "name": direction,
            "address": {"pipe": {"path": cfg.outbound_pipe, "mode": 0o666}},
            "filter_chains": [chain],
        }
    return {
        "name": direction,
        "address": _addr(cfg.listen_address, port),
        # recovers SO_ORIGINAL_DST after iptables REDIRECT; a no-op without it
        "listener_filters": [
            {
                "name": "envoy.filters.listener.original_dst",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"
                },
            }
        ],
        "filter_chains": [chain],
    }


def bootstrap(cfg: EnvoyConfig) -> dict[str, Any]:
    """The Envoy v3 bootstrap (a plain dict, JSON/YAML-serialisable) for ``cfg``."""
    clusters: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for direction, upstream in (
        ("inbound", cfg.inbound_upstream),
        ("outbound", cfg.outbound_upstream),
    ):
        name = f"{direction}_{ORIG_DST_CLUSTER}" if upstream is None else f"{direction}_static"
        names[direction] = name
        tls = cfg.outbound_tls if direction == "outbound" else None
        clusters.append(
            _cluster(name, cfg.mode, upstream, cfg.connect_timeout_s, tls, cfg.circuit_breaker_max)
        )
    return {
        "node": {"id": "meshtax-sidecar", "cluster": "meshtax"},
        "admin": {"address": _addr(cfg.admin_address, cfg.admin_port)},
        "static_resources": {
            "listeners": [
                _listener(cfg, "inbound", cfg.inbound_port, names["inbound"]),
                _listener(cfg, "outbound", cfg.outbound_port, names["outbound"]),
            ],
            "clusters": clusters,
        },
    }
