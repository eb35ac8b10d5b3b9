"""Read an Envoy configuration as users have it and map it to the :class:`SidecarConfig` meshtax models.

Accepted inputs (YAML or JSON): a bootstrap (``static_resources.listeners``), one listener, a
list of listeners (``istioctl proxy-config listener -o json``), an LDS response / file
(``resources: [...]``), and an admin ``/config_dump`` (``configs: [...]``, as Istio's
``istioctl proxy-config all -o json`` or ``curl localhost:15000/config_dump`` give it).

Filters are recognised by their ``typed_config`` type URL (names are free-form in Envoy v3),
falling back to the filter name. Each filter is either mapped to a profiled meshtax filter,
ignored on purpose (see :data:`IGNORED`, each with its reason) or reported as having no profile.
Nothing raises anything but :class:`ConfigImportError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshtax import safeio
from meshtax.errors import InputError, TraceError
from meshtax.model.components import sized
from meshtax.model.sidecar import Mode, SidecarConfig

__all__ = [
    "ConfigImportError",
    "EnvoyImport",
    "FilterClass",
    "ListenerInfo",
    "classify_filter",
    "envoy_from_dict",
    "load_documents",
    "sidecar_from_envoy",
    "sized",
]


class ConfigImportError(TraceError):
    """A configuration file that cannot be imported: names the file, the document and what was expected."""

    def __init__(self, source: str, message: str, doc_index: int | None = None) -> None:
        self.source = source
        self.doc_index = doc_index
        self.detail = message
        where = source if doc_index is None else f"{source} (document {doc_index + 1})"
        super().__init__(f"{where}: {message}", file=source)


# ---------------------------------------------------------------------------------------------
# Filter catalogue: Envoy extension → meshtax filter name
# ---------------------------------------------------------------------------------------------

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
}

# Filters left out of the chain on purpose; the reason is reported with every import.
_BASE = "part of meshtax's base mode (the profiled proxy runs it on every request)"
_ISTIO = (
    "Istio default telemetry/peer-metadata filter: no profile; its per-request cost is not modelled "
    "(predictions for Istio sidecars underestimate by it)"
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


# ---------------------------------------------------------------------------------------------
# Reading files
# ---------------------------------------------------------------------------------------------


def load_documents(path: str | Path) -> list[Any]:
    """Parse a YAML (possibly multi-document) or JSON file with :mod:`meshtax.safeio`
    (regular files only, size limit, alias budget); messages never quote the file."""
    p = Path(path)
    src = str(p)
    try:
        text = safeio.read_text(p, "a configuration file (YAML or JSON)")
        if not text.strip():
            raise ConfigImportError(src, "the file is empty")
        if p.suffix.lower() == ".json":
            return [safeio.parse_json(text, src)]
        return safeio.parse_yaml_all(text, src)
    except InputError as e:
        m = re.match(rf"{re.escape(src)}(?: \(document (\d+)\))?: (.*)", str(e), re.S)
        if m is None:
            raise ConfigImportError(src, str(e)) from None
        doc = int(m.group(1)) - 1 if m.group(1) else None
        raise ConfigImportError(src, m.group(2), doc) from None


# ---------------------------------------------------------------------------------------------
# Envoy config → SidecarConfig
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ListenerInfo:
    """One listener found in the file: name, port, what its chains do, and whether it was chosen."""

    name: str
    port: int | None
    kind: str  # "http", "grpc", "tcp", "mixed" or "none"
    chosen: bool = False
    direction: str = ""


@dataclass(frozen=True)
class EnvoyImport:
    """The modelled sidecar configuration of one Envoy config and what the import decided."""

    config: SidecarConfig
    listeners: tuple[ListenerInfo, ...]
    unknown_filters: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()  # "name: reason"
    notes: tuple[str, ...] = ()
    source: str = ""

    def report(self) -> str:
        """Human-readable summary (what the CLI prints)."""
        lines = [f"{self.source}: {self.config.describe()}"]
        lines += [
            f"  filters: {', '.join(self.config.filters) or '(none)'}",
            f"  mTLS: {'yes' if self.config.mtls else 'no'}",
        ]
        for li in self.listeners:
            mark = "*" if li.chosen else " "
            lines.append(
                f"  {mark} listener {li.name or '(unnamed)'} port {li.port if li.port is not None else '-'}: {li.kind}"
            )
        lines += [
            f"  no profile for filter {u}: not in the modelled chain; the prediction leaves out its cost"
            for u in self.unknown_filters
        ]
        lines += [f"  ignored {i}" for i in self.ignored]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass
class _Ctx:
    source: str
    doc_index: int | None
    clusters: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    routes: dict[str, Mapping[str, Any]] = field(default_factory=dict)

    def err(self, message: str) -> ConfigImportError:
        return ConfigImportError(self.source, message, self.doc_index)


_EXPECTED = (
    "expected an Envoy bootstrap (static_resources.listeners), a listener ({name, address, filter_chains}), "
    "a list of listeners, an LDS response (resources: [...]) or an admin config_dump (configs: [...])"
)


def _is_listener(d: Any) -> bool:
    return (
        isinstance(d, Mapping)
        and ("filter_chains" in d or "default_filter_chain" in d)
        and ("address" in d or "name" in d)
    )


def _unwrap_resource(r: Any) -> Any:
    # LDS resources may be wrapped in envoy.service.discovery.v3.Resource {name, resource: {...}}
    if isinstance(r, Mapping) and isinstance(r.get("resource"), Mapping):
        return r["resource"]
    return r


def _collect(doc: Any, ctx: _Ctx) -> list[Mapping[str, Any]]:
    """Listeners of any accepted layout; fills ``ctx.clusters``/``ctx.routes`` on the way."""
    if isinstance(doc, list):
        if doc and all(_is_listener(x) for x in doc):
            return list(doc)
        raise ctx.err(f"a list whose items are not all listeners; {_EXPECTED}")
    if not isinstance(doc, Mapping):
        raise ctx.err(f"a {type(doc).__name__}; {_EXPECTED}")
    if _is_listener(doc):
        return [doc]
    if "configs" in doc:
        configs = doc["configs"]
        if not isinstance(configs, list):
            raise ctx.err(
                f"configs: a {type(configs).__name__}; expected a list (an admin config_dump)"
            )
        out: list[Mapping[str, Any]] = []
        for c in configs:
            if not isinstance(c, Mapping):
                continue
            t = _strip(str(c.get("@type", "")))
            if t.endswith("BootstrapConfigDump") and isinstance(c.get("bootstrap"), Mapping):
                out += _collect_bootstrap(c["bootstrap"], ctx, required=False)
            elif t.endswith("ListenersConfigDump"):
                for s in _items(c.get("static_listeners")):
                    if isinstance(s, Mapping) and isinstance(s.get("listener"), Mapping):
                        out.append(s["listener"])
                for d in _items(c.get("dynamic_listeners")) or _items(
                    c.get("dynamic_active_listeners")
                ):
                    st = d.get("active_state") if isinstance(d, Mapping) else None
                    if isinstance(st, Mapping) and isinstance(st.get("listener"), Mapping):
                        out.append(st["listener"])
                    elif isinstance(d, Mapping) and isinstance(d.get("listener"), Mapping):
                        out.append(d["listener"])
            elif t.endswith("ClustersConfigDump"):
                for key in ("static_clusters", "dynamic_active_clusters"):
                    for s in _items(c.get(key)):
                        cl = s.get("cluster") if isinstance(s, Mapping) else None
                        if isinstance(cl, Mapping):
                            ctx.clusters[str(cl.get("name", ""))] = cl
            elif t.endswith("RoutesConfigDump"):
                for key in ("static_route_configs", "dynamic_route_configs"):
                    for s in _items(c.get(key)):
                        rc = s.get("route_config") if isinstance(s, Mapping) else None
                        if isinstance(rc, Mapping):
                            ctx.routes[str(rc.get("name", ""))] = rc
        if not out:
            raise ctx.err(
                "an admin config_dump without listeners; dump with listeners included (no "
                "?resource= filter that drops them)"
            )
        return out
    if "static_resources" in doc or "dynamic_resources" in doc:
        return _collect_bootstrap(doc, ctx, required=True)
    if "resources" in doc:
        res = doc["resources"]
        if not isinstance(res, list):
            raise ctx.err(
                f"resources: a {type(res).__name__}; expected a list of listeners (an LDS response)"
            )
        items = [_unwrap_resource(r) for r in res]
        ls = [x for x in items if _is_listener(x)]
        if not ls:
            raise ctx.err(
                "resources: no listener in it (an RDS/CDS file?); expected listeners with filter_chains"
            )
        return ls
    if "listeners" in doc and isinstance(doc["listeners"], list):
        return _collect_bootstrap({"static_resources": doc}, ctx, required=True)
    # the keys are not quoted: the file may be any file (meshtax often runs as root)
    raise ctx.err(f"not an Envoy configuration ({len(doc)} top-level key(s)); {_EXPECTED}")


def _collect_bootstrap(b: Mapping[str, Any], ctx: _Ctx, required: bool) -> list[Mapping[str, Any]]:
    sr = b.get("static_resources", {})
    if not isinstance(sr, Mapping):
        raise ctx.err(
            f"static_resources: a {type(sr).__name__}; expected a mapping with listeners and clusters"
        )
    for cl in _items(sr.get("clusters")):
        if isinstance(cl, Mapping):
            ctx.clusters[str(cl.get("name", ""))] = cl
    ls = sr.get("listeners")
    if ls is None:
        if required:
            dyn = "dynamic_resources" in b
            raise ctx.err(
                "static_resources.listeners: missing"
                + (
                    "; the listeners come from LDS (dynamic_resources) — import a config_dump of "
                    "the running proxy instead"
                    if dyn
                    else ""
                )
            )
        return []
    if not isinstance(ls, list):
        raise ctx.err(
            f"static_resources.listeners: a {type(ls).__name__}; expected a list of listeners"
        )
    for i, lst in enumerate(ls):
        if not isinstance(lst, Mapping):
            raise ctx.err(
                f"static_resources.listeners[{i}]: a {type(lst).__name__}; expected a listener mapping"
            )
    return list(ls)


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


def _choose_listener(listeners: Sequence[Mapping[str, Any]], want: str | None) -> tuple[int, str]:
    names = [str(lst.get("name", "")) for lst in listeners]
    if want is not None:
        if want in names:
            return names.index(want), f"listener {want!r} as asked"
        raise KeyError(want)
    if len(listeners) == 1:
        return 0, ""
    for i, lst in enumerate(listeners):
        if names[i] == "virtualInbound" or _port(lst) == 15006:
            return (
                i,
                f"chose the inbound listener {names[i]!r} (Istio's virtualInbound, port 15006) of "
                f"{len(listeners)} listeners: it carries the traffic a service receives",
            )
    for i, lst in enumerate(listeners):
        if str(lst.get("traffic_direction", "")).upper() == "INBOUND":
            return (
                i,
                f"chose {names[i]!r}, the listener with traffic_direction INBOUND, of {len(listeners)} listeners",
            )
    for i, lst in enumerate(listeners):
        if lst.get("filter_chains"):
            return (
                i,
                f"chose the first listener with filter chains, {names[i]!r}, of {len(listeners)} "
                "(no inbound listener); pass a listener name to choose another",
            )
    return 0, f"chose the first of {len(listeners)} listeners"


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


def envoy_from_dict(
    doc: Any,
    source: str = "<envoy>",
    doc_index: int | None = None,
    listener: str | None = None,
    port: int | None = None,
) -> EnvoyImport:
    """Map one parsed Envoy document to the modelled sidecar configuration.

    ``listener`` picks a listener by name; ``port`` picks the filter chain matching that
    destination port (Istio's per-port inbound chains).
    """
    ctx = _Ctx(source, doc_index)
    listeners = _collect(doc, ctx)
    if not listeners:
        raise ctx.err(
            "no listeners (an empty list); expected at least one listener with filter chains"
        )
    notes: list[str] = []
    try:
        li, why = _choose_listener(listeners, listener)
    except KeyError:
        raise ctx.err(
            f"no listener named {listener!r} among its {len(listeners)} listener(s); "
            "`meshtax config from-envoy FILE` lists them"
        ) from None
    if why:
        notes.append(why)
    infos: list[ListenerInfo] = []
    chosen_chains: list[_Chain] = []
    for i, lst in enumerate(listeners):
        lname = str(lst.get("name", f"#{i}"))
        chains = _chains(lst, lname, ctx)
        infos.append(
            ListenerInfo(
                lname, _port(lst), _kind(chains), i == li, str(lst.get("traffic_direction", ""))
            )
        )
        if i == li:
            chosen_chains = chains
            for lf in _items(lst.get("listener_filters")):
                if isinstance(lf, Mapping):
                    lc = classify_filter(lf)
                    if lc.kind == "ignored":
                        notes.append(f"{lc.name}: {lc.reason}")
                    elif lc.kind == "unknown":
                        notes.append(
                            f"listener filter {lc.name}: runs once per connection; not modelled"
                        )
    cname = infos[li].name
    useful = [c for c in chosen_chains if c.mode is not None and not c.passthrough]
    if not useful:
        useful = [c for c in chosen_chains if c.mode is not None]
    if not useful:
        raise ctx.err(
            f"listener {cname!r} has no HTTP connection manager or TCP proxy in its filter chains; "
            "nothing to model (expected a proxying listener)"
        )
    ports = sorted({c.dest_port for c in useful if c.dest_port is not None})
    if port is not None:
        sel = [c for c in useful if c.dest_port == port]
        if not sel:
            raise ctx.err(
                f"listener {cname!r} has no filter chain for destination port {port}; its ports: "
                f"{', '.join(map(str, ports)) or 'none'}"
            )
        notes.append(f"filter chains of destination port {port}")
    elif len(ports) > 1:
        sel = [c for c in useful if c.dest_port == ports[0]]
        others = [c for c in useful if c.dest_port is not None and c.dest_port != ports[0]]
        differ = {(c.mode, c.filters) for c in others} - {(c.mode, c.filters) for c in sel}
        notes.append(
            f"listener {cname!r} serves ports {', '.join(map(str, ports))}: modelled port {ports[0]} (the lowest)"
            + (
                "; the other ports have other chains — pass a port to model one of them"
                if differ
                else "; the other ports have the same chain"
            )
        )
    elif ports:
        sel = [c for c in useful if c.dest_port == ports[0]]
    else:
        sel = useful
    # several chains for one port differ by transport (mTLS vs plaintext); take the proxying content of the first
    main = sel[0]
    if len({(c.mode, c.filters) for c in sel}) > 1:
        notes.append(f"{len(sel)} filter chains differ in mode or filters: modelled {main.label}")
    mtls = _merge_tls(sel, notes)
    for c in sel:
        notes += [n for n in c.notes if n not in notes]
    unknown = tuple(dict.fromkeys(u for c in sel for u in c.unknown))
    ignored = tuple(dict.fromkeys(x for c in sel for x in c.ignored))
    assert main.mode is not None
    if main.mode is Mode.TCP:
        notes = [n for n in notes if not n.startswith(("gRPC mode", "http mode"))]
    versions = {c.tls_version for c in sel if c.tls == "mtls"}
    version = next(iter(versions)) if mtls and len(versions) == 1 else None
    if mtls and version is None:
        notes.append(
            "TLS version not pinned by the listener (tls_params): negotiated with the peer (1.3 between Istio "
            "sidecars); priced with the profile's first measured version"
        )
    cfg = SidecarConfig(mode=main.mode, filters=main.filters, mtls=mtls, tls_version=version)
    return EnvoyImport(cfg, tuple(infos), unknown, ignored, tuple(notes), source)


def _iter_docs(docs: Sequence[Any]) -> Iterator[tuple[int | None, Any]]:
    real = [(i, d) for i, d in enumerate(docs) if d is not None]
    multi = len(docs) > 1
    for i, d in real:
        yield (i if multi else None), d


def sidecar_from_envoy(
    path: str | Path, listener: str | None = None, port: int | None = None
) -> EnvoyImport:
    """The sidecar configuration meshtax models for an Envoy config file (YAML or JSON).

    A multi-document YAML file must hold exactly one Envoy configuration.
    """
    src = str(path)
    docs = list(_iter_docs(load_documents(path)))
    if not docs:
        raise ConfigImportError(src, f"no document in the file; {_EXPECTED}")
    if len(docs) > 1:
        raise ConfigImportError(
            src, f"{len(docs)} YAML documents; expected one Envoy configuration per file"
        )
    idx, doc = docs[0]
    return envoy_from_dict(doc, src, idx, listener, port)
