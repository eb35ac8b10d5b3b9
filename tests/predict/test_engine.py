"""Prediction engine: exact, hand-computed expectations (DESIGN.md semantics)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from meshtax.model.components import (
    IPC,
    NOTIFICATION,
    OTHER,
    PARSING,
    READ,
    TLS,
    WRITE,
    filter_component,
)
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.ecg import ECG, EcgBatch, to_batch
from meshtax.model.profile import ModeProfile, Profile, TlsModels
from meshtax.model.sidecar import NO_SIDECAR, Mode, SidecarConfig
from meshtax.predict.engine import (
    BatchPrediction,
    PredictionError,
    predict_batch,
    single_profile,
)
from meshtax.predict.whatif import apply_speedup, speedup_from_dict
from meshtax.store.reference import reference_profile
from tests.helpers import EXTERNAL, ecg, flat, inv, profile

HTTP = SidecarConfig(Mode.HTTP)
GRPC = SidecarConfig(Mode.GRPC)
# one component, 5 µs latency and 2 CPU-µs per crossing in http; 10 µs / 4 in grpc
P = profile({Mode.HTTP: {OTHER: flat(5, 2)}, Mode.GRPC: {OTHER: flat(10, 4)}})


def run(g: ECG | list[ECG], prof: Profile = P) -> tuple[EcgBatch, BatchPrediction]:
    b = to_batch(g if isinstance(g, list) else [g])
    return b, predict_batch(b, single_profile(prof))


def test_sequential_children_add_up() -> None:
    # A calls B (10–40) then C (50–80): C waits for B. Overheads: client→A 2×5, A→B and A→C 4×5.
    g = ecg(
        {"A": HTTP, "B": HTTP, "C": HTTP},
        [
            inv("r", EXTERNAL, "A", 0, 100),
            inv("b", "A", "B", 10, 30, "r"),
            inv("c", "A", "C", 50, 30, "r"),
        ],
    )
    _, bp = run(g)
    assert bp.base_latency_us[0] == 100
    assert bp.latency_overhead_us[0] == 10 + 20 + 20
    assert bp.critical.tolist() == [True, True, True]


def test_parallel_children_overlap() -> None:
    # B (10–40) and C (20–50) overlap: only one 20 µs hop delay reaches the parent
    g = ecg(
        {"A": HTTP, "B": HTTP, "C": HTTP},
        [
            inv("r", EXTERNAL, "A", 0, 100),
            inv("b", "A", "B", 10, 30, "r"),
            inv("c", "A", "C", 20, 30, "r"),
        ],
    )
    _, bp = run(g)
    assert bp.latency_overhead_us[0] == 10 + 20
    assert bp.critical.tolist() == [True, False, True]  # C ends last
    assert bp.absorbed_us[0] == 0


def test_critical_path_changes_when_overhead_is_added() -> None:
    # parallel B (10–60, http: 20 µs added) and C (10–55, grpc callee: 2×5 + 2×10 = 30 µs added).
    # Before: B ends last. After: B ends at 80, C at 85 → C is critical; 5 µs of C's delay is B's slack.
    g = ecg(
        {"A": HTTP, "B": HTTP, "C": GRPC},
        [
            inv("r", EXTERNAL, "A", 0, 100),
            inv("b", "A", "B", 10, 50, "r"),
            inv("c", "A", "C", 10, 45, "r"),
        ],
    )
    _, bp = run(g)
    assert bp.critical_before.tolist() == [True, True, False]
    assert bp.critical.tolist() == [True, False, True]
    assert bp.latency_overhead_us[0] == 10 + 25
    assert bp.absorbed_us[0] == 5  # on-path components (10 + 30) minus the overhead


def test_waiting_sibling_is_anchored_to_its_latest_predecessor() -> None:
    # B (10–40) and C (15–45) both end before D starts (50); D's start is anchored to the
    # latest of their delayed ends, and the 5 µs gap after C is the parent's compute.
    g = ecg(
        {"A": HTTP, "B": GRPC, "C": NO_SIDECAR, "D": NO_SIDECAR},
        [
            inv("r", EXTERNAL, "A", 0, 100),
            inv("b", "A", "B", 10, 30, "r"),
            inv("c", "A", "C", 15, 30, "r"),
            inv("d", "A", "D", 50, 20, "r"),
        ],
    )
    _, bp = run(g)
    # B: A outbound 2×5 + B inbound grpc 2×10 = 30 → ends 70; C: A outbound only 10 → ends 55.
    # D waits for max(70, 55) = 70 vs 45 → +25; D itself +10 (A outbound); parent tail: +35; root +10
    assert bp.latency_overhead_us[0] == 10 + 25 + 10
    assert bp.critical.tolist() == [True, True, False, True]


def test_cpu_counts_calls_off_the_critical_path() -> None:
    g = ecg(
        {"A": HTTP, "B": HTTP, "C": HTTP},
        [
            inv("r", EXTERNAL, "A", 0, 100, rate=1000),
            inv("b", "A", "B", 10, 30, "r", rate=1000),
            inv("c", "A", "C", 20, 30, "r", rate=1000),
        ],
    )
    _, bp = run(g)
    # crossings: 2 + 4 + 4 = 10, 2 CPU-µs each, 1000 calls/s → 0.02 vCPU; B is off the critical path
    assert bp.cpu_vcpu[0] == pytest.approx(10 * 2e-6 * 1000)
    assert not bp.critical[1]


def test_services_without_sidecars_add_nothing() -> None:
    g = ecg(
        {"A": NO_SIDECAR, "B": HTTP},
        [inv("r", EXTERNAL, "A", 0, 100), inv("b", "A", "B", 10, 30, "r")],
    )
    _, bp = run(g)
    assert bp.latency_overhead_us[0] == 10  # only B's inbound sidecar, request + response
    assert bp.row_latency_caller_us.tolist() == [0, 0]
    assert bp.row_latency_callee_us.tolist() == [0, 10]
    none = ecg({"A": NO_SIDECAR}, [inv("r", EXTERNAL, "A", 0, 100)])
    _, bp0 = run(none)
    assert bp0.latency_overhead_us[0] == 0 and bp0.cpu_vcpu[0] == 0


def test_size_slopes_and_split_units() -> None:
    from meshtax.model.costmodel import ComponentModel, CostModel

    split = ComponentModel(CostModel(1.0, 0.01, split_bytes=1000, per_unit=3.0), CostModel(0.0))
    prof = profile({Mode.HTTP: {READ: split}})
    g = ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, req=2500, resp=100)])
    _, bp = run(g, prof)
    # request 2500 B: 1 + 25 + 3×2 = 32; response 100 B: 1 + 1 = 2
    assert bp.latency_overhead_us[0] == pytest.approx(34.0)


ALL = {
    IPC: flat(1, 1),
    READ: flat(2, 1),
    WRITE: flat(3, 1),
    NOTIFICATION: flat(4, 1),
    PARSING: flat(5, 1),
    OTHER: flat(6, 1),
    filter_component("lua"): flat(7, 1),
    filter_component("wasm"): flat(8, 1),
    TLS: flat(9, 1),
}


def test_every_component_kind_is_priced_and_broken_down() -> None:
    prof = profile({Mode.HTTP: ALL})
    cfg = SidecarConfig(Mode.HTTP, filters=("lua", "wasm"), mtls=True)
    g = ecg({"A": cfg}, [inv("r", EXTERNAL, "A", 0, 100)])
    _, bp = run(g, prof)
    by = dict(zip((c.key for c in bp.components), bp.latency_by_component[0]))
    assert by == {
        "ipc": 2,
        "read": 4,
        "write": 6,
        "notification": 8,
        "parsing": 10,
        "other": 12,
        "filter:lua": 14,
        "filter:wasm": 16,
        "tls": 18,
    }
    assert bp.latency_overhead_us[0] == 90


def test_speedup_scales_every_component_kind() -> None:
    prof = profile({Mode.HTTP: ALL})
    sp = speedup_from_dict(
        {
            "scale": {
                "ipc": "-30%",
                "write": "-50%",
                "parsing": "-20%",
                "filter:lua": "-100%",
                "filters": "-50%",
                "tls": -10,
            }
        }
    )
    after, warnings = apply_speedup(prof, sp)
    assert warnings == ()
    cfg = SidecarConfig(Mode.HTTP, filters=("lua", "wasm"), mtls=True)
    g = ecg({"A": cfg}, [inv("r", EXTERNAL, "A", 0, 100)])
    _, bp = run(g, after)
    by = dict(zip((c.key for c in bp.components), np.round(bp.latency_by_component[0], 9)))
    assert by == {
        "ipc": 1.4,
        "read": 4,
        "write": 3,
        "notification": 8,
        "parsing": 8,
        "other": 12,
        "filter:lua": 0,
        "filter:wasm": 8,
        "tls": 16.2,
    }


def test_speedup_warns_for_components_the_profile_lacks() -> None:
    sp = speedup_from_dict({"scale": {"tls": "-30%", "ipc": "-30%"}})
    _, warnings = apply_speedup(reference_profile(), sp)
    assert len(warnings) == 1 and "no tls component" in warnings[0]


def test_distribution_over_several_graphs() -> None:
    graphs = [
        ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100 + i)], name=f"g{i}") for i in range(4)
    ]
    graphs.append(
        ecg(
            {"A": HTTP, "B": HTTP},
            [inv("r", EXTERNAL, "A", 0, 100), inv("b", "A", "B", 10, 30, "r")],
            name="g4",
        )
    )
    _, bp = run(graphs)
    assert bp.latency_overhead_us.tolist() == [10, 10, 10, 10, 30]
    from meshtax.report.result import summary

    s = summary(bp)["latency_overhead_us"]
    assert (
        s["mean"] == 14
        and s["p50"] == 10
        and s["p90"] == pytest.approx(22)
        and s["p99"] == pytest.approx(29.2)
    )


def test_unprofiled_filter_is_a_clear_error() -> None:
    g = ecg({"A": SidecarConfig(Mode.HTTP, filters=("rbac",))}, [inv("r", EXTERNAL, "A", 0, 100)])
    with pytest.raises(PredictionError, match="no http-mode model for filter.*rbac"):
        run(g)


def test_mtls_without_tls_model_warns() -> None:
    g = ecg({"A": SidecarConfig(Mode.HTTP, mtls=True)}, [inv("r", EXTERNAL, "A", 0, 100)])
    _, bp = run(g)
    assert any("mTLS cost is not counted" in w for w in bp.warnings)


def test_intervals_widen_with_model_uncertainty() -> None:
    from meshtax.model.costmodel import ComponentModel, CostModel

    fitted = CostModel.fit([100, 100, 1000, 1000], [9, 11, 18, 22])
    prof = profile({Mode.HTTP: {OTHER: ComponentModel(fitted, fitted)}})
    g = ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100)])
    _, bp = run(g, prof)
    assert bp.latency_lo_us[0] < bp.latency_overhead_us[0] < bp.latency_hi_us[0]
    assert bp.cpu_lo_vcpu[0] < bp.cpu_vcpu[0] < bp.cpu_hi_vcpu[0]


def test_speedup_replaces_a_component_by_another_profiles_model() -> None:
    base = profile({Mode.HTTP: ALL})
    faster = profile(
        {Mode.HTTP: {PARSING: flat(1, 0.5)}, Mode.GRPC: {PARSING: flat(2, 0.25)}}, name="next"
    )
    sp = speedup_from_dict({"name": "swap", "replace": {"parsing": {"profile": "next"}}})
    after, _ = apply_speedup(base, sp, {"next": faster}.__getitem__)
    assert after.mode(Mode.HTTP).components[PARSING] == faster.mode(Mode.HTTP).components[PARSING]
    assert after.mode(Mode.HTTP).components[IPC] == base.mode(Mode.HTTP).components[IPC]
    sp_grpc = speedup_from_dict({"replace": {"parsing": {"profile": "next", "mode": "grpc"}}})
    after2, _ = apply_speedup(base, sp_grpc, {"next": faster}.__getitem__)
    assert after2.mode(Mode.HTTP).components[PARSING].latency.intercept == 2
    assert after.provenance.source == "derived" and "what-if swap" in after.provenance.notes[-1]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"scale": {"ipc": "fast"}}, "expected a percent change"),
        ({"scale": {"epoll": "-5%"}}, "unknown component"),
        ({"scale": {"ipc": "-150%"}}, "≥ -100%"),
        ({"replace": {"ipc": "x"}}, "expected {profile"),
        ({}, "nothing to change"),
        ({"scale": {"ipc": "-5%"}, "extra": 1}, "unknown field"),
    ],
)
def test_bad_speedups_are_clear_errors(doc: dict, message: str) -> None:  # type: ignore[type-arg]
    from meshtax.predict.whatif import SpeedupError

    with pytest.raises(SpeedupError, match=message):
        speedup_from_dict(doc, "sp.yaml")


def test_mode_missing_from_profile_is_a_clear_error() -> None:
    g = ecg({"A": SidecarConfig(Mode.TCP)}, [inv("r", EXTERNAL, "A", 0, 100)])
    with pytest.raises(PredictionError, match="has no tcp mode"):
        run(g)


def test_memory_per_pod_from_connection_counts() -> None:
    from dataclasses import replace

    from meshtax.model.costmodel import CostModel
    from meshtax.model.ecg import Service
    from meshtax.predict.memory import memory_by_service

    base = profile({Mode.HTTP: {OTHER: flat(5, 2)}})
    mp = replace(
        base.mode(Mode.HTTP), memory=CostModel(60e6, 16e3), memory_mtls=CostModel(62e6, 32e3)
    )
    prof = replace(base, modes={Mode.HTTP: mp})
    svcs = {
        "a": Service("a", HTTP, connections=100),
        "b": Service("b", SidecarConfig(Mode.HTTP, mtls=True), connections=10),
        "c": Service("c", HTTP),  # no count: left out
        "d": Service("d", NO_SIDECAR, connections=5),  # no sidecar: nothing
    }
    mem, warnings = memory_by_service(svcs, single_profile(prof))
    assert mem is not None and warnings == []
    assert [(r["service"], r["bytes"]) for r in mem["per_pod"]] == [
        ("a", 60e6 + 100 * 16e3),
        ("b", 62e6 + 10 * 32e3),
    ]
    assert mem["total_bytes"] == 60e6 + 1.6e6 + 62e6 + 0.32e6
    none, w = memory_by_service({"a": Service("a", HTTP, connections=1)}, single_profile(base))
    assert none is None and "no http memory model" in w[0]


def test_cpu_follows_the_rate_term_within_the_profiled_range() -> None:
    # OTHER: 2 CPU-µs at the highest profiled rate (1000/s), +3 per e-fold below it, profiled from 10/s
    rated = ComponentModel(
        CostModel(5.0), CostModel(2.0, rate_coef=3.0, rate_lo=10.0, rate_hi=1000.0)
    )
    prof = profile({Mode.HTTP: {OTHER: rated}})
    for rate, per_crossing in (
        (1000.0, 2.0),
        (100.0, 2.0 + 3 * np.log(10)),
        (1.0, 2.0 + 3 * np.log(100)),
    ):
        g = ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, rate=rate)])
        _, bp = run(g, prof)
        # two crossings (request, response) at `rate` calls/s; latency has no rate term
        assert bp.cpu_vcpu[0] == pytest.approx(2 * per_crossing * rate * 1e-6)
        assert bp.latency_overhead_us[0] == 10.0


def test_tcp_mode_prices_grpc_on_the_wire_with_the_carried_models() -> None:
    tcp = SidecarConfig(Mode.TCP)
    base = ModeProfile(
        Mode.TCP, {OTHER: flat(3, 1)}, carried={"grpc": ModeProfile(Mode.TCP, {OTHER: flat(7, 4)})}
    )
    prof = replace(profile({}), modes={Mode.TCP: base})
    calls = [
        inv("r", EXTERNAL, "A", 0, 100),
        inv("g", "A", "B", 10, 30, "r"),
        inv("h", "A", "C", 50, 30, "r"),
    ]
    calls = [calls[0], replace(calls[1], protocol="grpc"), replace(calls[2], protocol="http")]
    b, bp = run(ecg({"A": tcp, "B": tcp, "C": tcp}, calls), prof)
    # root (unknown protocol) 2×3, gRPC call 4×7 (A out, B in), HTTP call 4×3 (no carried http model)
    assert bp.latency_overhead_us[0] == 2 * 3 + 4 * 7 + 4 * 3
    assert bp.cpu_vcpu[0] == pytest.approx((2 * 1 + 4 * 4 + 4 * 1) * 1000 * 1e-6)
    assert not bp.warnings
    # a parsing sidecar ignores the carried models; a tcp profile without them warns for gRPC
    _, bp2 = run(
        ecg({"A": tcp, "B": tcp, "C": tcp}, calls),
        replace(prof, modes={Mode.TCP: replace(base, carried={})}),
    )
    assert bp2.latency_overhead_us[0] == 10 * 3 and any("gRPC" in w for w in bp2.warnings)
    # a transfer scales each message by the factor of the model it is priced with: the gRPC
    # call's by tcp+grpc's, the others by tcp's
    from meshtax.model.transfer import KeyTransfer, Transfer

    t = Transfer({"tcp": KeyTransfer(2, 2, 2, 1, 0), "tcp+grpc": KeyTransfer(0.5, 0.5, 0.5, 1, 0)})
    _, bp3 = run(ecg({"A": tcp, "B": tcp, "C": tcp}, calls), replace(prof, transfer=t))
    assert bp3.latency_overhead_us[0] == 2 * (2 * 3) + 0.5 * (4 * 7) + 2 * (4 * 3)


def test_shared_cpus_bound_latency_by_the_requests_cpu_work() -> None:
    # parallel B and C (both 10–40): on their own CPUs only one hop delay reaches A (10 + 20);
    # on shared CPUs the request's CPU work queues, so the overhead is at least work ÷ CPUs
    g = ecg(
        {"A": HTTP, "B": HTTP, "C": HTTP},
        [
            inv("r", EXTERNAL, "A", 0, 100),
            inv("b", "A", "B", 10, 30, "r"),
            inv("c", "A", "C", 10, 30, "r"),
        ],
    )
    b = to_batch([g])
    own = predict_batch(b, single_profile(P))
    assert own.latency_overhead_us[0] == 30 and own.pod_cpus is None and own.cpu_bound is None
    # CPU work per request: root 2 crossings + 4 each for B and C = 10 crossings × 2 CPU-µs = 20 µs
    # → on 1 CPU: max(30, 20) = 30 (the critical path still dominates: latency 5 µs > CPU 2 µs)
    one = predict_batch(b, single_profile(P), pod_cpus=1)
    assert one.latency_overhead_us[0] == 30 and not one.cpu_bound[0]  # type: ignore[index]
    # where CPU exceeds on-path latency (8 CPU-µs vs 5 µs per crossing): 10 × 8 = 80 on one CPU, 40 on two
    heavy = profile({Mode.HTTP: {OTHER: flat(5, 8)}})
    one = predict_batch(b, single_profile(heavy), pod_cpus=1)
    two = predict_batch(b, single_profile(heavy), pod_cpus=2)
    assert one.latency_overhead_us[0] == 80 and one.cpu_bound[0]  # type: ignore[index]
    assert two.latency_overhead_us[0] == 40
    assert one.latency_by_component[0].sum() == 80 and one.absorbed_us[0] == 0
    with pytest.raises(ValueError, match="pod_cpus"):
        predict_batch(b, single_profile(P), pod_cpus=0)


def test_every_sidecar_a_graph_crosses_adds_its_idle_cpu_once() -> None:
    """A profile that measured the idle proxy (2 000 CPU-µs/s in http, 1 000 in grpc): each
    graph adds it once per sidecar it crosses (B twice here: still once), in Other and in the
    service's row; latency and the shared-CPU bound do not count it (it is on no path)."""
    two = [
        ecg(
            {"A": HTTP, "B": HTTP, "C": GRPC},
            [
                inv("r", EXTERNAL, "A", 0, 100, rate=50),
                inv("b", "A", "B", 10, 20, "r", rate=50),
                inv("b2", "A", "B", 40, 20, "r", rate=50),
                inv("c", "A", "C", 70, 20, "r", rate=50),
            ],
            "abc",
        ),
        ecg({"B": HTTP}, [inv("r", EXTERNAL, "B", 0, 100, rate=50)], "b"),
    ]
    b = to_batch(two)
    idle = replace(
        P,
        modes={
            Mode.HTTP: replace(P.modes[Mode.HTTP], idle_cpu_us_per_s=2000.0),
            Mode.GRPC: replace(P.modes[Mode.GRPC], idle_cpu_us_per_s=1000.0),
        },
    )
    plain = predict_batch(b, single_profile(P))
    got = predict_batch(b, single_profile(idle))
    assert plain.idle_vcpu is None and plain.service_idle_vcpu is None
    assert got.idle_vcpu is not None and got.idle_vcpu.tolist() == pytest.approx([0.005, 0.002])
    assert (got.cpu_vcpu - plain.cpu_vcpu).tolist() == pytest.approx([0.005, 0.002])
    k = got.components.index(OTHER)
    assert (got.cpu_by_component[:, k] - plain.cpu_by_component[:, k]).tolist() == pytest.approx(
        [0.005, 0.002]
    )
    assert got.service_idle_vcpu is not None
    assert dict(zip(b.services, got.service_idle_vcpu.tolist())) == pytest.approx(
        {"A": 0.002, "B": 0.002, "C": 0.001}
    )
    assert got.latency_overhead_us.tolist() == plain.latency_overhead_us.tolist()
    # on one shared CPU the request's share of it (per second ÷ 50 requests/s: 100 and 40 µs)
    # joins its message work: abc 32 + 100 = 132 beats its critical path (80); b 4 + 40 = 44
    assert predict_batch(b, single_profile(P), pod_cpus=1).latency_overhead_us.tolist() == [80, 10]
    one = predict_batch(b, single_profile(idle), pod_cpus=1)
    assert one.latency_overhead_us.tolist() == pytest.approx([132, 44])
    assert one.latency_by_component[:, k].tolist() == pytest.approx([132, 44])  # all in Other


