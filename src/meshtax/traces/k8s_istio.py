"""Istio's rules over the manifests: sidecar injection, protocol selection on Service ports,
PeerAuthentication precedence and EnvoyFilter patches of a workload's filter chain."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from meshtax.model.sidecar import Mode
from meshtax.traces.config_files import ConfigImportError
from meshtax.traces.envoy_filters import classify_filter
from meshtax.traces.k8s_manifests import _EnvoyFilter, _PeerAuth, _Workload

_INJECT = "sidecar.istio.io/inject"


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
    istio: Sequence[tuple[str, str]] = (),
) -> tuple[str, ...]:
    """The filter chain after the EnvoyFilters selecting this workload, in Istio's order,
    starting from the filters Istio's own resources put there (``istio``)."""
    # (meshtax filter, Envoy filter name): names let INSERT_AFTER/REMOVE find them
    chain: list[tuple[str, str]] = list(istio)
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
