"""Read Kubernetes/Istio manifests and map each Service to the sidecar configuration meshtax models.

Reads every ``*.yaml``, ``*.yml`` and ``*.json`` under a directory (multi-document YAML and
``kind: List`` included) and follows Istio's own rules:

* **sidecar** — injection: a pod label/annotation ``sidecar.istio.io/inject: "false"`` opts
  out; a namespace labelled ``istio-injection=disabled`` never injects; a namespace labelled
  ``istio-injection=enabled`` (or ``istio.io/rev``) injects; otherwise only pods labelled
  ``sidecar.istio.io/inject: "true"`` (or ``istio.io/rev``) get one.
* **mode** — Istio's protocol selection on the Service port: ``appProtocol`` first, then the
  port name ``<protocol>[-<suffix>]``; http → http; http2/grpc/grpc-web/h2c → grpc; tcp, tls,
  https, mongo, mysql, redis → tcp. Unnamed ports are sniffed by Istio; meshtax has to assume.
* **mTLS** — PeerAuthentication, workload (selector, port-level) over namespace over mesh
  (root namespace); STRICT and PERMISSIVE → mTLS (sidecar callers use auto mTLS), DISABLE → none.
* **filters** — EnvoyFilter patches (HTTP_FILTER / NETWORK_FILTER inserts and removes) that
  select the workload, classified like an Envoy config (:mod:`meshtax.traces.envoy_config`).

Every guess is listed in ``assumptions``; nothing raises anything but :class:`ConfigImportError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from meshtax.model.sidecar import NO_SIDECAR, Mode, SidecarConfig
from meshtax.traces.envoy_config import (
    ConfigImportError,
    _items,
    classify_filter,
    load_documents,
    sidecar_from_envoy,
)

__all__ = [
    "ConfigImportError",
    "K8sImport",
    "resolve_sidecar_refs",
    "resolve_sidecar_refs_with_report",
    "sidecars_from_k8s",
]

#: Istio's default root namespace: PeerAuthentication and EnvoyFilter there apply mesh-wide.
ROOT_NAMESPACE = "istio-system"
#: What an unnamed port is modelled as. Istio sniffs the protocol (HTTP/1.1, HTTP/2, else TCP);
#: most service traffic is HTTP, so http is the less wrong guess. Always reported.
UNNAMED_PORT_MODE = Mode.HTTP

_WORKLOAD_KINDS = (
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "ReplicationController",
    "Job",
    "CronJob",
    "Pod",
    "DeploymentConfig",
    "Rollout",
)
_PROTO_MODE: Mapping[str, Mode] = {
    "http": Mode.HTTP,
    "http2": Mode.GRPC,
    "grpc": Mode.GRPC,
    "grpc-web": Mode.GRPC,
    "h2c": Mode.GRPC,
    "kubernetes.io/h2c": Mode.GRPC,
    "kubernetes.io/ws": Mode.HTTP,
    "kubernetes.io/wss": Mode.TCP,
    "tcp": Mode.TCP,
    "tls": Mode.TCP,
    "https": Mode.TCP,  # a sidecar does not decrypt it: opaque TLS
    "mongo": Mode.TCP,
    "mysql": Mode.TCP,
    "redis": Mode.TCP,
}
_INJECT = "sidecar.istio.io/inject"


@dataclass(frozen=True)
class K8sImport:
    """Modelled sidecar configuration per Service, with everything the import had to assume."""

    services: dict[str, SidecarConfig]
    assumptions: list[str] = field(default_factory=list)
    unknown_filters: tuple[str, ...] = ()
    problems: list[str] = field(default_factory=list)
    source: str = ""

    def to_ecg_services_yaml(self) -> str:
        """An ECG ``services:`` block to paste into an ECG file (assumptions as comments)."""
        lines = [f"# meshtax config from-k8s {self.source}"]
        lines += [f"# assumed: {a}" for a in self.assumptions]
        lines += [
            f"# no profile for filter {u}: left out of the chain" for u in self.unknown_filters
        ]
        lines += [f"# problem: {p}" for p in self.problems]
        lines.append("services:")
        if not self.services:
            lines[-1] = "services: {}"
        for name, cfg in self.services.items():
            lines.append(f"  {_yaml_key(name)}: {{sidecar: {_sidecar_flow(cfg)}}}")
        return "\n".join(lines) + "\n"

    def report(self) -> str:
        """Human-readable summary (what the CLI prints)."""
        width = max((len(n) for n in self.services), default=0)
        lines = [f"{self.source}: {len(self.services)} service(s)"]
        lines += [f"  {n.ljust(width)}  {c.describe()}" for n, c in self.services.items()]
        lines += [
            f"  no profile for filter {u}: not in the modelled chain; the prediction leaves out its cost"
            for u in self.unknown_filters
        ]
        lines += [f"  assumed: {a}" for a in self.assumptions]
        lines += [f"  problem: {p}" for p in self.problems]
        return "\n".join(lines)


def _yaml_key(s: str) -> str:
    out = yaml.safe_dump(s, default_flow_style=True, width=10_000).strip()
    return out.removesuffix("\n...").strip()


def _sidecar_flow(cfg: SidecarConfig) -> str:
    if not cfg.meshed:
        return "none"
    d: dict[str, Any] = {"mode": cfg.mode.value}
    if cfg.filters:
        d["filters"] = list(cfg.filters)
    d["mtls"] = cfg.mtls
    return yaml.safe_dump(d, default_flow_style=True, sort_keys=False, width=10_000).strip()


# ---------------------------------------------------------------------------------------------
# Objects as read from the manifests
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Where:
    file: str
    doc: int | None

    def __str__(self) -> str:
        return self.file if self.doc is None else f"{self.file} (document {self.doc + 1})"


@dataclass
class _Workload:
    kind: str
    name: str
    ns: str
    labels: dict[str, str]
    annotations: dict[str, str]
    ports: dict[str, int]  # container port name → number
    where: _Where


@dataclass
class _Service:
    name: str
    ns: str
    selector: dict[str, str] | None
    ports: list[Mapping[str, Any]]
    type: str
    where: _Where


@dataclass
class _PeerAuth:
    name: str
    ns: str
    selector: dict[str, str] | None
    mode: str  # STRICT, PERMISSIVE, DISABLE, UNSET
    port_modes: dict[int, str]
    order: int


@dataclass
class _EnvoyFilter:
    name: str
    ns: str
    selector: dict[str, str] | None
    patches: list[Mapping[str, Any]]
    priority: int
    order: int
    where: _Where


@dataclass
class _Manifests:
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    workloads: list[_Workload] = field(default_factory=list)
    services: list[_Service] = field(default_factory=list)
    peer_auths: list[_PeerAuth] = field(default_factory=list)
    envoy_filters: list[_EnvoyFilter] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)


def _str_map(v: Any, what: str, where: _Where) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ConfigImportError(
            where.file, f"{what}: a {type(v).__name__}; expected a mapping of strings", where.doc
        )
    return {
        str(k): ("true" if x is True else "false" if x is False else str(x)) for k, x in v.items()
    }


def _get(obj: Mapping[str, Any], dotted: str, where: _Where, want: type, default: Any) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        if cur is None:
            return default
        if not isinstance(cur, Mapping):
            raise ConfigImportError(
                where.file,
                f"{dotted}: {part!r} is inside a {type(cur).__name__}; expected a mapping",
                where.doc,
            )
        cur = cur.get(part)
    if cur is None:
        return default
    if not isinstance(cur, want):
        raise ConfigImportError(
            where.file, f"{dotted}: a {type(cur).__name__}; expected a {want.__name__}", where.doc
        )
    return cur


def _pod_template(obj: Mapping[str, Any], kind: str, where: _Where) -> Mapping[str, Any]:
    if kind == "Pod":
        return obj
    if kind == "CronJob":
        return dict(_get(obj, "spec.jobTemplate.spec.template", where, Mapping, {}))
    return dict(_get(obj, "spec.template", where, Mapping, {}))


def _add_object(obj: Any, m: _Manifests, where: _Where, order: int) -> None:
    if not isinstance(obj, Mapping):
        raise ConfigImportError(
            where.file,
            f"a {type(obj).__name__}; expected a Kubernetes object (apiVersion, kind, metadata)",
            where.doc,
        )
    kind = obj.get("kind")
    if not isinstance(kind, str):
        raise ConfigImportError(
            where.file,
            "no 'kind'; expected a Kubernetes object (apiVersion, kind, metadata)",
            where.doc,
        )
    if kind == "List" or kind.endswith("List"):
        for item in _get(obj, "items", where, list, []):
            _add_object(item, m, where, order)
        return
    meta = _get(obj, "metadata", where, Mapping, {})
    name = str(meta.get("name", ""))
    try:
        _add_typed(obj, kind, name, meta, m, where, order)
    except ConfigImportError as e:
        if e.detail.startswith(kind):
            raise
        raise ConfigImportError(e.source, f"{kind} {name!r}: {e.detail}", e.doc_index) from None


def _add_typed(
    obj: Mapping[str, Any],
    kind: str,
    name: str,
    meta: Mapping[str, Any],
    m: _Manifests,
    where: _Where,
    order: int,
) -> None:
    ns = str(meta.get("namespace") or "default")
    if kind == "Namespace":
        m.namespaces[name] = _str_map(meta.get("labels"), "metadata.labels", where)
    elif kind in _WORKLOAD_KINDS:
        tpl = _pod_template(obj, kind, where)
        tmeta = tpl.get("metadata") or {}
        if not isinstance(tmeta, Mapping):
            raise ConfigImportError(
                where.file,
                f"{kind} {name!r}: pod template metadata: a {type(tmeta).__name__}; expected a mapping",
                where.doc,
            )
        ports: dict[str, int] = {}
        containers = _get(tpl, "spec.containers", where, list, [])
        for c in containers:
            for p in _items(c.get("ports")) if isinstance(c, Mapping) else []:
                if (
                    isinstance(p, Mapping)
                    and p.get("name")
                    and isinstance(p.get("containerPort"), int)
                ):
                    ports[str(p["name"])] = int(p["containerPort"])
        m.workloads.append(
            _Workload(
                kind,
                name,
                ns,
                _str_map(tmeta.get("labels"), f"{kind} {name!r}: pod template labels", where),
                _str_map(
                    tmeta.get("annotations"), f"{kind} {name!r}: pod template annotations", where
                ),
                ports,
                where,
            )
        )
    elif kind == "Service":
        sel = _get(obj, "spec.selector", where, Mapping, None)
        sports = _get(obj, "spec.ports", where, list, [])
        for i, p in enumerate(sports):
            if not isinstance(p, Mapping):
                raise ConfigImportError(
                    where.file,
                    f"Service {name!r}: spec.ports[{i}]: a {type(p).__name__}; expected "
                    f"{{name, port, targetPort, appProtocol}}",
                    where.doc,
                )
        m.services.append(
            _Service(
                name,
                ns,
                _str_map(sel, f"Service {name!r}: spec.selector", where)
                if sel is not None
                else None,
                list(sports),
                str(_get(obj, "spec.type", where, str, "ClusterIP")),
                where,
            )
        )
    elif kind == "PeerAuthentication":
        sel = _get(obj, "spec.selector.matchLabels", where, Mapping, None)
        mode = str(_get(obj, "spec.mtls.mode", where, str, "UNSET")).upper()
        if mode not in ("STRICT", "PERMISSIVE", "DISABLE", "UNSET"):
            raise ConfigImportError(
                where.file,
                f"PeerAuthentication {name!r}: spec.mtls.mode {mode!r}; expected STRICT, PERMISSIVE, DISABLE or UNSET",
                where.doc,
            )
        port_modes: dict[int, str] = {}
        for k, v in (_get(obj, "spec.portLevelMtls", where, Mapping, {}) or {}).items():
            pm = v.get("mode") if isinstance(v, Mapping) else None
            try:
                port_modes[int(k)] = str(pm or "UNSET").upper()
            except ValueError:
                raise ConfigImportError(
                    where.file,
                    f"PeerAuthentication {name!r}: spec.portLevelMtls key {k!r}; expected a port number",
                    where.doc,
                ) from None
        m.peer_auths.append(
            _PeerAuth(
                name,
                ns,
                _str_map(sel, "selector", where) if sel is not None else None,
                mode,
                port_modes,
                order,
            )
        )
    elif kind == "EnvoyFilter":
        sel = _get(obj, "spec.workloadSelector.labels", where, Mapping, None)
        patches = _get(obj, "spec.configPatches", where, list, [])
        m.envoy_filters.append(
            _EnvoyFilter(
                name,
                ns,
                _str_map(sel, "workloadSelector.labels", where) if sel is not None else None,
                list(patches),
                int(_get(obj, "spec.priority", where, int, 0)),
                order,
                where,
            )
        )
    else:
        m.skipped[kind] = m.skipped.get(kind, 0) + 1


#: manifests read from one directory tree at most (a larger tree is refused, not truncated)
MAX_FILES = 10_000


def _files(root: Path) -> list[Path]:
    """Manifest files under ``root`` (regular files only; symbolic links to directories are
    not followed, so a link loop cannot trap the walk)."""
    if root.is_file():
        return [root]
    out: list[Path] = []
    for d, dirs, names in os.walk(root, followlinks=False, onerror=None):
        dirs.sort()
        for n in names:
            p = Path(d) / n
            if p.suffix.lower() in (".yaml", ".yml", ".json") and p.is_file():
                out.append(p)
        if len(out) > MAX_FILES:
            raise ConfigImportError(
                str(root), f"more than {MAX_FILES} manifest files; expected a smaller directory"
            )
    return sorted(out)


def _read(root: Path) -> _Manifests:
    m = _Manifests()
    order = 0
    files = _files(root)
    if not files:
        raise ConfigImportError(
            str(root), "no *.yaml, *.yml or *.json file; expected Kubernetes/Istio manifests"
        )
    for f in files:
        docs = load_documents(f)
        multi = len(docs) > 1
        for i, d in enumerate(docs):
            if d is None:
                continue
            _add_object(d, m, _Where(str(f), i if multi else None), order)
            order += 1
    return m


# ---------------------------------------------------------------------------------------------
# Istio's rules
# ---------------------------------------------------------------------------------------------


def _matches(selector: Mapping[str, str] | None, labels: Mapping[str, str]) -> bool:
    return selector is not None and all(labels.get(k) == v for k, v in selector.items())


def _injected(
    w: _Workload, ns_labels: Mapping[str, str] | None, assumptions: list[str]
) -> tuple[bool, str]:
    """Istio's injection webhooks (namespace selector + object selector), as ``(injected, why)``."""
    pod = w.labels.get(_INJECT, "").lower()
    ann = w.annotations.get(_INJECT, "").lower()
    if ns_labels is None:
        ns_labels = {}
        assumptions.append(
            f"namespace {w.ns!r} is not in the manifests: assumed it has no istio-injection label"
        )
    ns = ns_labels.get("istio-injection", "").lower()
    if pod == "false" or (not pod and ann == "false"):
        return False, f"{_INJECT}: false on the pod"
    if ns == "disabled":
        return False, f"namespace {w.ns!r} has istio-injection=disabled"
    if ns == "enabled" or "istio.io/rev" in ns_labels:
        return True, f"namespace {w.ns!r} has injection enabled"
    if pod == "true" or "istio.io/rev" in w.labels:
        return True, f"{_INJECT}: true label on the pod"
    if ann == "true":
        assumptions.append(
            f"{w.kind} {w.ns}/{w.name}: {_INJECT} is an annotation, not a label, in a namespace "
            "without istio-injection: "
            "Istio's webhook selects on the label, so no sidecar"
        )
    return False, "no injection label on the namespace or the pod"