def test_new_connections_pay_the_handshake_and_per_connection_filters() -> None:
    # http: OTHER 5 µs / 2 CPU-µs per crossing; handshake 100 µs / 40 CPU-µs per connection per
    # sidecar; network RBAC 0 per message, 3 µs / 1 CPU-µs per connection
    rbac = filter_component("rbac_network_100")
    mp = ModeProfile(
        Mode.HTTP,
        {OTHER: flat(5, 2), TLS: flat(1, 1), rbac: flat(0, 0)},
        tls_handshake=flat(100, 40),
        per_connection={rbac: flat(3, 1)},
    )
    prof = replace(profile({}), modes={Mode.HTTP: mp})
    side = SidecarConfig(Mode.HTTP, filters=("rbac_network_100",), mtls=True)
    calls = [
        inv("r", EXTERNAL, "A", 0, 1000),
        replace(inv("c", "A", "B", 10, 100, "r"), new_connections=0.25),
    ]
    _, bp = run(ecg({"A": side, "B": side}, calls), prof)
    # per message: root 2 crossings, A→B 4 crossings, each OTHER 5 + TLS 1 = 6 µs → 36;
    # a quarter of A→B's calls open a connection: 2 sidecars × (100 + 3) × 0.25 = 51.5
    assert bp.latency_overhead_us[0] == pytest.approx(36 + 51.5)
    assert bp.cpu_vcpu[0] == pytest.approx((6 * 3 + 2 * (40 + 1) * 0.25) * 1000 * 1e-6)
    k = bp.components.index(TLS)
    assert bp.cpu_by_component[0, k] == pytest.approx((6 * 1 + 2 * 40 * 0.25) * 1000 * 1e-6)
    # without a handshake model: a warning, not a guess
    _, bp2 = run(
        ecg({"A": side, "B": side}, calls),
        replace(prof, modes={Mode.HTTP: replace(mp, tls_handshake=None)}),
    )
    assert any("handshake" in w for w in bp2.warnings)


