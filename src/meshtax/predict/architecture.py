"""A call priced by the proxies it crosses, per mesh architecture (pure, vectorized).

Each service has an architecture — its own (``Service.architecture``, or a non-sidecar
``architecture`` in its sidecar config), else the prediction's default (``--architecture``);
a service without a sidecar (``sidecar: none``) is always ``none``. A call caller → callee
crosses, for the request and again for the response:

========== ============================================== ==========================================
side       caller's (outbound)                             callee's (inbound)
========== ============================================== ==========================================
sidecar    the caller's sidecar                            the callee's sidecar
node-l4    the node proxy of the caller's node             the node proxy of the callee's node, unless
                                                          the caller's node proxy was that one (an
                                                          intra-node call crosses one node proxy)
waypoint   as node-l4                                      as node-l4, plus the callee's waypoint
none       nothing                                         nothing
========== ============================================== ==========================================

Which model prices each role: a **sidecar** is the service's own config (mode, filters, mTLS);
a **node proxy** is L4 — the service's profile in **tcp mode**, with mTLS when the service has
it, no L7 filters (a node-l4 role priced from an Envoy tcp-mode sidecar profile is a stand-in
for ztunnel, not ztunnel: ztunnel is a different proxy, in Rust, with HBONE tunnels); a
**waypoint** is L7 — the callee's mode, filters and mTLS. Every role is priced from the
profile of the service it serves (its ``platform``, else the prediction's profile) — unless a
profile measured in that role is given (``roles``, ``meshtax profile --architecture``): then
every node-proxy crossing is priced from the node-l4 profile, plaintext within a node and with
its ``tls`` component (what an inter-node crossing adds: mTLS between the node proxies, the
link) across nodes, and every waypoint crossing from the waypoint profile in the callee's mode
(its mTLS legs inside its components).

Nodes: a service's ``node`` (ECG ``node:``, traces' ``k8s.node.name``/``host.name``); the
others are placed by name, ``pods_per_node`` to a node (1: a node each, so every call between
two of them is inter-node). CPU is summed over every proxy crossed; latency adds each call's
crossings and recomputes the critical path (:func:`~meshtax.predict.engine.predict_batch`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from meshtax.errors import PredictError
from meshtax.model.ecg import EcgBatch, SidecarSpec
from meshtax.model.sidecar import Architecture, Mode, SidecarConfig
from meshtax.model.speed import Speed
from meshtax.predict.engine import BatchPrediction, Costs, ProfileLookup, hop_costs, predict_batch

__all__ = [
    "ArchitectureError",
    "Arranged",
    "architecture_costs",
    "architecture_of",
    "arrange",
    "l4_config",
    "parse_architectures",
    "place_nodes",
    "predict_architecture",
    "role_specs",
    "waypoint_config",
]

IntArray = npt.NDArray[np.int64]
_PROXIED = (Architecture.NODE_L4, Architecture.WAYPOINT)


class ArchitectureError(PredictError):
    """An architecture name or placement that cannot be used."""


def parse_architectures(text: str) -> tuple[Architecture, ...]:
    """``sidecar,node-l4`` → the architectures, in order, each once."""
    out: list[Architecture] = []
    for part in (p.strip() for p in text.split(",")):
        try:
            a = Architecture(part)
        except ValueError:
            ok = ", ".join(x.value for x in Architecture)
            raise ArchitectureError(f"unknown architecture {part!r}; expected {ok}") from None
        if a not in out:
            out.append(a)
    if not out:
        raise ArchitectureError("no architecture given")
    return tuple(out)


def architecture_of(
    sidecar: SidecarConfig | None, own: Architecture | str | None, default: Architecture
) -> Architecture:
    """A service's architecture: none without a sidecar, else its own, else ``default``."""
    if sidecar is None or not sidecar.meshed:
        return Architecture.NONE
    if own:
        return Architecture(own)
    if sidecar.architecture is not Architecture.SIDECAR:
        return sidecar.architecture
    return default


def place_nodes(
    names: Iterable[str], nodes: Mapping[str, str | None], pods_per_node: int = 1
) -> dict[str, str]:
    """Every service's node: its own, else ``pods_per_node`` services (by name) to a node
    named ``~<k>``."""
    if pods_per_node < 1:
        raise ArchitectureError(f"pods_per_node must be at least 1, got {pods_per_node}")
    out: dict[str, str] = {}
    unplaced = sorted(n for n in names if nodes.get(n) is None)
    for k, n in enumerate(unplaced):
        out[n] = f"~{k // pods_per_node}"
    for n, node in nodes.items():
        if node is not None:
            out[n] = node
    return out


