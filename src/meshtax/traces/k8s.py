"""Read Kubernetes/Istio manifests and map each Service to the sidecar configuration meshtax models.

Reads every ``*.yaml``, ``*.yml`` and ``*.json`` under a directory (multi-document YAML and
``kind: List`` included) and follows Istio's own rules:

* **sidecar** — injection: a pod label/annotation ``sidecar.istio.io/inject: "false"`` opts
  out; a namespace labelled ``istio-injection=disabled`` never injects; a namespace labelled
  ``istio-injection=enabled`` (or ``istio.io/rev``) injects; otherwise only pods labelled
  ``sidecar.istio.io/inject: "true"`` (or ``istio.io/rev``) get one; ``injection`` overrides
  the namespaces' labels (``enabled``/``disabled``).
* **mode** — Istio's protocol selection on the Service port: ``appProtocol`` first, then the
  port name ``<protocol>[-<suffix>]``; http → http; http2/grpc/grpc-web/h2c → grpc; tcp, tls,
  https, mongo, mysql, redis → tcp. Unnamed ports are sniffed by Istio; meshtax has to assume.
  A Sidecar resource's ingress port protocol wins.
* **mTLS** — PeerAuthentication, workload (selector, port-level) over namespace over mesh
  (root namespace); STRICT and PERMISSIVE → mTLS (sidecar callers use auto mTLS), DISABLE → none:
  a DestinationRule's TLS mode says what clients send.
* **filters** — EnvoyFilter patches (HTTP_FILTER / NETWORK_FILTER inserts and removes) that
  select the workload, classified like an Envoy config (:mod:`meshtax.traces.envoy_config`),
  after the filters Istio's resources put there (:mod:`meshtax.traces.k8s_policies`): the
  ``istio-default`` telemetry preset (per Telemetry), RBAC per AuthorizationPolicy action, JWT.

Every guess is listed in ``assumptions``; nothing raises anything but :class:`ConfigImportError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from meshtax.errors import clip
from meshtax.model.sidecar import NO_SIDECAR, Mode, SidecarConfig
from meshtax.traces.config_files import ConfigImportError
from meshtax.traces.envoy_config import sidecar_from_envoy
from meshtax.traces.k8s_istio import (
    _apply_envoy_filters,
    _injected,
    _matches,
    _mtls_mode,
    _port_label,
    _protocol,
    _target_port,
)
from meshtax.traces.k8s_manifests import _read
from meshtax.traces.k8s_policies import (
    destination_tls,
    policy_chain,
    route_faults,
    sidecar_protocol,
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
#: ``from-k8s --injection``: as the manifests say, or every namespace enabled/disabled
INJECTION = ("labels", "enabled", "disabled")

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


@dataclass(frozen=True)
class K8sImport:
    """Modelled sidecar configuration per Service, with everything the import had to assume."""

    services: dict[str, SidecarConfig]
    assumptions: list[str] = field(default_factory=list)
    unknown_filters: tuple[str, ...] = ()
    problems: list[str] = field(default_factory=list)
    source: str = ""
    #: per service: mTLS and where it comes from, telemetry, RBAC with rule counts, JWT
    details: dict[str, list[str]] = field(default_factory=dict)

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
            lines += [f"  # {d}" for d in self.details.get(name, [])]
            lines.append(f"  {_yaml_key(name)}: {{sidecar: {_sidecar_flow(cfg)}}}")
        return "\n".join(lines) + "\n"

    def report(self) -> str:
        """Human-readable summary (what the CLI prints)."""
        width = max((len(n) for n in self.services), default=0)
        lines = [f"{self.source}: {len(self.services)} service(s)"]
        for n, c in self.services.items():
            lines.append(f"  {n.ljust(width)}  {c.describe()}")
            lines += [f"  {''.ljust(width)}    {d}" for d in self.details.get(n, [])]
        lines += [
            f"  no profile for filter {u}: not in the modelled chain; the prediction leaves out its cost"
            for u in self.unknown_filters
        ]
        lines += [f"  assumed: {a}" for a in self.assumptions]
        lines += [f"  problem: {p}" for p in self.problems]
        meshed = [c for c in self.services.values() if c.meshed]
        filters = list(dict.fromkeys(f for c in meshed for f in c.filters))
        if filters:
            modes = ",".join(dict.fromkeys(c.mode.value for c in meshed if c.filters))
            lines.append(
                f"  predict needs these filters in the profile: meshtax profile --filters "
                f"{','.join(filters)} --modes {modes}"
                + (" --mtls" if any(c.mtls for c in meshed) else "")
            )
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


def sidecars_from_k8s(
    directory: str | Path, root_namespace: str = ROOT_NAMESPACE, injection: str = "labels"
) -> K8sImport:
    """Map each Service in the manifests under ``directory`` to the sidecar configuration
    meshtax models. ``injection``: ``labels`` (as the manifests say), ``enabled`` (every
    namespace labelled ``istio-injection=enabled``; pods may still opt out) or ``disabled``."""
    if injection not in INJECTION:
        raise ValueError(f"injection {injection!r}; expected one of {', '.join(INJECTION)}")
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
    details: dict[str, list[str]] = {}
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
        if injection == "disabled":
            services[key] = NO_SIDECAR
            continue
        ns_warn: list[str] = []
        labels = {**(ns_labels or {}), "istio-injection": "enabled"}
        inj = [
            (_injected(w, labels if injection == "enabled" else ns_labels, ns_warn), w) for w in ws
        ]
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
        declared = sidecar_protocol(m.policies, w, tport, root_namespace)
        if declared is not None and declared[0].split("-")[0] in _PROTO_MODE:
            mode = _PROTO_MODE[declared[0].split("-")[0]]
            assumptions.append(f"{where}: {declared[1]} declares port {tport} {declared[0]}")
        pa_mode, pa_src = _mtls_mode(m.peer_auths, w, tport, root_namespace)
        mtls = pa_mode in ("STRICT", "PERMISSIVE")
        if pa_mode == "PERMISSIVE" and m.peer_auths:
            assumptions.append(
                f"{where}: PERMISSIVE ({pa_src}): sidecar callers use auto mTLS: modelled mTLS"
            )
        tls_note = ""
        dr = destination_tls(m.policies, s.name, s.ns)
        if dr is not None:
            mtls, tls_note = _client_tls(dr, pa_mode, where, mtls, assumptions, problems)
        pc = policy_chain(m.policies, w, mode, root_namespace, key)
        faults = route_faults(m.policies, s.name, s.ns)
        if faults and mode is not Mode.TCP:
            # the callers' sidecars evaluate it on every call to this service: one per call,
            # priced on this hop (meshtax gives a sidecar one chain for both directions)
            pc.first.append(("fault_injection", "envoy.filters.http.fault"))
            pc.details.append(f"fault filter configured by {', '.join(faults)}")
            assumptions.append(
                f"{where}: {', '.join(faults)} injects faults on routes to it: the fault "
                "filter's evaluation is priced (fault_injection); the injected delays and "
                "aborts change the application, not the sidecar, and are not modelled"
            )
        unknown += pc.unknown
        assumptions += [a for a in pc.assumptions if a not in assumptions]
        filters = _apply_envoy_filters(
            m.envoy_filters,
            w,
            mode,
            tport,
            root_namespace,
            key,
            assumptions,
            unknown,
            problems,
            pc.first,
        )
        filters += tuple(f for f, _ in pc.last)
        details[key] = [
            f"mTLS: {'yes' if mtls else 'no'}, {pa_mode} ({pa_src}){tls_note}",
            *pc.details,
        ]
        services[key] = SidecarConfig(mode=mode, filters=filters, mtls=mtls)
    if m.skipped:
        kinds = ", ".join(f"{k} ×{n}" for k, n in sorted(m.skipped.items()))
        assumptions.append(f"not read (no effect on the modelled sidecar): {kinds}")
    unlabelled = sorted({s.ns for s in m.services} - set(m.namespaces))
    if injection == "labels" and services and unlabelled:
        if not any(c.meshed for c in services.values()):
            problems.append(
                f"no Namespace manifest for {', '.join(unlabelled)} and no pod asks for a "
                "sidecar: every service is modelled without one. Istio injects where the "
                "namespace is labelled (kubectl label namespace NAME istio-injection=enabled, "
                "usually not in the manifests): pass --injection enabled to model that"
            )
    return K8sImport(
        services, assumptions, tuple(dict.fromkeys(unknown)), problems, str(root), details
    )


def _client_tls(
    dr: tuple[str, str],
    server: str,
    where: str,
    mtls: bool,
    assumptions: list[str],
    problems: list[str],
) -> tuple[bool, str]:
    """mTLS of a service's hops once its DestinationRule's TLS mode (what clients send) meets
    its PeerAuthentication mode (what the server accepts), and a note for the details."""
    mode, ref = dr
    note = f"; clients: {mode} ({ref})"
    if mode == "DISABLE":
        if server == "STRICT":
            problems.append(f"{where}: {ref} sends plaintext to a STRICT server: requests fail")
            return mtls, note
        return False, note
    if mode in ("ISTIO_MUTUAL", "MUTUAL"):
        if server == "DISABLE":
            problems.append(f"{where}: {ref} sends mTLS to a server with mTLS DISABLE")
        return True, note
    assumptions.append(
        f"{where}: {ref} tls {mode}: TLS without Istio's client certificate, which meshtax "
        "does not model; mTLS as PeerAuthentication says"
    )
    return mtls, note


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
        injection = "labels"
        if isinstance(k8s_ref, dict) and set(k8s_ref) <= {"path", "injection"}:
            injection = k8s_ref.get("injection", injection)
            k8s_ref = k8s_ref.get("path")
            if injection not in INJECTION:
                raise ConfigImportError(
                    "sidecars_from_k8s.injection",
                    f"{clip(injection)}; expected one of {', '.join(INJECTION)}",
                )
        if not isinstance(k8s_ref, str):
            raise ConfigImportError(
                "sidecars_from_k8s",
                f"a {type(k8s_ref).__name__}; expected a directory path or {{path, injection}}",
            )
        k8s_dir = _inside(base_dir, k8s_ref, "sidecars_from_k8s", allow_outside)
        imp = sidecars_from_k8s(k8s_dir, injection=injection)
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