def test_mtls_is_priced_with_the_pinned_tls_version() -> None:
    # primary (1.3): TLS 1 µs / 1 CPU-µs per crossing, handshake 100 / 40; 1.2: 2 / 3 and 50 / 20
    mp = ModeProfile(
        Mode.HTTP,
        {OTHER: flat(5, 2), TLS: flat(1, 1)},
        tls_handshake=flat(100, 40),
        tls_version="1.3",
        tls_by_version={
            "1.3": TlsModels("1.3", flat(1, 1), flat(100, 40)),
            "1.2": TlsModels("1.2", flat(2, 3), flat(50, 20)),
        },
    )
    prof = replace(profile({}), modes={Mode.HTTP: mp})
    calls = [replace(inv("r", EXTERNAL, "A", 0, 1000), new_connections=0.5)]

    def one(side: SidecarConfig) -> tuple[float, float]:
        _, bp = run(ecg({"A": side}, calls), prof)
        assert bp.warnings == ()
        return float(bp.latency_overhead_us[0]), float(bp.cpu_vcpu[0] * 1e6 / 1000)

    # 2 crossings × (5 + TLS) + half the calls × handshake, at the one sidecar
    assert one(SidecarConfig(Mode.HTTP, mtls=True)) == pytest.approx((2 * 6 + 50, 2 * 3 + 20))
    assert one(SidecarConfig(Mode.HTTP, mtls=True, tls_version="1.3")) == pytest.approx(
        (2 * 6 + 50, 2 * 3 + 20)
    )
    assert one(SidecarConfig(Mode.HTTP, mtls=True, tls_version="1.2")) == pytest.approx(
        (2 * 7 + 25, 2 * 5 + 10)
    )
    # a version the profile never measured: not priced with the other one, and said so
    only13 = replace(prof, modes={Mode.HTTP: replace(mp, tls_by_version={})})
    _, bp = run(ecg({"A": SidecarConfig(Mode.HTTP, mtls=True, tls_version="1.2")}, calls), only13)
    assert bp.latency_overhead_us[0] == pytest.approx(2 * 5)
    assert [w for w in bp.warnings if "TLS 1.2" in w] == [
        "profile 'test' has no http-mode models of TLS 1.2 (measured: 1.3): mTLS cost of those "
        "sidecars is not counted; "
        "`meshtax profile --mtls` measures 1.3 and 1.2"
    ]


