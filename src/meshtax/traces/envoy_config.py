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

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshtax.model.components import sized
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.traces.config_files import ConfigImportError, load_documents
from meshtax.traces.envoy_chains import (
    _Chain,
    _chains,
    _Ctx,
    _kind,
    _merge_tls,
    _port,
)
from meshtax.traces.envoy_filters import (
    IGNORED,
    FilterClass,
    _items,
    _strip,
    classify_filter,
)

__all__ = [
    "IGNORED",
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
