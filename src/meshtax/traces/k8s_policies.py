"""What Istio's policy resources put in a workload's sidecar: AuthorizationPolicy → RBAC
filters, RequestAuthentication → a JWT filter, Telemetry → the default telemetry preset and
the access log, Sidecar → the protocol of an inbound port, DestinationRule → whether clients
use mTLS to a service, VirtualService → a configured fault filter on the routes to it.

Selection follows Istio: a policy with a selector applies to the matching workloads of its
namespace (of every namespace when it is in the root namespace); one without applies to its
whole namespace, or to the mesh from the root namespace. Telemetry and Sidecar take the most
specific resource (workload over namespace over mesh); authorization policies all apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from meshtax.model.components import sized
from meshtax.model.presets import ISTIO_DEFAULT
from meshtax.model.sidecar import Mode
from meshtax.traces.k8s_manifests import _Policy, _Workload

__all__ = ["Chain", "destination_tls", "policy_chain", "route_faults", "sidecar_protocol"]

#: Istio builds one RBAC filter per action, in this order (CUSTOM's decides when to call the
#: external authorizer; AUDIT's only marks requests)
_ACTION_ORDER = ("CUSTOM", "DENY", "ALLOW", "AUDIT")
_LEVELS = ("workload", "namespace", "mesh")


def _level(p: _Policy, w: _Workload, root: str) -> str | None:
    """How ``p`` selects ``w``: ``workload``, ``namespace``, ``mesh`` or not at all (None)."""
    if p.selector is not None:
        ok = (p.ns == w.ns or p.ns == root) and all(
            w.labels.get(k) == v for k, v in p.selector.items()
        )
        return "workload" if ok else None
    if p.ns == w.ns and p.ns != root:
        return "namespace"
    return "mesh" if p.ns == root else None


@dataclass
class Chain:
    """Filters (meshtax name, Envoy name) the policies add, and what the import says of them."""

    first: list[tuple[str, str]] = field(default_factory=list)
    last: list[tuple[str, str]] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)


def _most_specific(ps: Sequence[tuple[str, _Policy]], attr: str) -> tuple[bool | None, str]:
    for level in _LEVELS:
        for lv, p in sorted(ps, key=lambda x: x[1].order):  # the oldest first
            value = getattr(p, attr)
            if lv == level and value is not None:
                return value, f"{level} {p.ref}"
    return None, ""


def policy_chain(
    policies: Sequence[_Policy], w: _Workload, mode: Mode, root: str, svc: str
) -> Chain:
    """The filters Istio's policies put in the sidecar of ``w`` serving in ``mode``."""
    out = Chain()
    sel = [(lv, p) for p in policies if (lv := _level(p, w, root)) is not None]
    for _, p in sel:
        if p.target_refs and p.selector is None:
            out.assumptions.append(
                f"service {svc!r}: {p.ref} has targetRefs (gateways, waypoints): read as "
                "selecting the whole namespace"
            )
    tel = [(lv, p) for lv, p in sel if p.kind == "Telemetry"]
    metrics, m_src = _most_specific(tel, "metrics")
    logs, l_src = _most_specific(tel, "access_log")
    if mode is Mode.TCP:
        out.details.append(
            "telemetry: Istio's TCP metadata exchange and stats run per connection: not modelled"
        )
    elif metrics is False:
        out.first.append(("istio_metadata_exchange", "istio.metadata_exchange"))
        out.details.append(f"telemetry: metrics disabled ({m_src}): metadata exchange only")
        out.assumptions.append(
            f"service {svc!r}: metrics disabled by {m_src}: Istio drops its stats filter and "
            "keeps metadata exchange (modelled: istio_metadata_exchange)"
        )
    else:
        out.first.append((ISTIO_DEFAULT, "istio.metadata_exchange"))
        why = f"metrics enabled by {m_src}" if m_src else "Istio's default"
        out.details.append(
            f"telemetry: {ISTIO_DEFAULT} ({why}; Lua stand-ins for metadata exchange and stats)"
        )
    if logs and mode is not Mode.TCP:
        out.last.append(("access_log", "envoy.access_loggers.file"))
        out.details.append(f"access log: on ({l_src})")
    for _, p in sel:
        if p.kind == "RequestAuthentication" and mode is not Mode.TCP:
            out.unknown.append(f"envoy.filters.http.jwt_authn ({p.ref}, {p.count} JWT rule(s))")
            out.details.append(f"JWT: {p.ref}: jwt_authn has no profile, left out")
    authz = [p for _, p in sel if p.kind == "AuthorizationPolicy"]
    for action in _ACTION_ORDER:
        ps = [p for p in authz if p.action == action]
        if not ps:
            continue
        n = sum(sum(p.rules) for p in ps)
        base = "rbac_network" if mode is Mode.TCP else "rbac_http"
        name = sized(base, max(1, n))
        refs = ", ".join(p.ref.split(" ", 1)[1] for p in ps)
        out.first.append((name, f"envoy.filters.{'network' if mode is Mode.TCP else 'http'}.rbac"))
        out.details.append(f"RBAC {action}: {n} rule(s) ({refs}) → {name}")
        if n == 0:
            what = "denies every request" if action == "ALLOW" else "matches nothing"
            out.assumptions.append(
                f"service {svc!r}: {action} polic(ies) {refs} without rules: Istio's RBAC filter "
                f"{what}; priced as a 1-rule filter"
            )
        if action == "CUSTOM":
            prov = ", ".join(sorted({p.provider or "?" for p in ps}))
            out.unknown.append(f"envoy.filters.http.ext_authz (CUSTOM provider {prov}; {refs})")
        if mode is Mode.TCP:
            out.assumptions.append(
                f"service {svc!r}: tcp port: {action} rules become a network RBAC filter (per "
                "connection); Istio drops or widens rules with HTTP-only conditions"
            )
    return out


