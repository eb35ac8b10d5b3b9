"""Kubernetes/Istio manifests as read: every ``*.yaml``, ``*.yml`` and ``*.json`` under a
directory (multi-document YAML and ``kind: List`` included), each object checked field by field
(:class:`~meshtax.traces.config_files.ConfigImportError` naming the file and the document)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshtax.traces.config_files import ConfigImportError, load_documents
from meshtax.traces.envoy_filters import _items

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
class _Policy:
    """An Istio resource that changes a workload's filter chain, reduced to what does.

    AuthorizationPolicy: ``action`` and ``rules`` (sources × operations of each rule);
    RequestAuthentication: ``count`` JWT rules; Sidecar: ``ports`` (ingress port → protocol);
    Telemetry: ``metrics`` and ``access_log`` (None: not set here, inherited)."""

    kind: str
    name: str
    ns: str
    selector: dict[str, str] | None
    order: int
    action: str = ""
    rules: tuple[int, ...] = ()
    count: int = 0
    ports: dict[int, str] = field(default_factory=dict)
    metrics: bool | None = None
    access_log: bool | None = None
    provider: str = ""
    target_refs: bool = False
    host: str = ""  # DestinationRule
    tls: str = ""  # DestinationRule: trafficPolicy.tls.mode
    hosts: tuple[str, ...] = ()  # VirtualService; ``count``: its HTTP routes with a fault
    mesh: bool = True  # VirtualService: applies to sidecars (gateways unset or "mesh")

    @property
    def ref(self) -> str:
        return f"{self.kind} {self.ns}/{self.name}"


POLICY_KINDS = (
    "AuthorizationPolicy",
    "RequestAuthentication",
    "Sidecar",
    "Telemetry",
    "DestinationRule",
    "VirtualService",
)
AUTHZ_ACTIONS = ("ALLOW", "DENY", "AUDIT", "CUSTOM")


@dataclass
class _Manifests:
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    workloads: list[_Workload] = field(default_factory=list)
    services: list[_Service] = field(default_factory=list)
    peer_auths: list[_PeerAuth] = field(default_factory=list)
    envoy_filters: list[_EnvoyFilter] = field(default_factory=list)
    policies: list[_Policy] = field(default_factory=list)
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
    elif kind in POLICY_KINDS:
        m.policies.append(_read_policy(obj, kind, name, ns, where, order))
    else:
        m.skipped[kind] = m.skipped.get(kind, 0) + 1


def _len(obj: Any, dotted: str, where: _Where) -> int:
    return len(_get(obj, dotted, where, list, []))


def _read_policy(
    obj: Mapping[str, Any], kind: str, name: str, ns: str, where: _Where, order: int
) -> _Policy:
    sel_key = "spec.workloadSelector.labels" if kind == "Sidecar" else "spec.selector.matchLabels"
    sel = _get(obj, sel_key, where, Mapping, None)
    p = _Policy(kind, name, ns, _str_map(sel, sel_key, where) if sel is not None else None, order)
    p.target_refs = bool(
        _get(obj, "spec.targetRefs", where, list, [])
        or _get(obj, "spec.targetRef", where, Mapping, {})
    )
    if kind == "AuthorizationPolicy":
        p.action = str(_get(obj, "spec.action", where, str, "ALLOW")).upper()
        if p.action not in AUTHZ_ACTIONS:
            raise ConfigImportError(
                where.file,
                f"spec.action {p.action!r}; expected one of {', '.join(AUTHZ_ACTIONS)}",
                where.doc,
            )
        p.provider = str(_get(obj, "spec.provider.name", where, str, ""))
        rules = []
        for i, r in enumerate(_get(obj, "spec.rules", where, list, [])):
            if r is None:
                r = {}
            if not isinstance(r, Mapping):
                raise ConfigImportError(
                    where.file,
                    f"spec.rules[{i}]: a {type(r).__name__}; expected {{from, to, when}}",
                    where.doc,
                )
            # one (source, operation) pair = one policy of the profiled RBAC filters
            rules.append(max(1, _len(r, "from", where)) * max(1, _len(r, "to", where)))
        p.rules = tuple(rules)
    elif kind == "RequestAuthentication":
        p.count = _len(obj, "spec.jwtRules", where)
    elif kind == "VirtualService":
        p.hosts = tuple(str(h) for h in _get(obj, "spec.hosts", where, list, []))
        gateways = _get(obj, "spec.gateways", where, list, [])
        p.mesh = not gateways or "mesh" in gateways
        routes = _get(obj, "spec.http", where, list, [])
        p.count = sum(1 for r in routes if isinstance(r, Mapping) and r.get("fault"))
    elif kind == "DestinationRule":
        p.host = str(_get(obj, "spec.host", where, str, ""))
        p.tls = str(_get(obj, "spec.trafficPolicy.tls.mode", where, str, "")).upper()
    elif kind == "Sidecar":
        for i, ing in enumerate(_get(obj, "spec.ingress", where, list, [])):
            port = ing.get("port") if isinstance(ing, Mapping) else None
            num = port.get("number") if isinstance(port, Mapping) else None
            if not isinstance(port, Mapping) or not isinstance(num, int) or isinstance(num, bool):
                raise ConfigImportError(
                    where.file,
                    f"spec.ingress[{i}].port.number: expected a port number",
                    where.doc,
                )
            p.ports[num] = str(port.get("protocol") or port.get("name") or "").lower()
    else:  # Telemetry
        p.metrics = _telemetry_switch(_get(obj, "spec.metrics", where, list, None), where)
        logs = _get(obj, "spec.accessLogging", where, list, None)
        if logs is not None:
            p.access_log = bool(logs) and not any(
                isinstance(x, Mapping) and x.get("disabled") is True for x in logs
            )
    return p


def _telemetry_switch(metrics: list[Any] | None, where: _Where) -> bool | None:
    """Telemetry ``metrics``: False when an override disables every metric, True when set
    otherwise, None when absent (inherited)."""
    if metrics is None:
        return None
    for entry in metrics:
        for o in _items(entry.get("overrides")) if isinstance(entry, Mapping) else []:
            match = o.get("match") if isinstance(o, Mapping) else None
            metric = match.get("metric") if isinstance(match, Mapping) else None
            if (
                isinstance(o, Mapping)
                and o.get("disabled") is True
                and (metric in (None, "ALL_METRICS"))
            ):
                return False
    return True


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
