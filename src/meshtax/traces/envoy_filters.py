"""The filter catalogue of the configuration importers: an Envoy filter entry → the meshtax
filter it is priced as, a filter left out on purpose (with the reason) or one with no profile."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshtax.model.components import sized

__all__ = [
    "HCM_NAMES",
    "HCM_TYPE",
    "IGNORED",
    "PROFILED_NAMES",
    "PROFILED_TYPES",
    "TCP_PROXY_NAMES",
    "TCP_PROXY_TYPE",
    "FilterClass",
    "classify_filter",
]

_T = "type.googleapis.com/"

#: type URL (without the ``type.googleapis.com/`` prefix) → meshtax filter name (profiled).
PROFILED_TYPES: Mapping[str, str] = {
    "envoy.extensions.filters.http.fault.v3.HTTPFault": "fault_injection",
    "envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit": "rate_limit",
    "envoy.extensions.filters.http.tap.v3.Tap": "tap",
    "envoy.extensions.filters.http.lua.v3.Lua": "lua",
    "envoy.extensions.filters.http.lua.v3.LuaPerRoute": "lua",
    "envoy.extensions.filters.http.wasm.v3.Wasm": "wasm",
    "envoy.extensions.filters.http.rbac.v3.RBAC": "rbac_http",
    "envoy.extensions.filters.network.rbac.v3.RBAC": "rbac_network",
    "envoy.extensions.filters.http.ip_tagging.v3.IPTagging": "ip_tagging",
    "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation": "header_mutation",
    # Istio's HTTP telemetry, priced by its Lua stand-ins (model/presets.py); the network
    # stats filter has the same type and is left out by the chain analysis (per connection)
    "io.istio.http.peer_metadata.Config": "istio_metadata_exchange",
    "stats.PluginConfig": "istio_stats",
}
#: Well-known filter names → meshtax filter name, for filters written without a typed_config.
PROFILED_NAMES: Mapping[str, str] = {
    "envoy.filters.http.fault": "fault_injection",
    "envoy.fault": "fault_injection",
    "envoy.filters.http.local_ratelimit": "rate_limit",
    "envoy.filters.http.tap": "tap",
    "envoy.filters.http.lua": "lua",
    "envoy.lua": "lua",
    "envoy.filters.http.wasm": "wasm",
    "envoy.filters.http.rbac": "rbac_http",
    "envoy.filters.network.rbac": "rbac_network",
    "envoy.filters.http.ip_tagging": "ip_tagging",
    "envoy.filters.http.header_mutation": "header_mutation",
    "istio.metadata_exchange": "istio_metadata_exchange",
    "envoy.filters.http.peer_metadata": "istio_metadata_exchange",
    "istio.stats": "istio_stats",
}
#: Istio before 1.18 ran its telemetry as Wasm plugins in the null VM (compiled in): the
#: plugin's code name → its stand-in, so these are not priced as a V8 Wasm filter
NULL_VM_PLUGINS: Mapping[str, str] = {
    "envoy.wasm.metadata_exchange": "istio_metadata_exchange",
    "envoy.wasm.stats": "istio_stats",
}

# Filters left out of the chain on purpose; the reason is reported with every import.
_BASE = "part of meshtax's base mode (the profiled proxy runs it on every request)"
_ISTIO = (
    "Istio telemetry/peer-metadata filter of a TCP chain or an unknown version: no profile; "
    "not modelled"
)
_CONN = "listener filter: runs once per connection, not per request; not modelled"
#: type URL or filter name → reason it is ignored.
IGNORED: Mapping[str, str] = {
    "envoy.extensions.filters.http.router.v3.Router": _BASE,
    "envoy.filters.http.router": _BASE,
    "envoy.router": _BASE,
    "envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec": _BASE,
    "envoy.filters.http.upstream_codec": _BASE,
    "envoy.extensions.filters.http.grpc_stats.v3.FilterConfig": "gRPC stats counters (Istio adds it "
    "to every HTTP chain): no profile; per-request cost not modelled",
    "envoy.filters.http.grpc_stats": "gRPC stats counters (Istio adds it to every HTTP chain): no "
    "profile; per-request cost not modelled",
    "envoy.extensions.filters.http.cors.v3.Cors": "CORS with no policy on the route does nothing "
    "per request (Istio adds it to every HTTP chain)",
    "envoy.filters.http.cors": "CORS with no policy on the route does nothing per request (Istio "
    "adds it to every HTTP chain)",
    "istio.metadata_exchange": _ISTIO,
    "istio.stats": _ISTIO,
    "istio.alpn": "sets ALPN on upstream connections: per connection, not modelled",
    "istio_authn": _ISTIO,
    "envoy.filters.http.peer_metadata": _ISTIO,
    "envoy.filters.network.metadata_exchange": _ISTIO,
    "envoy.filters.network.peer_metadata": _ISTIO,
    "envoy.filters.network.upstream.metadata_exchange": _ISTIO,
    "stats.PluginConfig": _ISTIO,
    "io.istio.http.peer_metadata.Config": _ISTIO,
    "envoy.tcp.metadataexchange.config.MetadataExchange": _ISTIO,
    "istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig": "sets ALPN on upstream "
    "connections: per connection, not modelled",
    "envoy.filters.listener.tls_inspector": _CONN,
    "envoy.filters.listener.original_dst": _CONN,
    "envoy.filters.listener.http_inspector": _CONN,
    "envoy.filters.listener.proxy_protocol": _CONN,
    "envoy.filters.listener.original_src": _CONN,
}

#: The filter that makes a chain HTTP (or gRPC); its sub-filters are the chain.
HCM_TYPE = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
HCM_NAMES = ("envoy.filters.network.http_connection_manager", "envoy.http_connection_manager")
TCP_PROXY_TYPE = "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"
TCP_PROXY_NAMES = ("envoy.filters.network.tcp_proxy", "envoy.tcp_proxy")
_TYPED_STRUCTS = ("udpa.type.v1.TypedStruct", "xds.type.v3.TypedStruct")
_DOWNSTREAM_TLS = "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
_UPSTREAM_TLS = "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
_SIZED = ("rbac_http", "rbac_network", "ip_tagging")


def _items(v: Any) -> list[Any]:
    """``v`` if it is a list, else no items (for fields that only refine the result)."""
    return v if isinstance(v, list) else []


def _strip(type_url: str) -> str:
    return type_url.split("/", 1)[1] if "/" in type_url else type_url


@dataclass(frozen=True)
class FilterClass:
    """How one configured filter is treated.

    ``kind``: ``profiled`` (``name`` is the meshtax filter), ``ignored`` (``reason`` says why),
    ``unknown`` (no profile), ``hcm`` or ``tcp_proxy`` (decide the mode).
    """

    kind: str
    name: str
    reason: str = ""


def _type_of(f: Mapping[str, Any]) -> str:
    """The effective type URL of a filter (unwrapping TypedStruct and ECDS config_discovery)."""
    tc = f.get("typed_config")
    if isinstance(tc, Mapping):
        t = _strip(str(tc.get("@type", "")))
        if t in _TYPED_STRUCTS:
            return _strip(str(tc.get("type_url", "")))
        return t
    cd = f.get("config_discovery")
    if isinstance(cd, Mapping):
        urls = _items(cd.get("type_urls"))
        if isinstance(urls, list) and urls:
            return _strip(str(urls[0]))
    return ""


def _typed_value(f: Mapping[str, Any]) -> Mapping[str, Any]:
    tc = f.get("typed_config")
    if not isinstance(tc, Mapping):
        return {}
    if _strip(str(tc.get("@type", ""))) in _TYPED_STRUCTS:
        v = tc.get("value")
        return v if isinstance(v, Mapping) else {}
    return tc


def _size_of(base: str, cfg: Mapping[str, Any]) -> int:
    if base in ("rbac_http", "rbac_network"):
        # one rule = one policy (as the RBAC profiles count them); shadow rules run too
        n = 0
        for key in ("rules", "shadow_rules"):
            rules = cfg.get(key)
            if isinstance(rules, Mapping) and isinstance(rules.get("policies"), Mapping):
                n += len(rules["policies"])
        return n
    tags = cfg.get("ip_tags")
    return len(tags) if isinstance(tags, list) else 0


def _wasm_code(cfg: Mapping[str, Any]) -> str:
    """The inline code name of a Wasm filter (``envoy.wasm.stats`` for a null-VM plugin)."""
    cur: Any = cfg
    for key in ("config", "vm_config", "code", "local", "inline_string"):
        cur = cur.get(key) if isinstance(cur, Mapping) else None
    return cur if isinstance(cur, str) else ""


def _fault_configured(cfg: Mapping[str, Any]) -> bool:
    return any(k in cfg for k in ("abort", "delay", "response_rate_limit"))


def classify_filter(f: Mapping[str, Any]) -> FilterClass:
    """Classify one Envoy filter entry (``{name, typed_config}``) against the meshtax catalogue."""
    name = str(f.get("name", ""))
    t = _type_of(f)
    if t == HCM_TYPE or (not t and name in HCM_NAMES):
        return FilterClass("hcm", name)
    if t == TCP_PROXY_TYPE or (not t and name in TCP_PROXY_NAMES):
        return FilterClass("tcp_proxy", name)
    base = PROFILED_TYPES.get(t) if t else PROFILED_NAMES.get(name)
    if base == "fault_injection" and "typed_config" in f and not _fault_configured(_typed_value(f)):
        # Istio inserts an empty fault filter in every HTTP chain; profiled fault injection has a (never firing) fault
        return FilterClass(
            "ignored",
            name or t,
            "fault filter with no abort/delay configured (Istio adds one to every HTTP chain): no "
            "fault to evaluate; not modelled",
        )
    if base == "wasm":
        base = NULL_VM_PLUGINS.get(_wasm_code(_typed_value(f)), base)
    if base is not None:
        if base in _SIZED:
            return FilterClass("profiled", sized(base, _size_of(base, _typed_value(f))))
        return FilterClass("profiled", base)
    for key in (t, name):
        if key and key in IGNORED:
            return FilterClass("ignored", name or key, IGNORED[key])
    label = name or t or "(unnamed filter)"
    if t and name and not name.startswith("envoy."):
        label = f"{name} ({t})"  # a custom name says little; the type says what it is
    return FilterClass("unknown", label)
