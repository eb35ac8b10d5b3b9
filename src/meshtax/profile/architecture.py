"""Profiles of Envoy in a sidecarless role (``meshtax profile --architecture node-l4|waypoint``):
the bed, what the profile must measure besides the one-hop modes, and what it records.

The modes are measured exactly as a sidecar's (:func:`~meshtax.profile.run.run_profile`), on
the node bed (:mod:`meshtax.testbed.nodebed`):

* **node-l4**: the node proxy on the intra-node path (client → node proxy → server, one
  crossing each way, plaintext) in tcp mode, carrying HTTP and gRPC; the components are per
  crossing of one node proxy, as a sidecar's, with one difference: the pod ↔ proxy legs are
  veth, not loopback, so their delivery stays inside Read/Write (IPC holds the interception
  alone: the probe times loopback delivery). Then the **inter-node** step
  (:func:`measure_internode`): paired runs of the intra-node and the inter-node path (client →
  node proxy a ─mTLS→ node proxy b → server) with their direct paths, so what an inter-node
  crossing adds — mTLS between the proxies and the link — is
  ``((inter − inter direct) − 2·(intra − intra direct)) / 4`` per crossing (four crossings
  inter-node, two intra), latency and both proxies' CPU alike; it becomes the tcp mode's
  ``tls`` component (TLS 1.3), which the predictor adds to inter-node crossings. Those runs are
  closed-loop (a warm CPU); the proxies' CPU is also measured at the plan's low rates (fixed
  request rates, the smallest size), so the CPU model gets a rate term as the other
  components do: an mTLS crossing at 100/s costs more than at several thousand.
* **waypoint**: the waypoint (on the server's node, inter-node from the client) against the
  node-l4 path of the same pods: meshed − direct is what the waypoint adds, its own work plus
  the node proxies' change (they count as the app does); per crossing of the waypoint. Its
  mTLS legs are in its components (no separate ``tls`` component).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from meshtax.model.components import TLS
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.profile import Profile
from meshtax.model.proxy import ProxyChoice, ProxyError
from meshtax.model.sidecar import Architecture, Mode
from meshtax.model.stats import Estimate, estimate
from meshtax.profile.plan import CARRIED_PROTOCOLS, Plan
from meshtax.testbed.bed import OneHop, echo_testbed
from meshtax.testbed.envoy.config import config_hash
from meshtax.testbed.envoy.roles import NodeProxyConfig, WaypointRoute, waypoint_key
from meshtax.testbed.nodebed import NodeBed, describe, node_testbed
from meshtax.testbed.paired import PairPolicy, paired_runs
from meshtax.testbed.pinning import Pinning
from meshtax.testbed.pods import Testbed

__all__ = [
    "ARCHITECTURE_MODES",
    "ROLE_NOTES",
    "InternodeResult",
    "measure_internode",
    "one_hop_bed",
    "role_hash",
    "role_plan",
    "with_internode",
]

#: the modes (and carried protocols) each role is profiled in
ARCHITECTURE_MODES: Mapping[Architecture, tuple[Mode, ...]] = {
    Architecture.NODE_L4: (Mode.TCP,),
    Architecture.WAYPOINT: (Mode.TCP, Mode.HTTP, Mode.GRPC),
}
#: what a profile of each role says about its measurement
ROLE_NOTES: Mapping[Architecture, tuple[str, ...]] = {
    Architecture.NODE_L4: (
        "node-l4: Envoy as a per-node L4 proxy (tcp_proxy, mTLS between nodes; a stand-in "
        "for ztunnel, not ztunnel), measured on the intra-node path (client pod → node proxy "
        "→ server pod, one crossing each way): models per crossing of one node proxy",
        "node-l4: the pod ↔ node proxy legs are veth, not loopback: their delivery stays in "
        "Read/Write (IPC holds the interception in the node alone)",
    ),
    Architecture.WAYPOINT: (
        "waypoint: Envoy as a waypoint (a shared L7 proxy on the server's node, mTLS on both "
        "legs) measured against the node-l4 path of the same pods (client on another node): "
        "models per crossing of the waypoint = its own work + the node proxies' change (they "
        "count as the app does); its mTLS is inside the components",
    ),
}
_RUNS = ("direct_intra", "meshed_intra", "direct_inter", "meshed_inter")


def role_plan(
    p: Plan,
    changes: dict[str, Any],
    architecture: Architecture | str,
    proxy: ProxyChoice,
    carried_default: bool,
) -> dict[str, Any]:
    """``changes`` to the plan ``p`` for profiling ``architecture``'s role (none for a
    sidecar): its modes only, no capacity; node-l4 carries HTTP and gRPC as fully as its mode
    (``carried_default``: the caller left the carried protocols to the preset)."""
    arch = Architecture(architecture)
    if arch is Architecture.SIDECAR:
        return changes
    if proxy.kind != "envoy" or proxy.variant:
        raise ProxyError(f"--architecture {arch.value} profiles Envoy in that role")
    ok = ARCHITECTURE_MODES.get(arch)
    if ok is None:
        raise ProxyError(f"nothing to profile for architecture {arch.value}")
    modes = tuple(m for m in changes.get("modes", p.modes) if m in ok)
    if not modes:
        raise ProxyError(f"{arch.value} runs {', '.join(m.value for m in ok)} mode only")
    out = {**changes, "modes": modes, "capacity": False}
    if arch is Architecture.NODE_L4:
        # an L4 proxy's http and grpc are carried: measured as fully as its mode
        if carried_default:
            out["carried"] = CARRIED_PROTOCOLS
        out.update(carried_all_sizes=True, carried_probe_pairs=p.probe_pairs)
    return out


@contextmanager
def one_hop_bed(
    tb: Testbed,
    pinning: Pinning,
    architecture: Architecture,
    *,
    envoy_bin: Path | None,
    fortio_bin: Path,
    proxy: ProxyChoice,
    proxy_bin: Path | None,
) -> Iterator[OneHop]:
    """The bed a profile of ``architecture`` measures on: the echo bed for a sidecar, the
    node bed for a node proxy or a waypoint."""
    if architecture is Architecture.SIDECAR:
        with echo_testbed(
            tb,
            pinning,
            envoy_bin=envoy_bin,
            fortio_bin=fortio_bin,
            proxy=proxy,
            proxy_bin=proxy_bin,
        ) as bed:
            yield bed
    else:
        with node_testbed(
            tb, pinning, architecture, envoy_bin=envoy_bin, fortio_bin=fortio_bin
        ) as nbed:
            yield nbed


def role_hash(architecture: Architecture) -> str:
    """The platform's config key: the role's configs in every mode, no addresses or keys."""
    tls = {"on": True}
    node = NodeProxyConfig("10.0.0.0/24", tls, tls).key()
    if architecture is Architecture.NODE_L4:
        return config_hash({"node-l4": node})
    with_wp = NodeProxyConfig(
        "10.0.0.0/24", tls, tls, tls, (WaypointRoute("10.0.0.1", 1, ("10.0.0.2", 1)),)
    ).key()
    return config_hash(
        {"waypoint": {m.value: waypoint_key(m) for m in Mode}, "node-proxy": with_wp}
    )


@dataclass(frozen=True)
class InternodeResult:
    """Per size, per request: the intra- and inter-node overheads and what one inter-node
    crossing adds (latency µs, CPU-µs of both node proxies), every round a sample."""

    sizes: tuple[int, ...]
    intra_us: Mapping[int, Estimate]
    inter_us: Mapping[int, Estimate]
    tls_latency_us: Mapping[int, Estimate]
    tls_cpu_us: Mapping[int, Estimate]
    bed: Mapping[str, Any]
    #: the closed-loop runs' request rates, per size (one per sample of ``tls_cpu_us``)
    closed_rates: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    #: CPU per crossing at fixed request rates: (size, rate requested, rate achieved) → samples
    low_rate_cpu_us: Mapping[tuple[int, float], Estimate] = field(default_factory=dict)
    low_rate_achieved: Mapping[tuple[int, float], float] = field(default_factory=dict)

    def model(self) -> ComponentModel:
        """The ``tls`` component per crossing over sizes (and, with the low-rate runs, rate)."""
        sizes = [float(s) for s in self.sizes for _ in self.tls_latency_us[s].samples]
        lat = [x for s in self.sizes for x in self.tls_latency_us[s].samples]
        cpu_sizes = [float(s) for s in self.sizes for _ in self.tls_cpu_us[s].samples]
        cpu = [x for s in self.sizes for x in self.tls_cpu_us[s].samples]
        note = (
            "what an inter-node crossing adds over an intra-node one (mTLS 1.3 between node "
            "proxies, the link): ((inter − inter direct) − 2·(intra − intra direct)) / 4"
        )
        rates: list[float] | None = None
        if self.low_rate_cpu_us and all(
            len(self.closed_rates.get(s, ())) == len(self.tls_cpu_us[s].samples) for s in self.sizes
        ):
            rates = [r for s in self.sizes for r in self.closed_rates[s]]
            for (size, rate), est in self.low_rate_cpu_us.items():
                got = self.low_rate_achieved.get((size, rate), rate)
                cpu_sizes += [float(size)] * len(est.samples)
                cpu += list(est.samples)
                rates += [got] * len(est.samples)
        return ComponentModel(
            CostModel.fit(sizes, lat, note=note + " (latency)"),
            CostModel.fit(cpu_sizes, cpu, rates=rates, note=note + " (both node proxies' CPU)"),
        )

    def to_dict(self) -> dict[str, Any]:
        def d(m: Mapping[int, Estimate]) -> dict[str, Any]:
            return {str(s): e.to_dict() for s, e in m.items()}

        return {
            "sizes": list(self.sizes),
            "intra_overhead_us_per_request": d(self.intra_us),
            "inter_overhead_us_per_request": d(self.inter_us),
            "tls_latency_us_per_crossing": d(self.tls_latency_us),
            "tls_cpu_us_per_crossing": d(self.tls_cpu_us),
            "closed_loop_rates": {str(s): list(r) for s, r in self.closed_rates.items()},
            "tls_cpu_us_per_crossing_at_rate": [
                {
                    "size": size,
                    "rate": rate,
                    "achieved": self.low_rate_achieved.get((size, rate)),
                    **est.to_dict(),
                }
                for (size, rate), est in self.low_rate_cpu_us.items()
            ],
            "bed": dict(self.bed),
        }


def measure_internode(
    bed: NodeBed,
    plan: Plan,
    cpu_ns: Callable[[int], Mapping[int, int]],
    *,
    rounds: int = 4,
    sizes: Sequence[int] | None = None,
) -> InternodeResult:
    """Paired closed-loop runs of the intra- and inter-node paths and their direct paths
    (tcp, the plan's sizes), the node proxies' CPU from ``cpu_ns`` (schedstat per thread);
    then, at each of the plan's low rates and its smallest size, paired fixed-rate runs of the
    two meshed paths (at least 200 requests a run) for the CPU's rate term."""
    sizes = tuple(sizes or plan.sizes)
    targets = {
        "direct_intra": bed.direct_target(Mode.TCP, "intra"),
        "meshed_intra": bed.target("intra"),
        "direct_inter": bed.direct_target(Mode.TCP, "inter"),
        "meshed_inter": bed.target("inter"),
    }
    intra: dict[int, Estimate] = {}
    inter: dict[int, Estimate] = {}
    lat: dict[int, Estimate] = {}
    cpu: dict[int, Estimate] = {}
    closed: dict[int, tuple[float, ...]] = {}
    low: dict[tuple[int, float], Estimate] = {}
    achieved: dict[tuple[int, float], float] = {}
    roles = bed.start_sidecar(Mode.TCP, name="internode")
    pids = (roles.pid, *bed.path_pids)

    def measured(name: str, size: int, qps: float, duration_s: float) -> tuple[float, float, float]:
        """(mean µs, proxies' CPU-µs per request, requests/s achieved) of one run."""
        before = sum(sum(cpu_ns(p).values()) for p in pids)
        r = bed.load(targets[name], Mode.TCP, size, duration_s=duration_s, qps=qps)
        after = sum(sum(cpu_ns(p).values()) for p in pids)
        rate = r.count / duration_s if duration_s > 0 else 0.0
        return r.avg_us, (after - before) * 1e-3 / max(r.count, 1), rate

    try:
        for size in sizes:
            for t in targets.values():
                bed.load(t, Mode.TCP, size, n=plan.warmup_n)
            rates_seen: list[float] = []

            def run(
                name: str, size: int = size, seen: list[float] = rates_seen
            ) -> tuple[float, float]:
                avg, c, rate = measured(name, size, 0.0, plan.latency_run_s)
                if name == "meshed_inter":
                    seen.append(rate)
                return avg, c

            paired = paired_runs([_RUNS], run, PairPolicy.fixed(rounds))
            got: dict[str, list[tuple[float, float]]] = {n: [] for n in _RUNS}
            for g in paired.groups:
                for n in _RUNS:
                    got[n].append(g.runs[n][0])
            a = [m[0] - d[0] for d, m in zip(got["direct_intra"], got["meshed_intra"])]
            b = [m[0] - d[0] for d, m in zip(got["direct_inter"], got["meshed_inter"])]
            intra[size], inter[size] = estimate(a), estimate(b)
            lat[size] = estimate([(y - 2 * x) / 4 for x, y in zip(a, b)])
            cpu[size] = estimate(
                [ci[1] / 4 - ca[1] / 2 for ca, ci in zip(got["meshed_intra"], got["meshed_inter"])]
            )
            closed[size] = tuple(rates_seen[-len(cpu[size].samples) :])
        small = min(sizes)
        for qps in plan.low_rates:
            dur = max(plan.low_rate_run_s, 200.0 / qps)
            pairs = [
                (
                    measured("meshed_intra", small, qps, dur),
                    measured("meshed_inter", small, qps, dur),
                )
                for _ in range(rounds)
            ]
            low[small, qps] = estimate([ci[1] / 4 - ca[1] / 2 for ca, ci in pairs])
            achieved[small, qps] = sum(ci[2] for _, ci in pairs) / len(pairs)
    finally:
        roles.stop()
    return InternodeResult(sizes, intra, inter, lat, cpu, describe(bed), closed, low, achieved)


def with_internode(profile: Profile, r: InternodeResult) -> Profile:
    """``profile`` with the inter-node crossing as its tcp mode's ``tls`` component (and the
    measurement in its record)."""
    tcp = profile.modes[Mode.TCP]
    mp = replace(tcp, components={**tcp.components, TLS: r.model()}, tls_version="1.3")
    s0 = r.sizes[0]
    note = (
        f"node-l4: an inter-node crossing adds {r.tls_latency_us[s0].median:.1f} µs and "
        f"{r.tls_cpu_us[s0].median:.1f} CPU-µs at {s0} B over an intra-node one (mTLS between "
        "the node proxies, the link): the tcp mode's tls component, priced on inter-node "
        f"crossings; overhead per request intra-node {r.intra_us[s0].median:.1f} µs, "
        f"inter-node {r.inter_us[s0].median:.1f} µs"
    )
    prov = profile.provenance
    prov = replace(
        prov,
        options={**prov.options, "internode": r.to_dict()},
        notes=(*prov.notes, note),
    )
    return replace(profile, modes={**profile.modes, Mode.TCP: mp}, provenance=prov)