def l4_config(cfg: SidecarConfig) -> SidecarConfig:
    """The node proxy's role for a service: L4 (tcp mode), its mTLS, no L7 filters."""
    return SidecarConfig(
        mode=Mode.TCP,
        mtls=cfg.mtls,
        tls_version=cfg.tls_version,
        architecture=Architecture.NODE_L4,
    )


def role_specs(
    cfg: SidecarConfig, platform: str | None, roles: Mapping[Architecture, str]
) -> tuple[SidecarSpec, SidecarSpec]:
    """A service's node-proxy crossing within its node and across nodes. Priced from a
    sidecar profile (no role profile): both :func:`l4_config` of the service (its mTLS, as
    given). Priced from a node-l4 profile (``roles``): plaintext within the node, mTLS across
    nodes — that profile's ``tls`` component is what an inter-node crossing adds."""
    node = roles.get(Architecture.NODE_L4)
    if node is None:
        spec = SidecarSpec(l4_config(cfg), platform)
        return spec, spec
    plain = SidecarConfig(mode=Mode.TCP, architecture=Architecture.NODE_L4)
    return SidecarSpec(plain, node), SidecarSpec(replace(plain, mtls=True), node)


def waypoint_config(cfg: SidecarConfig) -> SidecarConfig:
    """The waypoint's role for a destination service: L7 in its mode, filters and mTLS."""
    return replace(cfg, architecture=Architecture.WAYPOINT)


@dataclass(frozen=True)
class Arranged:
    """A batch's crossings under one architecture: ``batch`` has the caller's and callee's
    side of every row (specs of the roles), ``waypoint`` the callee's waypoint crossing (its
    caller side empty; None when no call has one). ``nodes``: the node of every service;
    ``architectures``: every service's."""

    architecture: Architecture
    batch: EcgBatch
    waypoint: EcgBatch | None
    nodes: Mapping[str, str]
    architectures: Mapping[str, Architecture]

    @property
    def n_nodes(self) -> int:
        """Nodes with a node proxy (some service on them is node-l4 or waypoint)."""
        return len({self.nodes[s] for s, a in self.architectures.items() if a in _PROXIED})


def arrange(
    batch: EcgBatch,
    default: Architecture | str,
    pods_per_node: int = 1,
    roles: Mapping[Architecture, str] | None = None,
) -> Arranged:
    """The crossings of every row of ``batch`` when ``default`` meshes the services that do
    not choose (see the module docstring). ``roles``: the profile (platform name) that prices
    the node proxy and the waypoint, measured in that role (:func:`role_specs`)."""
    roles = roles or {}
    default = Architecture(default)
    S = len(batch.services)
    spec_of = _service_specs(batch)
    own = batch.service_arch or ("",) * S
    cfgs = [batch.specs[k].config if k >= 0 else None for k in spec_of]
    arch = [architecture_of(cfgs[i], own[i], default) for i in range(S)]
    explicit = {
        name: (
            batch.node_names[int(batch.service_node[i])]
            if batch.service_node is not None and batch.service_node[i] >= 0
            else None
        )
        for i, name in enumerate(batch.services)
    }
    nodes = place_nodes(batch.services, explicit, pods_per_node)
    node_ix = {n: k for k, n in enumerate(dict.fromkeys(nodes[s] for s in batch.services))}
    node = np.asarray([node_ix[nodes[s]] for s in batch.services] + [-1], dtype=np.int64)

    specs: dict[SidecarSpec, int] = {}

    def add(spec: SidecarSpec) -> int:
        return specs.setdefault(spec, len(specs))

    out_spec = np.full(S + 1, -1, dtype=np.int64)  # caller side; last slot: external
    in_spec = np.full(S + 1, -1, dtype=np.int64)  # callee side
    way_spec = np.full(S + 1, -1, dtype=np.int64)
    # a node proxy profiled in its role: plaintext within a node, its mTLS across nodes
    out_far = np.full(S + 1, -1, dtype=np.int64)
    in_far = np.full(S + 1, -1, dtype=np.int64)
    for i in range(S):
        cfg, a = cfgs[i], arch[i]
        if cfg is None or a is Architecture.NONE:
            continue
        plat = batch.specs[int(spec_of[i])].platform
        if a is Architecture.SIDECAR:
            out_spec[i] = in_spec[i] = out_far[i] = in_far[i] = add(
                SidecarSpec(replace(cfg, architecture=Architecture.SIDECAR), plat)
            )
            continue
        near, far = role_specs(cfg, plat, roles)
        out_spec[i] = in_spec[i] = add(near)
        out_far[i] = in_far[i] = add(far)
        if a is Architecture.WAYPOINT:
            way = roles.get(Architecture.WAYPOINT)
            wcfg = waypoint_config(cfg)
            way_spec[i] = add(
                SidecarSpec(wcfg, plat)
                if way is None
                # its mTLS legs are inside the measured components
                else SidecarSpec(replace(wcfg, mtls=False, tls_version=None), way)
            )
    caller, callee = batch.caller, batch.callee  # -1 (external) indexes the last slot
    a_arr = np.asarray([a in _PROXIED for a in arch] + [False])
    inter = (node[caller] != node[callee]) & (caller >= 0)
    caller_spec = np.where(inter, out_far[caller], out_spec[caller])
    callee_spec = np.where(inter, in_far[callee], in_spec[callee])
    # an intra-node call between two node-proxied services crosses that node's proxy once
    same = a_arr[caller] & a_arr[callee] & (node[caller] == node[callee]) & (caller >= 0)
    callee_spec[same] = -1
    spec_tuple = tuple(specs)
    main = replace(batch, caller_spec=caller_spec, callee_spec=callee_spec, specs=spec_tuple)
    wp = way_spec[callee]
    waypoint = None
    if (wp >= 0).any():
        waypoint = replace(
            batch, caller_spec=np.full_like(wp, -1), callee_spec=wp, specs=spec_tuple
        )
    return Arranged(default, main, waypoint, nodes, dict(zip(batch.services, arch, strict=True)))