def test_sidecar_tls_version_is_checked_and_round_trips() -> None:
    s = SidecarConfig(Mode.TCP, mtls=True, tls_version="1.2")
    assert SidecarConfig.from_dict(s.to_dict()) == s and s.describe() == "tcp mTLS 1.2"
    assert "tls_version" not in SidecarConfig(Mode.TCP, mtls=True).to_dict()
    with pytest.raises(ValueError, match="expected one of 1.2, 1.3"):
        SidecarConfig(Mode.TCP, mtls=True, tls_version="1.1")
    with pytest.raises(ValueError, match="without mtls"):
        SidecarConfig(Mode.TCP, tls_version="1.3")


def test_costs_scale_with_the_machine_speed_now() -> None:
    from meshtax.model.components import IPC, NOTIFICATION
    from meshtax.model.speed import Speed

    then = Speed(local_ns=20_000, cross_ns=40_000, user_ns=400)
    prof = replace(
        profile({Mode.HTTP: {IPC: flat(1, 1), NOTIFICATION: flat(2, 2), OTHER: flat(4, 4)}}),
        speed=then,
    )
    g = ecg({"a": SidecarConfig(Mode.HTTP)}, [inv("r", EXTERNAL, "a", 0, 1000)])
    b = to_batch([g])
    same = predict_batch(b, single_profile(prof), speed=then)
    assert same.latency_overhead_us[0] == pytest.approx(2 * (1 + 2 + 4))
    # the kernel path 1.5× slower, wake-ups 2×, user space 3× faster than when profiled
    now = Speed(local_ns=30_000, cross_ns=80_000, user_ns=400 / 3)
    got = predict_batch(b, single_profile(prof), speed=now)
    assert got.latency_overhead_us[0] == pytest.approx(2 * (1.5 + 4 + 4 / 3))
    assert got.cpu_vcpu[0] == pytest.approx(1000 * 2 * (1.5 + 4 + 4 / 3) * 1e-6)
    # a profile without a recorded speed is used as measured, and says so
    plain = predict_batch(b, single_profile(replace(prof, speed=None)), speed=now)
    assert plain.latency_overhead_us[0] == pytest.approx(14.0)
    assert any("recorded no machine speed" in w for w in plain.warnings)