def _protocol(port: Mapping[str, Any]) -> tuple[str | None, str]:
    """Istio's explicit protocol of a Service port (appProtocol wins over the name) and where it came from."""
    if str(port.get("protocol", "TCP")).upper() == "UDP":
        return "udp", "protocol: UDP"
    ap = port.get("appProtocol")
    if isinstance(ap, str) and ap:
        return ap.lower(), f"appProtocol {ap}"
    name = str(port.get("name") or "").lower()
    if name.startswith("grpc-web"):
        return "grpc-web", f"port name {name}"
    if name:
        return name.split("-", 1)[0], f"port name {name}"
    return None, "no name or appProtocol"


def _port_label(p: Mapping[str, Any]) -> str:
    return str(p.get("port", "?"))


def _target_port(p: Mapping[str, Any], w: _Workload | None) -> int | None:
    tp = p.get("targetPort", p.get("port"))
    if isinstance(tp, int):
        return tp
    if isinstance(tp, str):
        if tp.isdigit():
            return int(tp)
        if w is not None and tp in w.ports:
            return w.ports[tp]
    return None


def _mtls_mode(
    pas: Sequence[_PeerAuth], w: _Workload, port: int | None, root: str
) -> tuple[str, str]:
    """Effective PeerAuthentication mode for a workload port: ``(mode, source)``."""
    wl = [p for p in pas if p.ns == w.ns and _matches(p.selector, w.labels)]
    nsl = [p for p in pas if p.ns == w.ns and p.selector is None and p.ns != root]
    mesh = [p for p in pas if p.ns == root and p.selector is None]
    for level, cands in (("workload", wl), ("namespace", nsl), ("mesh", mesh)):
        if not cands:
            continue
        pa = min(
            cands, key=lambda p: p.order
        )  # Istio: the oldest wins; file order stands in for age
        if level == "workload" and port is not None and pa.port_modes.get(port, "UNSET") != "UNSET":
            return pa.port_modes[port], f"{level} PeerAuthentication {pa.ns}/{pa.name}, port {port}"
        if pa.mode != "UNSET":
            return pa.mode, f"{level} PeerAuthentication {pa.ns}/{pa.name}"
    return "PERMISSIVE", "no PeerAuthentication (Istio's default)"


