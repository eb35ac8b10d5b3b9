"""Pricing per mesh architecture on hand-computed graphs: which proxies a call crosses (sidecar,
node-l4 intra- and inter-node, waypoint, none, mixed), the roles' models (tcp for node
proxies, mTLS carried, the callee's L7 for waypoints), node placement and memory."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from meshtax.model.components import OTHER, PARSING, READ, TLS
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.ecg import ECG, Service, to_batch, validate
from meshtax.model.profile import ModeProfile
from meshtax.model.sidecar import NO_SIDECAR, Architecture, Mode, SidecarConfig
from meshtax.predict.architecture import (
    ArchitectureError,
    architecture_costs,
    arrange,
    inter_node_floor,
    parse_architectures,
    place_nodes,
    predict_architecture,
    waypoint_rates,
)
from meshtax.predict.engine import predict_batch, single_profile
from meshtax.predict.memory import memory_by_architecture
from tests.helpers import EXTERNAL, flat, inv, profile

# per message: tcp 10 µs / 20 CPU-µs; http 10 + 30 = 40 µs / 20 + 40 = 60 CPU-µs; TLS 5 / 7
P = profile(
    {
        Mode.TCP: {READ: flat(10, 20), TLS: flat(5, 7)},
        Mode.HTTP: {READ: flat(10, 20), PARSING: flat(30, 40)},
    }
)
LOOK = single_profile(P)
HTTP = SidecarConfig(Mode.HTTP)
SIDECAR, L4, WAY, NONE = (
    Architecture.SIDECAR,
    Architecture.NODE_L4,
    Architecture.WAYPOINT,
    Architecture.NONE,
)


def chain(
    a_node: str | None = "n1",
    b_node: str | None = "n1",
    a: Service | None = None,
    b: Service | None = None,
) -> ECG:
    """external → A (0–100 µs) → B (10–60 µs), 100 B each way, 1000/s."""
    services = {
        "A": a or Service("A", HTTP, node=a_node),
        "B": b or Service("B", HTTP, node=b_node),
    }
    return validate(
        "g",
        services,
        [inv("r", EXTERNAL, "A", 0, 100), inv("c", "A", "B", 10, 50, parent="r")],
    )


def overhead(
    g: ECG, arch: Architecture, pods_per_node: int = 1
) -> tuple[float, float, list[float]]:
    """(latency µs, vCPU, per-row latency) of one graph under ``arch``."""
    _, p = predict_architecture(to_batch([g]), LOOK, arch, pods_per_node=pods_per_node)
    rows = list(p.row_latency_caller_us + p.row_latency_callee_us)
    return float(p.latency_overhead_us[0]), float(p.cpu_vcpu[0]), rows


@pytest.mark.parametrize(
    ("arch", "a_node", "b_node", "rows", "cpu"),
    [
        # A's and B's sidecars, http: 2 × 40 µs per crossing
        (SIDECAR, "n1", "n2", [80, 160], (120 + 240) * 1e-3),
        # one node proxy, tcp: 2 × 10 µs; intra-node A → B crosses it once
        (L4, "n1", "n1", [20, 20], (40 + 40) * 1e-3),
        # inter-node: A's node proxy and B's
        (L4, "n1", "n2", [20, 40], (40 + 80) * 1e-3),
        # plus the callee's waypoint (http: 2 × 40 µs, 2 × 60 CPU-µs) for a caller in the mesh;
        # the client outside it reaches A through A's node proxy alone
        (WAY, "n1", "n2", [20, 120], (40 + 80 + 120) * 1e-3),
        # to and from B's waypoint: the node proxy twice, even within a node
        (WAY, "n1", "n1", [20, 120], (40 + 80 + 120) * 1e-3),
        (NONE, "n1", "n2", [0, 0], 0.0),
    ],
)
def test_crossings_per_architecture(
    arch: Architecture, a_node: str, b_node: str, rows: list[float], cpu: float
) -> None:
    lat, vcpu, per_row = overhead(chain(a_node, b_node), arch)
    assert per_row == pytest.approx(rows)
    assert lat == pytest.approx(sum(rows))  # B's call is on A's critical path
    assert vcpu == pytest.approx(cpu)


def test_sidecar_architecture_is_todays_prediction() -> None:
    g = chain("n1", "n2")
    b = to_batch([g])
    today = predict_batch(b, LOOK)
    _, p = predict_architecture(b, LOOK, SIDECAR)
    assert p.latency_overhead_us == pytest.approx(today.latency_overhead_us)
    assert p.cpu_vcpu == pytest.approx(today.cpu_vcpu)


def test_a_service_choice_overrides_the_default() -> None:
    # A keeps its sidecar, B follows the default node-l4: A's sidecar 80 + B's node proxy 20
    a = Service("A", HTTP, node="n1", architecture=SIDECAR)
    _, _, rows = overhead(chain(a=a), L4)
    assert rows == pytest.approx([80, 100])
    # a sidecar config asking for a waypoint keeps it under a node-l4 default
    b = Service("B", SidecarConfig(Mode.HTTP, architecture=WAY), node="n1")
    _, _, rows = overhead(chain(b=b), L4)
    assert rows == pytest.approx([20, 40 + 80])  # via B's waypoint: the node proxy twice
    # a service without a sidecar opts out of every architecture
    b = Service("B", NO_SIDECAR, node="n2")
    for arch in (SIDECAR, L4, WAY):
        _, _, rows = overhead(chain(b=b), arch)
        assert rows[1] == pytest.approx({SIDECAR: 80, L4: 20, WAY: 20}[arch])


def test_node_proxy_is_l4_with_the_services_mtls() -> None:
    mtls = SidecarConfig(Mode.HTTP, mtls=True)
    g = chain(a=Service("A", mtls, node="n1"), b=Service("B", mtls, node="n2"))
    # tcp + TLS per message: 2 × (10 + 5) per node proxy
    assert overhead(g, L4)[2] == pytest.approx([30, 60])
    arranged = arrange(to_batch([g]), L4)
    cfgs = {s.config for s in arranged.batch.specs}
    assert cfgs == {SidecarConfig(Mode.TCP, mtls=True, architecture=L4)}
    # the profile has no http TLS model: the waypoint's mTLS is warned about, not guessed
    _, p = predict_architecture(to_batch([g]), LOOK, WAY)
    assert any("no TLS model in http mode" in w for w in p.warnings)


def test_unplaced_services_are_placed_by_name_pods_per_node() -> None:
    assert place_nodes(["b", "a", "c"], {"a": None, "b": None, "c": "x"}, 2) == {
        "a": "~0",
        "b": "~0",
        "c": "x",
    }
    g = chain(None, None)
    # one pod per node (the default): A → B is inter-node; two: intra-node
    assert overhead(g, L4)[2] == pytest.approx([20, 40])
    assert overhead(g, L4, pods_per_node=2)[2] == pytest.approx([20, 20])
    assert arrange(to_batch([g]), L4, 2).n_nodes == 1
    with pytest.raises(ArchitectureError, match="pods_per_node must be at least 1"):
        place_nodes(["a"], {}, 0)


def test_parse_architectures() -> None:
    assert parse_architectures("sidecar, node-l4,sidecar") == (SIDECAR, L4)
    with pytest.raises(ArchitectureError, match="unknown architecture 'ambient'; expected"):
        parse_architectures("sidecar,ambient")


def test_memory_per_architecture() -> None:
    # sidecar memory M + n·m: tcp 10 MB + 1 kB per connection, http 20 MB + 2 kB
    base = {OTHER: flat(1, 1)}
    mem = replace(
        P,
        modes={
            Mode.TCP: ModeProfile(Mode.TCP, base, memory=CostModel(10e6, 1e3)),
            Mode.HTTP: ModeProfile(Mode.HTTP, base, memory=CostModel(20e6, 2e3)),
        },
    )
    services = {
        n: Service(n, HTTP, connections=c, node=node)
        for n, c, node in (("a", 10, "n1"), ("b", 20, "n1"), ("c", 30, "n2"))
    }
    look = single_profile(mem)
    got: dict[Architecture, dict[str, Any]] = {}
    for arch in (SIDECAR, L4, WAY, NONE):
        m, warns = memory_by_architecture(services, look, arch)
        assert m is not None and warns == []
        got[arch] = m
    sidecars = 3 * 20e6 + 2e3 * 60
    nodes = 2 * 10e6 + 1e3 * 60  # two nodes, every connection through one node proxy
    assert got[SIDECAR]["total_bytes"] == pytest.approx(sidecars)
    assert got[L4]["total_bytes"] == pytest.approx(nodes) and got[L4]["proxies"] == 2
    assert got[WAY]["total_bytes"] == pytest.approx(nodes + sidecars)
    assert got[NONE]["total_bytes"] == 0 and got[NONE]["proxies"] == 0
    # without a memory model: not predicted, and said
    none, warns = memory_by_architecture(services, LOOK, L4)
    assert none is None and any("no tcp memory model" in w for w in warns)


def test_several_graphs_and_one_placement() -> None:
    g1 = chain("n1", "n2")
    g2 = validate("h", g1.services, [inv("r", EXTERNAL, "B", 0, 100)])
    _, p = predict_architecture(to_batch([g1, g2]), LOOK, L4)
    assert p.latency_overhead_us == pytest.approx(np.array([60.0, 20.0]))
    with pytest.raises(ValueError, match="'B' appears on two nodes"):
        to_batch([g1, chain("n1", "n1")])


# profiles measured in the role: a node proxy 3 µs / 4 CPU-µs per crossing within a node, +2 / +1
# across nodes (its tls component); a waypoint 50 / 70 in http (its mTLS inside)
NODE = profile({Mode.TCP: {READ: flat(3, 4), TLS: flat(2, 1)}}, name="node")
WAYP = profile({Mode.HTTP: {READ: flat(10, 20), PARSING: flat(40, 50)}}, name="wayp")
ROLES = {L4: "node", WAY: "wayp"}
ROLE_LOOK = single_profile(P, {"node": NODE, "wayp": WAYP})


@pytest.mark.parametrize(
    ("arch", "a_node", "b_node", "rows"),
    [
        # external → A: plaintext from outside (the near crossing); intra-node A → B once
        (L4, "n1", "n1", [6, 6]),
        # inter-node: both node proxies, each with the inter-node addition
        (L4, "n1", "n2", [6, 2 * (6 + 4)]),
        # plus B's waypoint from the waypoint profile, no TLS on top of it; the node proxies'
        # legs to and from it are mTLS within a node too; none for the client outside the mesh
        (WAY, "n1", "n2", [6, 20 + 100]),
        (WAY, "n1", "n1", [6, 20 + 100]),
    ],
)
def test_role_profiles_price_node_proxies_and_waypoints(
    arch: Architecture, a_node: str, b_node: str, rows: list[float]
) -> None:
    g = chain(a_node, b_node)
    _, p = predict_architecture(to_batch([g]), ROLE_LOOK, arch, roles=ROLES)
    per_row = list(p.row_latency_caller_us + p.row_latency_callee_us)
    assert per_row == pytest.approx(rows)
    assert not [w for w in p.warnings if "TLS" in w]
    # the services' own mTLS does not matter to a measured node proxy: across nodes it is on
    m = SidecarConfig(Mode.HTTP, mtls=True)
    g2 = chain(a=Service("A", m, node=a_node), b=Service("B", m, node=b_node))
    _, p2 = predict_architecture(to_batch([g2]), ROLE_LOOK, arch, roles=ROLES)
    assert list(p2.row_latency_caller_us + p2.row_latency_callee_us) == pytest.approx(rows)


def test_role_profiles_leave_sidecars_and_default_pricing_alone() -> None:
    g = chain("n1", "n2", a=Service("A", HTTP, node="n1", architecture=SIDECAR))
    _, p = predict_architecture(to_batch([g]), ROLE_LOOK, L4, roles=ROLES)
    # A's sidecar (http, 2 × 40) on both rows' A side; B's node proxy across nodes 2 × 5
    assert list(p.row_latency_caller_us + p.row_latency_callee_us) == pytest.approx([80, 90])
    _, q = predict_architecture(to_batch([chain("n1", "n2")]), ROLE_LOOK, L4)
    assert list(q.row_latency_caller_us + q.row_latency_callee_us) == pytest.approx([20, 40])


def _rated(cpu_at_hi: float, coef: float) -> ComponentModel:
    """CPU ``cpu_at_hi`` at 1000/s, +``coef`` per e-fold below (profiled from 10/s)."""
    return ComponentModel(
        CostModel(1.0), CostModel(cpu_at_hi, rate_coef=coef, rate_lo=10.0, rate_hi=1000.0)
    )


def test_shared_cpus_price_node_proxy_crossings_at_the_graphs_rate() -> None:
    # external → A → B at 100/s, one node, A → B through B's waypoint: 1 + 2 node-proxy sides
    # and 1 waypoint side = 4 crossings a request each way, 800 crossings/s on one CPU: a one-hop
    # at 400/s loads it alike (a node proxy runs on its pods' CPUs as a sidecar does); the
    # waypoint at the 100/s it carries
    prof = profile({Mode.TCP: {READ: _rated(2, 3)}, Mode.HTTP: {READ: _rated(5, 4)}})
    g = validate(
        "g",
        {"A": Service("A", HTTP, node="n1"), "B": Service("B", HTTP, node="n1")},
        [inv("r", EXTERNAL, "A", 0, 100, rate=100), inv("c", "A", "B", 10, 50, "r", rate=100)],
    )
    _, p = predict_architecture(to_batch([g]), single_profile(prof), WAY, pod_cpus=1)
    tcp, http = 2 + 3 * np.log(1000 / 400), 5 + 4 * np.log(1000 / 100)
    assert p.cpu_vcpu[0] == pytest.approx((3 * 2 * tcp + 2 * http) * 100 * 1e-6)
    # on CPUs of their own: each call's own rate
    _, q = predict_architecture(to_batch([g]), single_profile(prof), WAY)
    tcp, http = 2 + 3 * np.log(10), 5 + 4 * np.log(10)
    assert q.cpu_vcpu[0] == pytest.approx((3 * 2 * tcp + 2 * http) * 100 * 1e-6)


def test_idle_cpu_is_the_proxies_that_exist_not_a_sidecar_per_service() -> None:
    # idle: a node proxy (tcp) 1 000 CPU-µs/s, a sidecar or a waypoint (http) 3 000
    base = {READ: flat(0, 0)}
    prof = replace(
        P,
        modes={
            Mode.TCP: ModeProfile(Mode.TCP, base, idle_cpu_us_per_s=1000.0),
            Mode.HTTP: ModeProfile(Mode.HTTP, base, idle_cpu_us_per_s=3000.0),
        },
    )
    look = single_profile(prof)
    three = validate(
        "g",
        {n: Service(n, HTTP, node=node) for n, node in (("A", "n1"), ("B", "n1"), ("C", "n2"))},
        [
            inv("r", EXTERNAL, "A", 0, 100),
            inv("b", "A", "B", 10, 30, "r"),
            inv("c", "A", "C", 50, 30, "r"),
        ],
    )
    b = to_batch([three])
    idle = {
        SIDECAR: 3 * 3000,  # a sidecar per service
        L4: 2 * 1000,  # a node proxy per node (n1, n2), not per service
        WAY: 2 * 1000
        + 3 * 3000,  # and a waypoint per service (A's idles: nobody in the mesh calls it)
    }
    for arch, us in idle.items():
        _, p = predict_architecture(b, look, arch)
        assert p.idle_vcpu is not None and p.idle_vcpu[0] == pytest.approx(us * 1e-6), arch
        assert p.cpu_vcpu[0] == pytest.approx(us * 1e-6), arch
    _, p = predict_architecture(b, look, L4)
    assert p.service_idle_vcpu is not None
    assert p.service_idle_vcpu.tolist() == pytest.approx([1e-3] * 3)


def test_a_waypoint_is_priced_at_the_rate_it_carries() -> None:
    # B's waypoint serves A's two calls (100/s each): 200 requests/s, whatever the shared CPU's
    # load (the node proxies: 1 + 2 × 2 sides + 2 waypoint sides = 7 a request each way, 1 400
    # crossings/s on one CPU, a one-hop at 700/s); C's waypoint serves one call at 100/s
    node = profile({Mode.TCP: {READ: _rated(2, 3)}}, name="node")
    way = profile({Mode.HTTP: {READ: _rated(5, 4)}}, name="wayp")
    way = replace(way, platform=replace(way.platform, architecture="waypoint"))
    look = single_profile(P, {"node": node, "wayp": way})
    svc = {n: Service(n, HTTP, node="n1") for n in "ABC"}
    g = validate(
        "g",
        svc,
        [
            inv("r", EXTERNAL, "A", 0, 100, rate=100),
            inv("b1", "A", "B", 10, 20, "r", rate=100),
            inv("b2", "A", "B", 40, 20, "r", rate=100),
        ],
    )
    h = validate(
        "h",
        svc,
        [inv("r", EXTERNAL, "A", 0, 100, rate=100), inv("c", "A", "C", 10, 50, "r", rate=100)],
    )
    arranged, p = predict_architecture(to_batch([g, h]), look, WAY, pod_cpus=1, roles=ROLES)
    assert waypoint_rates(arranged).tolist() == [100, 200, 200, 100, 100]
    tcp = 2 + 3 * np.log(1000 / 700)
    http = 5 + 4 * np.log(1000 / 200)
    assert p.cpu_vcpu[0] == pytest.approx((5 * 2 * tcp + 2 * 2 * http) * 100 * 1e-6)
    # on CPUs of their own, too: the waypoint's rate is its own
    _, q = predict_architecture(to_batch([g]), look, WAY, roles=ROLES)
    tcp = 2 + 3 * np.log(10)
    assert q.cpu_vcpu[0] == pytest.approx((5 * 2 * tcp + 2 * 2 * http) * 100 * 1e-6)


def test_a_node_proxys_inter_node_term_is_priced_as_measured_and_the_floor_is_apart() -> None:
    # the node-l4 profile's tls measured −2 µs / −1 CPU-µs a crossing: priced as measured (the
    # floor failed its test on a fresh run); inter_node_floor, for experiments, sets it to 0
    node = profile({Mode.TCP: {READ: flat(3, 4), TLS: flat(-2, -1)}}, name="node")
    look = single_profile(P, {"node": node, "wayp": WAYP})
    arranged, p = predict_architecture(to_batch([chain("n1", "n2")]), look, L4, roles=ROLES)
    # external → A within n1 (no tls); A → B across nodes: both node proxies, 2 × 2 × (3 − 2)
    assert list(p.row_latency_caller_us + p.row_latency_callee_us) == pytest.approx([6, 4])
    costs = architecture_costs(arranged, look)
    floored = inter_node_floor(arranged.batch, costs)
    assert floored.latency.sum(1).tolist() == pytest.approx([6, 12])
    assert floored.cpu.sum(1).tolist() == pytest.approx([8, 16])
