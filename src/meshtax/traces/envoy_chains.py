"""What one Envoy listener's filter chains do: mode (HTTP connection manager, TCP proxy,
routes, upstream clusters), the modelled filters and TLS, per chain."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshtax.model.presets import STAND_INS
from meshtax.model.sidecar import Mode
from meshtax.traces.config_files import ConfigImportError
from meshtax.traces.envoy_filters import (
    _DOWNSTREAM_TLS,
    _UPSTREAM_TLS,
    FilterClass,
    _items,
    _strip,
    _typed_value,
    classify_filter,
)


@dataclass
class _Ctx:
    source: str
    doc_index: int | None
    clusters: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    routes: dict[str, Mapping[str, Any]] = field(default_factory=dict)

    def err(self, message: str) -> ConfigImportError:
        return ConfigImportError(self.source, message, self.doc_index)


def _port(lst: Mapping[str, Any]) -> int | None:
    addr = lst.get("address")
    sa = addr.get("socket_address") if isinstance(addr, Mapping) else None
    if isinstance(sa, Mapping) and sa.get("port_value") is not None:
        try:
            return int(sa["port_value"])
        except (TypeError, ValueError, OverflowError):  # .inf, .nan, text
            return None
    return None


def _bool(v: Any) -> bool:
    if isinstance(v, Mapping):  # google.protobuf.BoolValue written as {value: true}
        v = v.get("value")
    return v is True or (isinstance(v, str) and v.lower() == "true")


@dataclass(frozen=True)
class _Chain:
    """What one filter chain does, as far as meshtax models it."""

    label: str
    dest_port: int | None
    mode: Mode | None  # None: no proxying filter (blackhole/passthrough without a mode)
    filters: tuple[str, ...]
    unknown: tuple[str, ...]
    ignored: tuple[str, ...]
    tls: str  # "", "tls" (server only) or "mtls"
    notes: tuple[str, ...]
    passthrough: bool
    tls_version: str | None = None  # pinned by the chain's tls_params (see _tls_version)


def _chain_match_port(ch: Mapping[str, Any]) -> int | None:
    m = ch.get("filter_chain_match")
    if isinstance(m, Mapping) and m.get("destination_port") is not None:
        try:
            return int(m["destination_port"])
        except (TypeError, ValueError, OverflowError):  # .inf, .nan, text
            return None
    return None


def _downstream_tls(ch: Mapping[str, Any]) -> str:
    ts = ch.get("transport_socket")
    if not isinstance(ts, Mapping):
        return ""
    tc = ts.get("typed_config")
    t = _strip(str(tc.get("@type", ""))) if isinstance(tc, Mapping) else ""
    if t != _DOWNSTREAM_TLS and ts.get("name") not in ("envoy.transport_sockets.tls", "tls"):
        return ""
    cfg = tc if isinstance(tc, Mapping) else {}
    return "mtls" if _bool(cfg.get("require_client_certificate")) else "tls"


_TLS_PARAM_VERSIONS = {"TLSV1_2": "1.2", "TLSV1_3": "1.3"}


def _tls_version(ch: Mapping[str, Any]) -> str | None:
    """The TLS version a downstream TLS chain's ``tls_params`` pin: a maximum of 1.2 or a
    minimum of 1.3 (Envoy's server defaults, 1.2–1.3, leave it to the peer: None)."""
    ts = ch.get("transport_socket")
    tc = ts.get("typed_config") if isinstance(ts, Mapping) else None
    ctx = tc.get("common_tls_context") if isinstance(tc, Mapping) else None
    params = ctx.get("tls_params") if isinstance(ctx, Mapping) else None
    if not isinstance(params, Mapping):
        return None
    lo = _TLS_PARAM_VERSIONS.get(str(params.get("tls_minimum_protocol_version", "")).upper())
    hi = _TLS_PARAM_VERSIONS.get(str(params.get("tls_maximum_protocol_version", "")).upper())
    if hi == "1.2":
        return "1.2"
    if lo == "1.3":
        return "1.3"
    return None


def _route_grpc_and_clusters(rc: Mapping[str, Any]) -> tuple[bool, set[str]]:
    grpc = False
    clusters: set[str] = set()
    for vh in _items(rc.get("virtual_hosts")):
        if not isinstance(vh, Mapping):
            continue
        for r in _items(vh.get("routes")):
            if not isinstance(r, Mapping):
                continue
            m = r.get("match")
            if isinstance(m, Mapping) and "grpc" in m:
                grpc = True
            ra = r.get("route")
            if isinstance(ra, Mapping) and isinstance(ra.get("cluster"), str):
                clusters.add(ra["cluster"])
    return grpc, clusters


def _cluster_http2(cl: Mapping[str, Any]) -> bool:
    if "http2_protocol_options" in cl:
        return True
    opts = cl.get("typed_extension_protocol_options")
    if isinstance(opts, Mapping):
        for v in opts.values():
            if isinstance(v, Mapping):
                ex = v.get("explicit_http_config")
                if isinstance(ex, Mapping) and "http2_protocol_options" in ex:
                    return True
    return False


def _cluster_client_cert(cl: Mapping[str, Any]) -> bool:
    ts = cl.get("transport_socket")
    if not isinstance(ts, Mapping) or not isinstance(ts.get("typed_config"), Mapping):
        return False
    tc = ts["typed_config"]
    if _strip(str(tc.get("@type", ""))) != _UPSTREAM_TLS:
        return False
    ctc = tc.get("common_tls_context")
    return isinstance(ctc, Mapping) and bool(
        ctc.get("tls_certificates") or ctc.get("tls_certificate_sds_secret_configs")
    )


def _analyse_chain(ch: Mapping[str, Any], label: str, ctx: _Ctx) -> _Chain:
    filters: list[str] = []
    unknown: list[str] = []
    ignored: list[str] = []
    notes: list[str] = []
    mode: Mode | None = None
    passthrough = False
    upstream_mtls = False
    raw = ch.get("filters") or []
    if not isinstance(raw, list):
        raise ctx.err(
            f"{label}.filters: a {type(raw).__name__}; expected a list of network filters"
        )
    for i, f in enumerate(raw):
        if not isinstance(f, Mapping):
            raise ctx.err(
                f"{label}.filters[{i}]: a {type(f).__name__}; expected a filter {{name, typed_config}}"
            )
        c = classify_filter(f)
        if c.kind == "hcm":
            hcm = _typed_value(f)
            mode, sub = _analyse_hcm(hcm, f"{label}.filters[{i}]", ctx, notes)
            for sc in sub:
                if sc.kind == "profiled":
                    filters.append(sc.name)
                elif sc.kind == "ignored":
                    ignored.append(f"{sc.name}: {sc.reason}")
                else:
                    unknown.append(sc.name)
            upstream_mtls = upstream_mtls or _hcm_upstream_mtls(hcm, ctx)
        elif c.kind == "tcp_proxy":
            tp = _typed_value(f)
            mode = mode or Mode.TCP
            cluster = tp.get("cluster")
            passthrough = cluster in (
                "PassthroughCluster",
                "InboundPassthroughCluster",
                "InboundPassthroughClusterIpv4",
                "InboundPassthroughClusterIpv6",
                "BlackHoleCluster",
            )
            cl = ctx.clusters.get(str(cluster))
            upstream_mtls = upstream_mtls or (cl is not None and _cluster_client_cert(cl))
        elif c.kind == "profiled" and c.name in STAND_INS:
            ignored.append(
                f"{c.name}: {f.get('name', c.name)} in a network chain (TCP telemetry, "
                "per connection): not modelled"
            )
        elif c.kind == "profiled":
            filters.append(c.name)
        elif c.kind == "ignored":
            ignored.append(f"{c.name}: {c.reason}")
        else:
            unknown.append(c.name)
    tls = _downstream_tls(ch)
    if not tls and upstream_mtls:
        tls = "mtls"
        notes.append("mTLS from the upstream cluster's client certificate (an outbound proxy)")
    return _Chain(
        label,
        _chain_match_port(ch),
        mode,
        tuple(filters),
        tuple(unknown),
        tuple(ignored),
        tls,
        tuple(notes),
        passthrough,
        _tls_version(ch) if tls == "mtls" else None,
    )


def _hcm_routes(hcm: Mapping[str, Any], ctx: _Ctx) -> Mapping[str, Any] | None:
    rc = hcm.get("route_config")
    if isinstance(rc, Mapping):
        return rc
    rds = hcm.get("rds")
    if isinstance(rds, Mapping):
        return ctx.routes.get(str(rds.get("route_config_name", "")))
    return None


def _hcm_upstream_mtls(hcm: Mapping[str, Any], ctx: _Ctx) -> bool:
    rc = _hcm_routes(hcm, ctx)
    if rc is None:
        return False
    _, clusters = _route_grpc_and_clusters(rc)
    return any(_cluster_client_cert(ctx.clusters[c]) for c in clusters if c in ctx.clusters)


def _analyse_hcm(
    hcm: Mapping[str, Any], label: str, ctx: _Ctx, notes: list[str]
) -> tuple[Mode, list[FilterClass]]:
    hf = hcm.get("http_filters") or []
    if not isinstance(hf, list):
        raise ctx.err(
            f"{label}.typed_config.http_filters: a {type(hf).__name__}; expected a list of HTTP filters"
        )
    sub: list[FilterClass] = []
    for j, f in enumerate(hf):
        if not isinstance(f, Mapping):
            raise ctx.err(
                f"{label}.typed_config.http_filters[{j}]: a {type(f).__name__}; expected a filter "
                f"{{name, typed_config}}"
            )
        sub.append(classify_filter(f))
    al = hcm.get("access_log")
    if isinstance(al, list) and al:
        # access logs run when the stream ends: last in the chain
        sub.append(FilterClass("profiled", "access_log"))
    codec = str(hcm.get("codec_type", "AUTO")).upper()
    rc = _hcm_routes(hcm, ctx)
    grpc_routes, clusters = _route_grpc_and_clusters(rc) if rc is not None else (False, set())
    h2_upstream = any(_cluster_http2(ctx.clusters[c]) for c in clusters if c in ctx.clusters)
    if grpc_routes:
        notes.append("gRPC mode: the routes match gRPC requests (match.grpc)")
        return Mode.GRPC, sub
    if codec == "HTTP2":
        notes.append(
            "gRPC mode: the HTTP connection manager speaks HTTP/2 only (codec_type HTTP2); "
            "meshtax's HTTP/2 mode is gRPC"
        )
        return Mode.GRPC, sub
    if h2_upstream:
        notes.append("gRPC mode: the route's upstream cluster speaks HTTP/2")
        return Mode.GRPC, sub
    if codec == "AUTO":
        notes.append(
            "http mode: codec_type AUTO, no gRPC routes, no HTTP/2 upstream: assumed HTTP/1.1 clients"
        )
    return Mode.HTTP, sub


def _chains(lst: Mapping[str, Any], lname: str, ctx: _Ctx) -> list[_Chain]:
    raw = lst.get("filter_chains") or []
    if not isinstance(raw, list):
        raise ctx.err(f"listener {lname!r}: filter_chains: a {type(raw).__name__}; expected a list")
    out: list[_Chain] = []
    for k, ch in enumerate(raw):
        if not isinstance(ch, Mapping):
            raise ctx.err(
                f"listener {lname!r}: filter_chains[{k}]: a {type(ch).__name__}; expected a filter chain mapping"
            )
        out.append(
            _analyse_chain(
                ch,
                f"listener {lname!r} filter_chains[{k}]"
                + (f" ({ch['name']})" if ch.get("name") else ""),
                ctx,
            )
        )
    dfc = lst.get("default_filter_chain")
    if isinstance(dfc, Mapping):
        out.append(_analyse_chain(dfc, f"listener {lname!r} default_filter_chain", ctx))
    return out


def _kind(chains: Sequence[_Chain]) -> str:
    modes = {c.mode for c in chains if c.mode is not None and not c.passthrough}
    if not modes:
        modes = {c.mode for c in chains if c.mode is not None}
    if not modes:
        return "none"
    return next(iter(modes)).value if len(modes) == 1 else "mixed"


def _merge_tls(chains: Sequence[_Chain], notes: list[str]) -> bool:
    kinds = {c.tls for c in chains}
    if "mtls" in kinds and "" in kinds:
        notes.append(
            "the port accepts both mTLS and plaintext (Istio PERMISSIVE): modelled as mTLS, which "
            "sidecar callers use (auto mTLS)"
        )
        return True
    if "mtls" in kinds:
        return True
    if "tls" in kinds:
        notes.append(
            "TLS without client certificates (require_client_certificate unset): meshtax models "
            "mTLS only; modelled without TLS, so the TLS cost is left out"
        )
    return False