def _filter_name_of(match: Mapping[str, Any]) -> str:
    lst = match.get("listener") if isinstance(match, Mapping) else None
    fc = lst.get("filterChain") if isinstance(lst, Mapping) else None
    f = fc.get("filter") if isinstance(fc, Mapping) else None
    if not isinstance(f, Mapping):
        return ""
    sub = f.get("subFilter")
    if isinstance(sub, Mapping) and sub.get("name"):
        return str(sub["name"])
    return str(f.get("name", ""))


def _match_port(match: Mapping[str, Any]) -> int | None:
    lst = match.get("listener") if isinstance(match, Mapping) else None
    if isinstance(lst, Mapping) and isinstance(lst.get("portNumber"), int):
        return int(lst["portNumber"])
    return None


def _apply_envoy_filters(
    efs: Sequence[_EnvoyFilter],
    w: _Workload,
    mode: Mode,
    port: int | None,
    root: str,
    svc: str,
    assumptions: list[str],
    unknown: list[str],
    problems: list[str],
) -> tuple[str, ...]:
    """The filter chain after the EnvoyFilters selecting this workload, in Istio's order."""
    chain: list[
        tuple[str, str]
    ] = []  # (meshtax filter, Envoy filter name) — names let INSERT_AFTER/REMOVE find them
    applicable = [
        e
        for e in efs
        if (e.ns == w.ns or e.ns == root) and (e.selector is None or _matches(e.selector, w.labels))
    ]
    # Istio applies root-namespace EnvoyFilters first, then the workload's namespace; priority, then age, within
    applicable.sort(key=lambda e: (e.priority, e.ns != root, e.order))
    for ef in applicable:
        ref = f"EnvoyFilter {ef.ns}/{ef.name}"
        for i, patch in enumerate(ef.patches):
            if not isinstance(patch, Mapping):
                raise ConfigImportError(
                    ef.where.file,
                    f"{ref}: configPatches[{i}]: a {type(patch).__name__}; expected {{applyTo, match, patch}}",
                    ef.where.doc,
                )
            apply_to = str(patch.get("applyTo", ""))
            match = patch.get("match") or {}
            body = patch.get("patch") or {}
            if not isinstance(match, Mapping) or not isinstance(body, Mapping):
                raise ConfigImportError(
                    ef.where.file,
                    f"{ref}: configPatches[{i}]: match and patch must be mappings",
                    ef.where.doc,
                )
            context = str(match.get("context", "ANY"))
            op = str(body.get("operation", ""))
            if apply_to not in ("HTTP_FILTER", "NETWORK_FILTER"):
                if apply_to:
                    assumptions.append(
                        f"service {svc!r}: {ref} patch {i} applies to {apply_to}: not a filter; not modelled"
                    )
                continue
            if context == "GATEWAY":
                continue
            if apply_to == "HTTP_FILTER" and mode is Mode.TCP:
                assumptions.append(
                    f"service {svc!r}: {ref} patch {i} adds an HTTP filter, but the port is TCP: does not apply"
                )
                continue
            mp = _match_port(match)
            if mp is not None and port is not None and mp != port:
                continue
            if context == "SIDECAR_OUTBOUND":
                assumptions.append(
                    f"service {svc!r}: {ref} patch {i} is for SIDECAR_OUTBOUND only; meshtax gives "
                    "a sidecar one chain for both directions, so it counts inbound too"
                )
            target = _filter_name_of(match)
            if op == "REMOVE":
                chain = [c for c in chain if c[1] != target]
                continue
            if op in ("MERGE", "REPLACE"):
                assumptions.append(
                    f"service {svc!r}: {ref} patch {i} {op}s {target or 'a filter'}: changes a "
                    "filter's settings, not the chain; not modelled"
                )
                continue
            value = body.get("value")
            if not isinstance(value, Mapping):
                problems.append(
                    f"{ef.where}: {ref}: configPatches[{i}].patch.value: expected a filter {{name, typed_config}}"
                )
                continue
            c = classify_filter(value)
            fname = str(value.get("name", ""))
            if c.kind == "unknown":
                unknown.append(f"{c.name} ({ref})")
                continue
            if c.kind != "profiled":
                continue
            entry = (c.name, fname)
            names = [x[1] for x in chain]
            if op == "INSERT_FIRST":
                chain.insert(0, entry)
            elif op == "INSERT_AFTER" and target in names:
                chain.insert(names.index(target) + 1, entry)
            elif op == "INSERT_BEFORE" and target in names:
                chain.insert(names.index(target), entry)
            else:
                # ADD, or relative to a filter meshtax does not keep (router, Istio's defaults): in order of application
                chain.append(entry)
    return tuple(c[0] for c in chain)