def test_user_space_scales_with_the_reference_sidecar_when_both_speeds_measured_one() -> None:
    """The user loop said 5 % faster while Envoy's user space ran ~20 % slower (issue #14):
    with a reference sidecar in both speeds, user-space work follows the sidecar, the kernel
    path and wake-ups their ping-pongs as before; with one in only one speed, the loop."""
    from dataclasses import replace as dc_replace

    from meshtax.model.components import IPC, NOTIFICATION
    from meshtax.model.speed import Speed, describe_scaling, kind_factors, typical

    then = Speed(local_ns=20_000, cross_ns=40_000, user_ns=400, sidecar_ns=100_000)
    prof = replace(
        profile({Mode.HTTP: {IPC: flat(1, 1), NOTIFICATION: flat(2, 2), OTHER: flat(4, 4)}}),
        speed=then,
    )
    g = ecg({"a": SidecarConfig(Mode.HTTP)}, [inv("r", EXTERNAL, "a", 0, 1000)])
    b = to_batch([g])
    now = Speed(local_ns=20_000, cross_ns=40_000, user_ns=380, sidecar_ns=125_000)
    got = predict_batch(b, single_profile(prof), speed=now)
    assert got.latency_overhead_us[0] == pytest.approx(2 * (1 + 2 + 4 * 1.25))
    assert kind_factors(now, then)["user"] == pytest.approx(1.25)
    assert "user-space work (reference sidecar) ×1.250" in describe_scaling(now, then)
    no_ref = dc_replace(now, sidecar_ns=None)
    assert kind_factors(no_ref, then)["user"] == pytest.approx(380 / 400)
    assert "reference sidecar" not in describe_scaling(no_ref, then)
    # through its document, and the profile's speed is the median of its measurements
    assert Speed.from_dict(now.to_dict()) == now and "sidecar_ns" not in no_ref.to_dict()
    t = typical([now, dc_replace(now, sidecar_ns=90_000), no_ref, then])
    assert t.sidecar_ns == 100_000
    with pytest.raises(ValueError, match="sidecar_ns"):
        Speed(1, 1, 1, sidecar_ns=-5)