def _service_specs(batch: EcgBatch) -> IntArray:
    """Each service's spec index (-1: no sidecar), from the rows it appears in."""
    out = np.full(len(batch.services), -1, dtype=np.int64)
    for svc, spec in ((batch.caller, batch.caller_spec), (batch.callee, batch.callee_spec)):
        ok = svc >= 0
        out[svc[ok]] = spec[ok]
    return out


def _add(a: Costs, b: Costs) -> Costs:
    comps = tuple(sorted(set(a.components) | set(b.components)))

    def widen(c: Costs, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        out = np.zeros((x.shape[0], len(comps)))
        for k, comp in enumerate(c.components):
            out[:, comps.index(comp)] = x[:, k]
        return out

    def both(name: str) -> npt.NDArray[np.float64]:
        return widen(a, getattr(a, name)) + widen(b, getattr(b, name))

    return Costs(
        comps,
        both("latency_caller"),
        both("latency_callee"),
        both("cpu_caller"),
        both("cpu_callee"),
        a.latency_se + b.latency_se,
        a.cpu_se + b.cpu_se,
        tuple(dict.fromkeys((*a.warnings, *b.warnings))),
    )


def architecture_costs(
    arranged: Arranged, profiles: ProfileLookup, *, speed: Speed | None = None
) -> Costs:
    """Every crossing of every row under the arranged architecture, per component; the
    waypoint's on the callee's side."""
    costs = hop_costs(arranged.batch, profiles, speed=speed)
    if arranged.waypoint is not None:
        costs = _add(costs, hop_costs(arranged.waypoint, profiles, speed=speed))
    return costs


def predict_architecture(
    batch: EcgBatch,
    profiles: ProfileLookup,
    architecture: Architecture | str,
    *,
    pods_per_node: int = 1,
    pod_cpus: int | None = None,
    speed: Speed | None = None,
    roles: Mapping[Architecture, str] | None = None,
) -> tuple[Arranged, BatchPrediction]:
    """:func:`~meshtax.predict.engine.predict_batch` with the crossings of ``architecture``.
    Sidecars only (every service ``sidecar`` or ``none``): exactly ``predict_batch``, shared
    CPUs priced as there. With node proxies or waypoints, ``pod_cpus`` bounds latency by the
    shared CPUs' work as there, and messages are priced at each call's own rate (a node proxy
    is not a pod's sidecar sharing its CPUs)."""
    arranged = arrange(batch, architecture, pods_per_node, roles)
    if all(a in (Architecture.SIDECAR, Architecture.NONE) for a in arranged.architectures.values()):
        return arranged, predict_batch(arranged.batch, profiles, pod_cpus=pod_cpus, speed=speed)
    costs = architecture_costs(arranged, profiles, speed=speed)
    return arranged, predict_batch(batch, profiles, costs=costs, pod_cpus=pod_cpus)