def sidecars_from_k8s(directory: str | Path, root_namespace: str = ROOT_NAMESPACE) -> K8sImport:
    """Map each Service in the manifests under ``directory`` to the sidecar configuration meshtax models."""
    root = Path(directory)
    try:
        exists = root.exists()
    except (OSError, ValueError) as e:
        raise ConfigImportError(
            str(root)[:200], f"not a usable path ({e.__class__.__name__})"
        ) from None
    if not exists:
        raise ConfigImportError(
            str(root), "not found; expected a directory (or file) of Kubernetes/Istio manifests"
        )
    m = _read(root)
    assumptions: list[str] = []
    problems: list[str] = []
    unknown: list[str] = []
    services: dict[str, SidecarConfig] = {}
    counts: dict[str, int] = {}
    for s in m.services:
        counts[s.name] = counts.get(s.name, 0) + 1
    if any(n > 1 for n in counts.values()):
        assumptions.append(
            "service names repeat across namespaces: those services are named NAME.NAMESPACE"
        )
    if not m.peer_auths:
        assumptions.append(
            "no PeerAuthentication: Istio's default PERMISSIVE, with auto mTLS between sidecars: modelled mTLS"
        )
    for s in m.services:
        key = s.name if counts[s.name] == 1 else f"{s.name}.{s.ns}"
        where = f"service {key!r}"
        if s.type == "ExternalName":
            assumptions.append(f"{where} is ExternalName (outside the mesh): no sidecar")
            services[key] = NO_SIDECAR
            continue
        ns_labels = m.namespaces.get(s.ns)
        if ns_labels is not None and ns_labels.get("istio.io/dataplane-mode") == "ambient":
            problems.append(
                f"{where}: namespace {s.ns!r} uses ambient mode (ztunnel/waypoint), which meshtax "
                "does not model: modelled as no sidecar"
            )
        if s.selector is None:
            problems.append(
                f"{where} has no selector (endpoints managed by hand): cannot tell its pods; left out"
            )
            continue
        ws = [w for w in m.workloads if w.ns == s.ns and _matches(s.selector, w.labels)]
        if not ws:
            problems.append(
                f"{where} selects no workload in the manifests (selector {s.selector}): left out"
            )
            continue
        ns_warn: list[str] = []
        inj = [(_injected(w, ns_labels, ns_warn), w) for w in ws]
        for a in ns_warn:
            if a not in assumptions:
                assumptions.append(a)
        flags = {i[0][0] for i in inj}
        if len(flags) > 1:
            with_ = ", ".join(f"{w.kind} {w.name}" for (ok, _), w in inj if ok)
            problems.append(
                f"{where} selects pods with and without a sidecar ({with_} have one): modelled with a sidecar"
            )
        w = next((w for (ok, _), w in inj if ok), ws[0])
        if not any(flags):
            services[key] = NO_SIDECAR
            continue
        if not s.ports:
            problems.append(f"{where} has no ports: left out")
            continue
        protos = [(_protocol(p), p) for p in s.ports]
        (proto, how), first = protos[0]
        if len(s.ports) > 1:
            listed = ", ".join(f"{_port_label(p)} ({pr or 'unnamed'})" for (pr, _), p in protos)
            assumptions.append(
                f"{where} has ports {listed}: modelled by its first port, {_port_label(first)}"
            )
        if proto is None:
            mode = UNNAMED_PORT_MODE
            assumptions.append(
                f"{where} port {_port_label(first)} has no name/appProtocol: Istio sniffs the "
                f"protocol; assumed {mode.value} "
                "(name the port http-*/grpc-*/tcp-* or set appProtocol to be exact)"
            )
        elif proto == "udp":
            problems.append(
                f"{where} port {_port_label(first)} is UDP, which the sidecar does not intercept: "
                "no sidecar on that port"
            )
            services[key] = NO_SIDECAR
            continue
        elif proto in _PROTO_MODE:
            mode = _PROTO_MODE[proto]
            if proto == "http2":
                assumptions.append(
                    f"{where}: {how} → HTTP/2, modelled by gRPC mode (meshtax's HTTP/2 mode)"
                )
            elif proto in ("https", "tls", "mongo", "mysql", "redis"):
                assumptions.append(
                    f"{where}: {how} → {proto}, which the sidecar proxies as opaque TCP: tcp mode"
                )
        else:
            mode = Mode.TCP
            assumptions.append(
                f"{where}: {how} is not a protocol Istio knows: Istio sniffs/treats it as TCP; assumed tcp"
            )
        tport = _target_port(first, w)
        pa_mode, pa_src = _mtls_mode(m.peer_auths, w, tport, root_namespace)
        mtls = pa_mode in ("STRICT", "PERMISSIVE")
        if pa_mode == "PERMISSIVE" and m.peer_auths:
            assumptions.append(
                f"{where}: PERMISSIVE ({pa_src}): sidecar callers use auto mTLS: modelled mTLS"
            )
        filters = _apply_envoy_filters(
            m.envoy_filters, w, mode, tport, root_namespace, key, assumptions, unknown, problems
        )
        services[key] = SidecarConfig(mode=mode, filters=filters, mtls=mtls)
    if m.skipped:
        kinds = ", ".join(f"{k} ×{n}" for k, n in sorted(m.skipped.items()))
        assumptions.append(f"not read (no effect on the modelled sidecar): {kinds}")
    return K8sImport(services, assumptions, tuple(dict.fromkeys(unknown)), problems, str(root))