def test_messages_beyond_the_largest_measured_size_are_warned_about() -> None:
    from meshtax.model.costmodel import ComponentModel, CostModel

    m = CostModel.fit([100, 4096, 4096], [1.0, 2.0, 2.0])
    prof = profile({Mode.HTTP: {OTHER: ComponentModel(m, m)}})
    small = ecg({"a": SidecarConfig(Mode.HTTP)}, [inv("r", EXTERNAL, "a", 0, 100, resp=4096)])
    big = ecg({"a": SidecarConfig(Mode.HTTP)}, [inv("r", EXTERNAL, "a", 0, 100, resp=32768)])
    assert not [w for w in run(small, prof)[1].warnings if "larger than" in w]
    (w,) = [w for w in run(big, prof)[1].warnings if "larger than" in w]
    assert w.startswith(
        "messages up to 32768 B are larger than the largest size profile 'test' measured in "
        "http mode (4096 B)"
    )


def test_a_transfer_scales_its_modes_per_message_costs_but_not_the_idle_sidecars() -> None:
    """The calibration set's transfer multiplies every per-message cost of a sidecar of its
    mode (latency and CPU), leaves other modes and the idle sidecars' CPU as they are."""
    from meshtax.model.transfer import KeyTransfer, Transfer

    g = ecg(
        {"A": HTTP, "B": GRPC},
        [inv("r", EXTERNAL, "A", 0, 100, rate=50), inv("b", "A", "B", 10, 20, "r", rate=50)],
    )
    idle = replace(
        P, modes={**P.modes, Mode.HTTP: replace(P.modes[Mode.HTTP], idle_cpu_us_per_s=2000.0)}
    )
    t = Transfer({"http": KeyTransfer(1.5, 1.4, 1.6, 5, 0.94)}, "unit")
    b = to_batch([g])
    plain = predict_batch(b, single_profile(idle))
    got = predict_batch(b, single_profile(replace(idle, transfer=t)))
    # A's sidecar (http) is crossed 4 times per request (r in and out, b out and back) at
    # 2 CPU-µs each, B's (grpc) twice at 4: only A's 8 CPU-µs go ×1.5
    http_cpu = 4 * 2.0 * 50 * 1e-6
    assert (got.cpu_vcpu - plain.cpu_vcpu).tolist() == pytest.approx([0.5 * http_cpu])
    assert got.idle_vcpu is not None and got.idle_vcpu.tolist() == pytest.approx([0.002])
    # latency: A's 4 crossings of 5 µs each go ×1.5, B's 2 × 10 stay
    assert (got.latency_overhead_us - plain.latency_overhead_us).tolist() == pytest.approx([10.0])