def sidecar_protocol(
    policies: Sequence[_Policy], w: _Workload, port: int | None, root: str
) -> tuple[str, str] | None:
    """The protocol a Sidecar resource declares for the workload's inbound ``port``, and which."""
    if port is None:
        return None
    sel = [(lv, p) for p in policies if p.kind == "Sidecar" and (lv := _level(p, w, root))]
    for level in _LEVELS:
        for lv, p in sorted(sel, key=lambda x: x[1].order):
            if lv == level and port in p.ports:
                return p.ports[port], p.ref
    return None


def destination_tls(policies: Sequence[_Policy], name: str, ns: str) -> tuple[str, str] | None:
    """The TLS mode clients use towards Service ``name.ns`` by its DestinationRule: an exact
    host (short names in the rule's namespace) before a wildcard, the oldest first."""
    exact: list[_Policy] = []
    wild: list[_Policy] = []
    for p in policies:
        if p.kind != "DestinationRule" or not p.tls:
            continue
        how = _host_match(p.host, p.ns, name, ns)
        if how == "exact":
            exact.append(p)
        elif how == "wildcard":
            wild.append(p)
    for cands in (exact, wild):
        if cands:
            p = min(cands, key=lambda x: x.order)
            return p.tls, p.ref
    return None


def _host_match(host: str, rule_ns: str, name: str, ns: str) -> str | None:
    """Does ``host`` (a short name means the rule's namespace) name Service ``name.ns``?"""
    fqdn = f"{name}.{ns}.svc.cluster.local"
    full = host if "." in host or host == "*" else f"{host}.{rule_ns}"
    if fqdn.startswith(f"{full}.") or full == fqdn:
        return "exact"
    if full.startswith("*") and fqdn.endswith(full[1:]):
        return "wildcard"
    return None


def route_faults(policies: Sequence[_Policy], name: str, ns: str) -> list[str]:
    """VirtualServices that inject faults (delay, abort) on sidecar routes to ``name.ns``."""
    return [
        p.ref
        for p in policies
        if p.kind == "VirtualService"
        and p.count
        and p.mesh
        and any(_host_match(h, p.ns, name, ns) for h in p.hosts)
    ]