# ---------------------------------------------------------------------------------------------
# ECG references
# ---------------------------------------------------------------------------------------------


def _inside(
    base_dir: Path, ref: str, field: str, allow_outside: Sequence[str | os.PathLike[str]]
) -> Path:
    """``base_dir / ref`` if it resolves (links followed) inside ``base_dir`` or one of
    ``allow_outside``; an ECG from elsewhere must not make meshtax read any file it names."""
    try:
        target = (base_dir / ref).resolve()
        roots = [base_dir.resolve(), *(Path(a).resolve() for a in allow_outside)]
    except (OSError, RuntimeError, ValueError) as e:  # name too long, link loop, NUL byte
        raise ConfigImportError(field, f"not a usable path ({e.__class__.__name__})") from None
    if not any(target == r or target.is_relative_to(r) for r in roots):
        raise ConfigImportError(
            field,
            f"{ref!r} is outside the ECG file's directory ({base_dir}); move it there, or allow "
            "its directory with --allow-outside DIR",
        )
    return target


def resolve_sidecar_refs_with_report(
    doc: dict[str, Any],
    base_dir: Path,
    allow_outside: Sequence[str | os.PathLike[str]] = (),
) -> tuple[dict[str, Any], list[str]]:
    """Replace sidecar references in a parsed ECG document; also return what the imports reported.

    * ``services.NAME.sidecar: {from_envoy: PATH, listener: NAME, port: N}`` → that Envoy config;
    * top-level ``sidecars_from_k8s: DIR`` → every service without its own ``sidecar`` takes the
      sidecar of the Service of the same name (or ``NAME.NAMESPACE``); the key is removed.

    Paths are relative to ``base_dir`` (the ECG file's directory) and must stay inside it
    or one of ``allow_outside``. Unknown filters and assumptions come back as messages, so a
    caller can print them.
    """
    if not isinstance(doc, dict):
        return doc, []
    # copies of what is rewritten (the services), not of the invocations (10^5 of them)
    out = dict(doc)
    if isinstance(out.get("services"), dict):
        out["services"] = {
            k: dict(v) if isinstance(v, dict) else v for k, v in out["services"].items()
        }
    messages: list[str] = []
    services = out.get("services")
    k8s_ref = out.pop("sidecars_from_k8s", None)
    if k8s_ref is not None:
        if not isinstance(k8s_ref, str):
            raise ConfigImportError(
                "sidecars_from_k8s", f"a {type(k8s_ref).__name__}; expected a directory path"
            )
        imp = sidecars_from_k8s(_inside(base_dir, k8s_ref, "sidecars_from_k8s", allow_outside))
        messages += [f"{k8s_ref}: assumed: {a}" for a in imp.assumptions]
        messages += [f"{k8s_ref}: problem: {p}" for p in imp.problems]
        messages += [f"{k8s_ref}: no profile for filter {u}" for u in imp.unknown_filters]
        if isinstance(services, dict):
            for name, s in services.items():
                if s is None:
                    s = services[name] = {}
                if isinstance(s, dict) and "sidecar" not in s:
                    cfg = imp.services.get(name)
                    if cfg is None:
                        messages.append(
                            f"{k8s_ref}: no Service {name!r} in the manifests: services.{name} "
                            "keeps the default sidecar"
                        )
                        continue
                    s["sidecar"] = "none" if not cfg.meshed else _ecg_sidecar(cfg)
    if isinstance(services, dict):
        for name, s in services.items():
            sc = s.get("sidecar") if isinstance(s, dict) else None
            if isinstance(sc, dict) and "from_envoy" in sc:
                ref = sc["from_envoy"]
                if not isinstance(ref, str):
                    raise ConfigImportError(
                        f"services.{name}.sidecar.from_envoy",
                        f"a {type(ref).__name__}; expected a file path",
                    )
                listener = sc.get("listener")
                port = sc.get("port")
                extra = set(sc) - {"from_envoy", "listener", "port"}
                if extra:
                    raise ConfigImportError(
                        f"services.{name}.sidecar",
                        f"unknown field(s) {', '.join(sorted(extra))} next to from_envoy; expected "
                        "listener and port only",
                    )
                if listener is not None and not isinstance(listener, str):
                    raise ConfigImportError(
                        f"services.{name}.sidecar.listener",
                        f"a {type(listener).__name__}; expected a listener name",
                    )
                if port is not None and (not isinstance(port, int) or isinstance(port, bool)):
                    raise ConfigImportError(
                        f"services.{name}.sidecar.port", f"{port!r}; expected a port number"
                    )
                where = f"services.{name}.sidecar.from_envoy"
                env = sidecar_from_envoy(
                    _inside(base_dir, ref, where, allow_outside), listener=listener, port=port
                )
                messages += [f"{ref}: no profile for filter {u}" for u in env.unknown_filters]
                s["sidecar"] = _ecg_sidecar(env.config)
    return out, messages


def resolve_sidecar_refs(
    doc: dict[str, Any], base_dir: Path, allow_outside: Sequence[str | os.PathLike[str]] = ()
) -> dict[str, Any]:
    """:func:`resolve_sidecar_refs_with_report` without the messages."""
    return resolve_sidecar_refs_with_report(doc, base_dir, allow_outside)[0]


def _ecg_sidecar(cfg: SidecarConfig) -> dict[str, Any]:
    return {
        "mode": cfg.mode.value,
        "filters": list(cfg.filters),
        "mtls": cfg.mtls,
        "architecture": cfg.architecture.value,
    }
