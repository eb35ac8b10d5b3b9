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

A waypoint serves callers in the mesh: a caller outside it (the load generator, ``none``) reaches
the callee's pod through its node proxy alone (Istio ambient's default, and the testbed's).
A caller in the mesh reaches it through its node proxy, mTLS to the waypoint, and mTLS from
the waypoint to the callee's node proxy — two node-proxy crossings with their mTLS even when
both pods and the waypoint share a node (the waypoint profile is measured against that path).

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
(its mTLS legs inside its components). That ``tls`` term is priced as measured, negative at
low rates included (:func:`inter_node_floor`, flooring it, failed its test: not applied).

Nodes: a service's ``node`` (ECG ``node:``, traces' ``k8s.node.name``/``host.name``); the
others are placed by name, ``pods_per_node`` to a node (1: a node each, so every call between
two of them is inter-node). CPU is summed over every proxy crossed; latency adds each call's
crossings and recomputes the critical path (:func:`~meshtax.predict.engine.predict_batch`).

Idle proxies (:func:`architecture_idle`): a graph's CPU includes, once per second, the idle
CPU of the proxies that serve its services — one per node that has a node-proxied service of
the graph, one waypoint per waypoint service, one sidecar per sidecar service — not a sidecar
per service (there is none). On shared CPUs (``pod_cpus``) the node proxies run on the pods' CPUs as sidecars do, so
their crossings are priced at the shared-CPU rate of all the graph's crossings
(:func:`~meshtax.predict.shared_cpu.shared_cpu_rates`), as a sidecar's. A waypoint's crossing
is priced at the request rate that waypoint carries itself (:func:`waypoint_rates`: the sum of
its callers' rates), shared CPUs or not: its cost is an L7 proxy's user-space work, whose
low-rate excess follows how often that one process runs, not how busy others keep the CPU
(measured: each waypoint of a validation at 100/s cost about the same per call whether its
graph loaded the CPU as a one-hop bed at 400/s or at 1 600/s; BENCHMARKS.md, issue #18, tenth
sitting); every profile's bed runs its proxy at the bed's request rate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from meshtax.errors import PredictError
from meshtax.model.components import TLS
from meshtax.model.ecg import EcgBatch, SidecarSpec
from meshtax.model.sidecar import Architecture, Mode, SidecarConfig
from meshtax.model.speed import Speed
from meshtax.predict.engine import BatchPrediction, Costs, ProfileLookup, hop_costs, predict_batch
from meshtax.predict.shared_cpu import shared_cpu_rates

__all__ = [
    "ArchitectureError",
    "Arranged",
    "architecture_costs",
    "architecture_of",
    "architecture_idle",
    "arrange",
    "inter_node_floor",
    "l4_config",
    "parse_architectures",
    "place_nodes",
    "predict_architecture",
    "role_specs",
    "waypoint_config",
    "waypoint_rates",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
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
    #: per service (batch order): the spec of its sidecar or of its node's proxy, and of its
    #: waypoint (-1: none) — the proxies whose idle CPU a graph of the service pays
    proxy_spec: IntArray | None = None
    waypoint_spec: IntArray | None = None

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
    in_mesh = np.asarray([a is not Architecture.NONE for a in arch] + [False])
    # the callee's waypoint, for callers in the mesh only
    wp = np.where(in_mesh[caller], way_spec[callee], -1)
    via_wp = wp >= 0
    # across nodes, or to and from a waypoint: the node proxies' mTLS legs
    inter = ((node[caller] != node[callee]) | via_wp) & (caller >= 0)
    caller_spec = np.where(inter, out_far[caller], out_spec[caller])
    callee_spec = np.where(inter, in_far[callee], in_spec[callee])
    # an intra-node call between two node-proxied services crosses that node's proxy once
    same = a_arr[caller] & a_arr[callee] & (node[caller] == node[callee]) & (caller >= 0)
    callee_spec[same & ~via_wp] = -1
    spec_tuple = tuple(specs)
    main = replace(batch, caller_spec=caller_spec, callee_spec=callee_spec, specs=spec_tuple)
    waypoint = None
    if via_wp.any():
        waypoint = replace(
            batch, caller_spec=np.full_like(wp, -1), callee_spec=wp, specs=spec_tuple
        )
    return Arranged(
        default,
        main,
        waypoint,
        nodes,
        dict(zip(batch.services, arch, strict=True)),
        proxy_spec=out_spec[:S].copy(),
        waypoint_spec=way_spec[:S].copy(),
    )


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


def waypoint_rates(arranged: Arranged) -> FloatArray:
    """Per row of ``arranged.waypoint``, the request rate its waypoint carries: the sum of the
    rates of the graph's rows through the same waypoint (a row without one: its own rate)."""
    w = arranged.waypoint
    if w is None:
        return np.zeros(0)
    via = w.callee_spec >= 0
    key = w.graph_of() * (len(w.services) + 1) + np.maximum(w.callee, 0)
    _, inv = np.unique(np.where(via, key, -1), return_inverse=True)
    total = np.bincount(inv, weights=np.where(via, w.rate, 0.0))
    return np.asarray(np.where(via, total[inv], w.rate), dtype=np.float64)


def inter_node_floor(batch: EcgBatch, costs: Costs) -> Costs:
    """``costs`` with the node proxies' ``tls`` term (what an inter-node or waypoint leg adds:
    mTLS, the link) at 0 wherever it was priced below 0, latency and CPU, each side.

    A node-l4 profile measures it as (inter-node path − 2 × intra-node path) per crossing at
    one request rate, where the inter-node path's CPU carries twice the crossings: warmer, each
    crossing cheaper (the low-rate excess of :mod:`~meshtax.predict.shared_cpu`). At low rates
    that comes out negative (−4.6 CPU-µs a crossing at 100/s in ``s10-nl4``, every sample of it
    below 0), and the engine already prices that warmth through the shared-CPU rate: encryption
    and a link do not save CPU. Not applied by :func:`architecture_costs`: on the eleventh
    sitting's fresh run it made node-l4's and the waypoint's errors worse (BENCHMARKS.md, issue
    #18, eleventh sitting); kept for ``experiments/inter_node_floor.py``."""
    if TLS not in costs.components:
        return costs
    k = costs.components.index(TLS)
    out = {}
    for name, spec_col in (
        ("latency_caller", batch.caller_spec),
        ("latency_callee", batch.callee_spec),
        ("cpu_caller", batch.caller_spec),
        ("cpu_callee", batch.callee_spec),
    ):
        node = np.asarray(
            [
                j >= 0 and batch.specs[j].config.architecture is Architecture.NODE_L4
                for j in spec_col.tolist()
            ],
            dtype=bool,
        )
        x = getattr(costs, name).copy()
        x[node, k] = np.maximum(x[node, k], 0.0)
        out[name] = x
    return replace(costs, **out)


def architecture_costs(
    arranged: Arranged,
    profiles: ProfileLookup,
    *,
    speed: Speed | None = None,
    pod_cpus: int | None = None,
) -> Costs:
    """Every crossing of every row under the arranged architecture, per component; the
    waypoint's on the callee's side, at the rate its waypoint carries (:func:`waypoint_rates`).
    ``pod_cpus``: the other proxies share the pods' CPUs, their crossings priced at the
    shared-CPU rate of all the graph's crossings (each call's own rate without)."""
    rates = None
    if pod_cpus is not None:
        rates = shared_cpu_rates(arranged.batch, pod_cpus, also=arranged.waypoint)
    costs = hop_costs(arranged.batch, profiles, rates=rates, speed=speed)
    if arranged.waypoint is not None:
        way = waypoint_rates(arranged)
        costs = _add(costs, hop_costs(arranged.waypoint, profiles, rates=way, speed=speed))
    return costs


def architecture_idle(
    arranged: Arranged, profiles: ProfileLookup
) -> tuple[FloatArray | None, FloatArray | None]:
    """(per service, per graph) vCPU of the idle proxies (see the module docstring): per graph,
    each node's proxy once (the nodes of its node-proxied services), each of its services'
    waypoints and sidecars once; per service, its own waypoint or sidecar, else its node's
    proxy. (None, None) when no profile measured an idle proxy."""
    b = arranged.batch
    S, G = len(b.services), b.n_graphs
    prox = arranged.proxy_spec if arranged.proxy_spec is not None else np.full(S, -1)
    way = arranged.waypoint_spec if arranged.waypoint_spec is not None else np.full(S, -1)

    def idle(spec: int) -> float:
        if spec < 0:
            return 0.0
        sp = b.specs[spec]
        try:
            v = profiles(sp.platform).mode(sp.config.mode).idle_cpu_us_per_s
        except KeyError:  # a mode the profile lacks: hop_costs says so
            v = None
        return 0.0 if v is None else v * 1e-6

    per_svc = np.asarray([idle(int(k)) for k in prox])
    per_way = np.asarray([idle(int(k)) for k in way])
    if not (per_svc.any() or per_way.any()):
        return None, None
    g = b.graph_of()
    graph = np.zeros(G)
    seen: set[tuple[int, str]] = set()
    for who in (b.caller, b.callee):
        for gi, si in zip(g[who >= 0].tolist(), who[who >= 0].tolist(), strict=True):
            name = b.services[si]
            proxied = arranged.architectures[name] in _PROXIED
            # a node's proxy is one per node; a sidecar or a waypoint one per service
            key = (gi, "node:" + arranged.nodes[name] if proxied else "svc:" + name)
            if key not in seen:
                seen.add(key)
                graph[gi] += per_svc[si]
            if (gi, "wp:" + name) not in seen:
                seen.add((gi, "wp:" + name))
                graph[gi] += per_way[si]
    return np.where(per_way > 0, per_way, per_svc), graph


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
    shared CPUs' work and prices every crossing at the shared-CPU rate, as there; the idle
    CPU is the proxies' that exist (:func:`architecture_idle`), not a sidecar per service."""
    arranged = arrange(batch, architecture, pods_per_node, roles)
    if all(a in (Architecture.SIDECAR, Architecture.NONE) for a in arranged.architectures.values()):
        return arranged, predict_batch(arranged.batch, profiles, pod_cpus=pod_cpus, speed=speed)
    costs = architecture_costs(arranged, profiles, speed=speed, pod_cpus=pod_cpus)
    idle = architecture_idle(arranged, profiles)
    return arranged, predict_batch(
        batch, profiles, costs=costs, pod_cpus=pod_cpus, idle_override=idle
    )