#: a sidecar that does most of its work after forwarding: on a shared CPU the bound sets latency
AFTER = profile({Mode.HTTP: {OTHER: flat(2, 30)}, Mode.GRPC: {OTHER: flat(2, 40)}})


@pytest.mark.parametrize(("prof", "pod_cpus"), [(P, None), (AFTER, 1)])
def test_latency_factors_price_latency_and_the_bound_cpu_factors_price_cpu(
    prof: Profile, pod_cpus: int | None
) -> None:
    """A transfer with latency factors of its own: a request's latency — its crossings, and on
    a shared CPU the work that bounds it — at the latency factor, its CPU at the CPU factor."""
    from meshtax.model.transfer import KeyTransfer, Transfer

    g = ecg(
        {"A": HTTP, "B": GRPC},
        [inv("r", EXTERNAL, "A", 0, 100, rate=50), inv("b", "A", "B", 10, 20, "r", rate=50)],
    )
    b = to_batch([g])
    k = {"http": KeyTransfer(1.5, 1.4, 1.6, 5, 0.94)}
    lk = {"http": KeyTransfer(0.5, 0.4, 0.6, 5, 0.94)}

    def with_t(t: Transfer | None) -> BatchPrediction:
        return predict_batch(b, single_profile(replace(prof, transfer=t)), pod_cpus=pod_cpus)

    plain, cpu_only, both, lat_only = (
        with_t(None),
        with_t(Transfer(k, "u")),
        with_t(Transfer(k, "u", lk)),
        with_t(Transfer(lk, "u")),
    )
    assert both.cpu_vcpu.tolist() == pytest.approx(cpu_only.cpu_vcpu.tolist())
    assert both.cpu_vcpu.tolist() != pytest.approx(plain.cpu_vcpu.tolist())
    assert both.latency_overhead_us.tolist() == pytest.approx(lat_only.latency_overhead_us.tolist())
    assert both.latency_overhead_us.tolist() != pytest.approx(cpu_only.latency_overhead_us.tolist())
    if pod_cpus == 1:  # the bound set the latency: A's 4 × 30 CPU-µs at ×0.5, B's 2 × 40
        assert both.cpu_bound is not None and both.cpu_bound.all()
        assert both.latency_overhead_us.tolist() == pytest.approx([0.5 * 120 + 80])
