"""Tail latency under load: the Monte Carlo against closed forms, saturation, load rules."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from meshtax.model.capacity import SKETCH_PROBS, Capacity, CapacityPoint, LatencySketch
from meshtax.model.components import OTHER
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.ecg import to_batch
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.critical_path import propagate, structure
from meshtax.predict.engine import predict_batch, single_profile
from meshtax.predict.load_factor import queue_relief
from meshtax.predict.queueing import ServiceMix, Shape, Station, waiting_times
from meshtax.predict.stations import load_factor, queue_factor, queued_factor, sidecar_rates
from meshtax.predict.tail import TailOptions, predict_tail, tiled
from tests.helpers import EXTERNAL, ecg, flat, inv, profile

HTTP = SidecarConfig(Mode.HTTP)
GRPC = SidecarConfig(Mode.GRPC)
PROBS = np.concatenate([np.linspace(0.0, 0.999, 4000), 1.0 - np.logspace(-3.1, -9, 80), [1.0]])
EXP = -np.log1p(-np.minimum(PROBS, 1.0 - 1e-12))  # Exp(1) quantiles


def with_exponential_sketch(p: Profile, mode: Mode = Mode.HTTP) -> Profile:
    """``p`` whose ``mode`` adds an Exp-shaped latency per request (sketch at 100 B)."""
    direct = np.full_like(PROBS, 100.0)
    sk = LatencySketch(100, tuple(PROBS), tuple(direct + EXP), tuple(direct), 10_000)
    mp = replace(p.modes[mode], latency_sketches={100: sk})
    return replace(p, modes={**p.modes, mode: mp})


def erlang_quantile(k: int, q: float) -> float:
    """Quantile of the sum of ``k`` Exp(1) (bisection on the Erlang CDF)."""
    lo, hi = 0.0, 100.0
    for _ in range(200):
        x = (lo + hi) / 2
        cdf = 1 - math.exp(-x) * sum(x**i / math.factorial(i) for i in range(k))
        lo, hi = (x, hi) if cdf < q else (lo, x)
    return (lo + hi) / 2


def test_chain_at_no_load_is_a_sum_of_independent_crossings() -> None:
    # client → A → B: three sidecar sides on the path (A in, A out, B in), each 2 × 10 µs
    # on average and exponential: the overhead is Erlang(3) with scale 20 µs
    p = with_exponential_sketch(profile({Mode.HTTP: {OTHER: flat(10, 0.001)}}))
    g = ecg(
        {"A": HTTP, "B": HTTP},
        [inv("r", EXTERNAL, "A", 0, 100, rate=1), inv("b", "A", "B", 10, 30, "r", rate=1)],
    )
    tp = predict_tail(to_batch([g]), single_profile(p), TailOptions(samples=40_000))
    assert tp.base_us[0] == 100
    for i, q in enumerate(tp.percentiles):
        assert tp.overhead_us[0, i] == pytest.approx(20 * erlang_quantile(3, q / 100), rel=0.04)
        assert tp.overhead_lo_us[0, i] <= tp.overhead_us[0, i] <= tp.overhead_hi_us[0, i]


def test_one_hop_waits_are_two_mm1_waits() -> None:
    # no latency of its own; 25 CPU-µs per crossing, exponential; 10 000 requests/s → 20 000
    # jobs/s, ρ = 0.5. Overhead = W1 + W2, two independent M/M/1 waits (atom 1 − ρ at 0,
    # else Exp(θ), θ = μ − λ): P(sum > t) = e^{−θt}·(2ρ(1 − ρ) + ρ²(1 + θt))
    p = with_exponential_sketch(profile({Mode.HTTP: {OTHER: flat(0, 25)}}))
    g = ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, rate=10_000)])
    opts = TailOptions(percentiles=(60.0, 90.0, 99.0), samples=40_000, service="latency")
    tp = predict_tail(to_batch([g]), single_profile(p), opts)
    rho, theta = 0.5, 1 / 25 - 0.02

    def tail(t: float) -> float:
        return math.exp(-theta * t) * (2 * rho * (1 - rho) + rho**2 * (1 + theta * t))

    for i, q in enumerate(opts.percentiles):
        lo, hi = 0.0, 2000.0
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if tail(mid) > 1 - q / 100 else (lo, mid)
        assert tp.overhead_us[0, i] == pytest.approx(lo, rel=0.05), q
    (st,) = tp.stations
    assert st.jobs_per_s == 20_000 and st.utilisation == pytest.approx(0.5)
    assert st.mean_wait_us == pytest.approx(rho / theta, rel=0.05)


def test_no_load_and_constant_costs_give_the_engine_overhead_at_every_percentile() -> None:
    p = profile({Mode.HTTP: {OTHER: flat(5, 0.01)}})
    g = ecg(
        {"A": HTTP, "B": HTTP, "C": HTTP},
        [
            inv("r", EXTERNAL, "A", 0, 100, rate=1),
            inv("b", "A", "B", 10, 30, "r", rate=1),
            inv("c", "A", "C", 20, 50, "r", rate=1),
        ],
    )
    b = to_batch([g])
    tp = predict_tail(b, single_profile(p), TailOptions(samples=200))
    mean = predict_batch(b, single_profile(p)).latency_overhead_us[0]
    assert np.allclose(tp.overhead_us[0], mean, atol=0.01)
    assert any("no latency distribution" in w for w in tp.warnings)


def test_saturation_order_rates_and_needed_cpu() -> None:
    # A (http, 10 CPU-µs per crossing) calls B (grpc, 40): per request A sees 4 crossings
    # (40 µs of work), B 2 (80 µs); at 1 000/s ρ_A = 0.04, ρ_B = 0.08
    p = profile({Mode.HTTP: {OTHER: flat(1, 10)}, Mode.GRPC: {OTHER: flat(1, 40)}})
    g = ecg(
        {"A": HTTP, "B": GRPC},
        [inv("r", EXTERNAL, "A", 0, 100, rate=1000), inv("b", "A", "B", 10, 30, "r", rate=1000)],
    )
    tp = predict_tail(to_batch([g]), single_profile(p), TailOptions(samples=200))
    by = {s.name: s for s in tp.stations}
    assert by["A"].utilisation == pytest.approx(0.04) and by["B"].utilisation == pytest.approx(0.08)
    assert tp.first_to_saturate is by["B"]
    assert tp.saturation_rate == pytest.approx(1000 * 0.8 / 0.08, rel=1e-6)
    assert by["A"].saturation_factor == pytest.approx(20.0, rel=1e-6)
    assert by["B"].full_factor == pytest.approx(12.5, rel=1e-6)
    assert by["B"].needed_vcpu == pytest.approx(0.08 / 0.8)


def test_saturated_sidecar_gives_infinite_latency_and_says_so() -> None:
    p = profile({Mode.HTTP: {OTHER: flat(1, 100)}})
    g = ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, rate=6000)])  # ρ = 1.2
    tp = predict_tail(to_batch([g]), single_profile(p), TailOptions(samples=100))
    assert np.isinf(tp.overhead_us).all() and tp.stations[0].saturated
    assert any("grows without bound" in w for w in tp.warnings)


def test_workers_come_from_the_profiles_capacity_and_share_the_load() -> None:
    cap = Capacity(9000.0, 100, 32, 2, 200.0, "sidecar")
    base = profile({Mode.HTTP: {OTHER: flat(1, 100)}})
    p = replace(base, modes={Mode.HTTP: replace(base.modes[Mode.HTTP], capacity=cap)})
    g = ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, rate=3000)])
    (st,) = predict_tail(to_batch([g]), single_profile(p), TailOptions(samples=100)).stations
    assert st.servers == 2 and st.utilisation == pytest.approx(0.3)


def test_graphs_add_their_rates_pairs_count_a_pair_once() -> None:
    p = profile({Mode.HTTP: {OTHER: flat(1, 10)}})
    gs = [
        ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, d, rate=1000)], name=f"g{d}")
        for d in (100, 200)
    ]
    b = to_batch(gs)
    graphs = predict_tail(b, single_profile(p), TailOptions(samples=100))
    pairs = predict_tail(b, single_profile(p), TailOptions(samples=100, load="pairs"))
    assert graphs.stations[0].jobs_per_s == 4000 and pairs.stations[0].jobs_per_s == 2000
    assert graphs.request_rate == 2000 and pairs.request_rate == 1000
    # pooled over the two graphs: the no-mesh percentiles are those of {100, 200}
    assert pairs.pooled_base_us[0] == pytest.approx(150.0)


def test_shared_cpus_queue_every_sidecar_and_the_applications() -> None:
    p = profile({Mode.HTTP: {OTHER: flat(1, 10)}})
    g = ecg(
        {"A": HTTP, "B": HTTP},
        [inv("r", EXTERNAL, "A", 0, 100, rate=1000), inv("b", "A", "B", 10, 30, "r", rate=1000)],
    )
    b = to_batch([g])
    alone = predict_tail(b, single_profile(p), TailOptions(samples=200, pod_cpus=1))
    (cpu,) = [s for s in alone.stations if s.name == "shared CPUs"]
    # 6 sidecar crossings of 10 µs per request at 1 000/s; no application work given
    assert cpu.utilisation == pytest.approx(0.06, rel=1e-3) and cpu.servers == 1
    assert any("not given" in w for w in alone.warnings)
    withapp = predict_tail(
        b, single_profile(p), TailOptions(samples=200, pod_cpus=1, app_cpu_us=300.0)
    )
    (cpu2,) = [s for s in withapp.stations if s.name == "shared CPUs"]
    assert cpu2.utilisation == pytest.approx(0.06 + 0.3, rel=1e-3)
    assert (withapp.overhead_us >= alone.overhead_us - 1e-9).all()


def test_shared_cpus_price_messages_at_the_engines_shared_cpu_rate() -> None:
    # CPU per message falls with rate (warm CPU): 30 + 4·ln(10 000 / r) CPU-µs. On one shared
    # CPU every message is priced at the shared CPU's rate (Σ crossings/s ÷ 2), as the engine
    # prices it; at 1 000/s a chain A → B has 6 crossings per request: r_eff = 3 000/s
    cpu = CostModel(30.0, rate_coef=4.0, rate_lo=100.0, rate_hi=10_000.0)
    p = profile({Mode.HTTP: {OTHER: ComponentModel(CostModel(1.0), cpu)}})
    g = ecg(
        {"A": HTTP, "B": HTTP},
        [inv("r", EXTERNAL, "A", 0, 100, rate=1000), inv("b", "A", "B", 10, 30, "r", rate=1000)],
    )
    b = to_batch([g])
    tp = predict_tail(b, single_profile(p), TailOptions(samples=200, pod_cpus=1))
    (shared,) = [s for s in tp.stations if s.name == "shared CPUs"]
    per_msg = 30.0 + 4.0 * math.log(10_000 / 3000)
    assert shared.utilisation == pytest.approx(1000 * 6 * per_msg * 1e-6, rel=1e-6)
    engine = predict_batch(b, single_profile(p), pod_cpus=1)
    assert shared.utilisation == pytest.approx(engine.cpu_vcpu[0], rel=1e-6)
    # pods with CPUs of their own: each message at its call's own rate (1 000/s)
    own = predict_tail(b, single_profile(p), TailOptions(samples=200))
    assert all(s.mean_service_us == pytest.approx(30.0 + 4.0 * math.log(10)) for s in own.stations)


def _capacity_profiles() -> tuple[Profile, Profile]:
    """100 CPU-µs a crossing at 100–1 000/s with one client; many clients measured 120
    CPU-µs a request at 4 000/s and 80 at 8 000/s: the profile without and with those runs."""
    cpu = CostModel(100.0, rate_lo=100.0, rate_hi=1000.0)
    pts = (
        CapacityPoint(0.0, 8000.0, 0.64, 0.9),
        CapacityPoint(4000.0, 4000.0, 0.48, 0.6),
    )
    cap = Capacity(8000.0, 100, 32, 1, 80.0, "shared-cpu", points=pts)
    base = profile({Mode.HTTP: {OTHER: ComponentModel(CostModel(1.0), cpu)}})
    return base, replace(base, modes={Mode.HTTP: replace(base.modes[Mode.HTTP], capacity=cap)})


def test_many_clients_make_a_crossing_cost_what_the_capacity_runs_measured() -> None:
    # one client at a time costs 100 CPU-µs a crossing at every profiled rate (100 … 1 000/s);
    # many clients measured 120 CPU-µs a request at 4 000/s and 80 at 8 000/s (60 and 40 a
    # crossing): factors 0.6 and 0.4, interpolated in log rate from 1 at 100/s, held beyond
    base, p = _capacity_profiles()
    r = np.array([50.0, 100.0, 1000.0, 4000.0, 8000.0, 16000.0])
    f = load_factor(p.modes[Mode.HTTP], r)
    t = math.log(10) / math.log(40)
    assert f == pytest.approx([1.0, 1.0, 1 - 0.4 * t, 0.6, 0.4, 0.4])
    # one hop on one shared CPU: the station's work per request follows; saturation (ρ = 1)
    # where r × 2 × 100 × f(r) = 1e6: beyond 8 000/s a request costs 80 µs → 12 500/s
    g = ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, rate=4000)])
    tp = predict_tail(to_batch([g]), single_profile(p), TailOptions(samples=100, pod_cpus=1))
    (shared,) = [s for s in tp.stations if s.name == "shared CPUs"]
    assert shared.utilisation == pytest.approx(4000 * 120e-6, rel=1e-6)
    assert shared.full_factor * tp.request_rate == pytest.approx(12_500, rel=0.01)
    # without capacity runs a crossing costs what one client's does
    plain = predict_tail(to_batch([g]), single_profile(base), TailOptions(samples=100, pod_cpus=1))
    (sh,) = [s for s in plain.stations if s.name == "shared CPUs"]
    assert sh.utilisation == pytest.approx(4000 * 200e-6, rel=1e-6)


def test_the_load_factor_is_looked_up_at_each_sidecars_own_rate() -> None:
    # issue #20, set 2: Bookinfo's sidecars were priced with the factor at the shared CPU's
    # rate (all crossings of the graph) and came out at half the CPU they used. A (in and
    # out: 2 sides a request) calls B (1 side) on one shared CPU at 2 000 requests/s: A's own
    # rate 4 000/s (factor 0.6, measured), B's 2 000/s (between 1 at 100/s and 0.6 at
    # 4 000/s); at the CPU's rate (3 sides × 2 000/s = 6 000/s) both would get 0.48
    base, p = _capacity_profiles()
    g = ecg(
        {"A": HTTP, "B": HTTP},
        [inv("r", EXTERNAL, "A", 0, 100, rate=2000), inv("b", "A", "B", 10, 30, "r", rate=2000)],
    )
    b = to_batch([g])
    own = sidecar_rates(b, "graphs")
    assert own.tolist() == [[0.0, 4000.0], [4000.0, 2000.0]]
    tp = predict_tail(b, single_profile(p), TailOptions(samples=100, pod_cpus=1))
    (shared,) = [s for s in tp.stations if s.name == "shared CPUs"]
    f_b = 1 - 0.4 * math.log(20) / math.log(40)
    assert shared.utilisation == pytest.approx(2000 * (2 * 200 * 0.6 + 200 * f_b) * 1e-6, rel=1e-6)
    # one hop: its sidecar's own rate is the request rate, as before
    one = to_batch([ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, rate=4000)])])
    assert sidecar_rates(one, "graphs").tolist() == [[0.0, 4000.0]]


def test_saturation_is_where_the_cpus_fill_with_the_clients_queued_at_each_sidecar() -> None:
    # a closed loop of 32 clients at its maximum keeps 32 requests in the system; on a shared
    # CPU they wait at each sidecar in proportion to its share of a request's CPU work, and
    # a sidecar's CPU per crossing is what the capacity runs measured with as many requests
    # in the system: 0.4 of one client's with 32 (the closed loop), 0.6 with 4 (4 000/s ×
    # 1 ms mean latency), in log requests between. A → B, 3 sides of 200 CPU-µs (one client)
    # a request: A holds 2/3 of the work (21.3 requests), B 1/3 (10.7)
    cpu = CostModel(100.0, rate_lo=100.0, rate_hi=1000.0)
    ms = tuple(1000.0 for _ in SKETCH_PROBS)
    pts = (
        CapacityPoint(0.0, 8000.0, 0.64, 0.9),
        CapacityPoint(4000.0, 4000.0, 0.48, 0.6, quantiles_us=ms),
    )
    cap = Capacity(8000.0, 100, 32, 1, 80.0, "shared-cpu", points=pts)
    base = profile({Mode.HTTP: {OTHER: ComponentModel(CostModel(1.0), cpu)}})
    p = replace(base, modes={Mode.HTTP: replace(base.modes[Mode.HTTP], capacity=cap)})
    mp = p.modes[Mode.HTTP]
    assert queued_factor(mp) == pytest.approx(0.4)
    assert queue_factor(mp, np.array([2.0, 4.0, 32.0, 64.0])) == pytest.approx([0.6, 0.6, 0.4, 0.4])
    assert queue_factor(base.modes[Mode.HTTP], np.array([4.0])) is None
    g = ecg(
        {"A": HTTP, "B": HTTP},
        [inv("r", EXTERNAL, "A", 0, 100, rate=1000), inv("b", "A", "B", 10, 30, "r", rate=1000)],
    )
    opts = TailOptions(samples=100, pod_cpus=1, clients=32)
    tp = predict_tail(to_batch([g]), single_profile(p), opts)
    (shared,) = [s for s in tp.stations if s.name == "shared CPUs"]

    def f(n: float) -> float:
        return 0.6 - 0.2 * math.log(n / 4) / math.log(8)

    full = 1e6 / (400 * f(32 * 2 / 3) + 200 * f(32 / 3))
    assert shared.full_factor * tp.request_rate == pytest.approx(full, rel=0.01)
    # at 0.8: A at 2·r, B at r, r ≈ 3 000/s — their own-rate factors
    r8 = shared.saturation_factor * tp.request_rate
    fa = 0.6 - 0.2 * math.log(2 * r8 / 4000) / math.log(2)
    fb = 1 - 0.4 * math.log(r8 / 100) / math.log(40)
    assert r8 * (2 * 200 * fa + 200 * fb) * 1e-6 == pytest.approx(0.8, rel=0.01)


def test_tiled_structure_propagates_each_copy_like_the_original() -> None:
    g = ecg(
        {"A": HTTP, "B": HTTP, "C": HTTP},
        [
            inv("r", EXTERNAL, "A", 0, 100),
            inv("b", "A", "B", 10, 30, "r"),
            inv("c", "A", "C", 50, 30, "r"),
        ],
    )
    s = structure(to_batch([g, g]))
    extra = np.array([[1.0, 2.0, 3.0, 0.0, 5.0, 0.0], [0.0, 7.0, 0.0, 4.0, 0.0, 9.0]])
    got = propagate(tiled(s, 2), extra.ravel()).new_us.reshape(2, -1)
    for c in range(2):
        assert np.array_equal(got[c], propagate(s, extra[c]).new_us)
    # the copies are laid out as the structure of the batch that repeats the graphs
    one, three = structure(to_batch([g])), structure(to_batch([g, g, g]))
    t = tiled(one, 3)
    for f in ("child_ptr", "child_idx", "graph_ptr", "start", "end", "end_idx", "pos"):
        assert np.array_equal(getattr(t, f), getattr(three, f)), f


def test_options_are_checked() -> None:
    for bad in ({"percentiles": (100.0,)}, {"threshold": 1.0}, {"samples": 5}, {"pod_cpus": 0}):
        with pytest.raises(ValueError):
            TailOptions(**bad)


def test_a_request_slow_without_the_mesh_waits_long_with_it() -> None:
    # one hop on one shared CPU at ρ ≈ 0.7; 2 % of requests take 20 ms without the mesh (a
    # stall). The extra wait is drawn at the rank of the request's no-mesh latency, so the
    # overhead grows towards the tail; drawn independently, the stalls would swamp the mesh's
    # waits at p99 and the overhead there would fall back to about the crossing's own latency
    p = profile({Mode.HTTP: {OTHER: flat(20, 50)}})
    durations = [100.0] * 98 + [20_000.0] * 2
    gs = [
        ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, d, rate=5000)], name=f"g{i}")
        for i, d in enumerate(durations)
    ]
    opts = TailOptions(
        percentiles=(50.0, 90.0, 99.0), samples=400, pod_cpus=1, app_cpu_us=40.0, load="pairs"
    )
    tp = predict_tail(to_batch(gs), single_profile(p), opts)
    (shared,) = [s for s in tp.stations if s.name == "shared CPUs"]
    assert shared.utilisation == pytest.approx(5000 * 140e-6, rel=1e-6)
    p50, p90, p99 = tp.pooled_overhead_us
    assert p50 < p90 < p99 and p99 > 1.5 * p90


def _ramp_profile() -> Profile:
    """One client's models: 100 CPU-µs a crossing at every rate. Capacity runs (32 clients):
    1 000/s with 0.5 requests in the system (500 µs through the sidecar) at 160 CPU-µs a
    request, 8 000/s with 4 (500 µs) at 80, and the closed loop (32) at 10 000/s, 40."""
    cpu = CostModel(100.0, rate_lo=100.0, rate_hi=1000.0)
    flat500 = tuple(500.0 for _ in SKETCH_PROBS)
    pts = (
        CapacityPoint(0.0, 10000.0, 0.4, 0.9),
        CapacityPoint(1000.0, 1000.0, 0.16, 0.3, quantiles_us=flat500),
        CapacityPoint(8000.0, 8000.0, 0.64, 0.9, quantiles_us=flat500),
    )
    cap = Capacity(10000.0, 100, 32, 1, 40.0, "shared-cpu", points=pts)
    base = profile({Mode.HTTP: {OTHER: ComponentModel(CostModel(1.0), cpu)}})
    return replace(base, modes={Mode.HTTP: replace(base.modes[Mode.HTTP], capacity=cap)})


def test_a_queue_longer_than_its_rates_makes_a_sidecars_requests_cheaper() -> None:
    # issue #20, set 3: one hop at 75–90 % load was priced at its rate's cost, ρ ≈ 1.03, and
    # predicted as a queue full of the 32 clients (p50 2–3× the measured); a sidecar with more
    # requests waiting handles several per wake-up (the profile's ramp: CPU per request falls
    # with the requests in the system)
    mp = _ramp_profile().modes[Mode.HTTP]
    # at 8 000/s the ramp had 4 in the system at 80 µs a request: 1 there, less beyond, never > 1
    got = queue_relief(mp, 8000.0, np.array([0.5, 4.0, 32.0]))
    assert got == pytest.approx([1.0, 1.0, 0.5])
    t = math.log(2) / math.log(8)  # 8 requests: between 4 (80 µs) and 32 (40 µs) in log n
    assert queue_relief(mp, 8000.0, np.array([8.0]))[0] == pytest.approx((80 - 40 * t) / 80)
    # at 1 000/s the ramp had 0.5 requests in the system (160 µs): with batching, relief
    # starts from one request in the system (133 µs, a third of the way from 0.5 to 4 in log
    # n) — fewer cost what one does; without it, from the rate's 160 µs
    c1 = 160 - 80 / 3
    assert queue_relief(mp, 1000.0, np.array([0.5, 1.0, 4.0]), batching=True) == pytest.approx(
        [1.0, 1.0, 80 / c1]
    )
    assert queue_relief(mp, 1000.0, np.array([1.0]))[0] == pytest.approx(c1 / 160)
    # without capacity runs nothing changes
    plain = replace(mp, capacity=None)
    assert queue_relief(plain, 8000.0, np.array([32.0])).tolist() == [1.0]


def test_a_station_priced_over_one_settles_at_the_queue_its_relief_allows() -> None:
    # one server, Poisson arrivals, constant 110 µs a job at 10 000/s: ρ 1.1 priced, so 32
    # clients fill the queue (waits ≈ 32 × 100 µs); jobs that start with ≥ 4 in the station
    # cost half: the queue settles short, and the work served is below the price
    svc = ServiceMix((110.0,), (1.0,))
    full = Station(10_000.0, 1, svc, clients=32)
    relief = tuple([1.0] * 4 + [0.5] * 29)
    eased = Station(10_000.0, 1, svc, clients=32, relief=relief)
    served: list[float] = []
    w_full = waiting_times(full, 50_000, seed=1)
    w_eased = waiting_times(eased, 50_000, seed=1, served=served)
    assert float(np.median(w_full)) > 2000.0
    assert float(np.median(w_eased)) < 500.0
    assert 55.0 < served[0] < 100.0
    with pytest.raises(ValueError):
        Station(10_000.0, 1, svc, relief=relief)  # relief needs a closed station


def test_sidecars_priced_over_one_settle_at_a_short_queue_with_relief_one_hop_does_not() -> None:
    # A → B on one shared CPU at 3 000 requests/s, 60 µs of app a request: priced at their
    # rates' costs ρ 1.08. Without relief the 32 clients fill the queue (p50 overhead ≈ 11 ms);
    # with it the sidecars' requests get cheaper as the queue grows and it settles far shorter
    p = _ramp_profile()
    g = ecg(
        {"A": HTTP, "B": HTTP},
        [inv("r", EXTERNAL, "A", 0, 100, rate=3000), inv("b", "A", "B", 10, 30, "r", rate=3000)],
    )
    o = TailOptions(percentiles=(50.0,), samples=200, pod_cpus=1, app_cpu_us=60.0, clients=32)
    on = predict_tail(to_batch([g]), single_profile(p), o)
    off = predict_tail(to_batch([g]), single_profile(p), replace(o, relief=False))
    (sh,) = [s for s in on.stations if s.name == "shared CPUs"]
    assert sh.utilisation > 1.0
    assert off.pooled_overhead_us[0] > 8000.0
    assert on.pooled_overhead_us[0] < 0.4 * off.pooled_overhead_us[0]
    assert on.served_utilisation < 1.0
    # one hop is the profile's own bed: its rate's price holds whatever its queue
    one = ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, rate=7000)])
    o1 = replace(o, app_cpu_us=70.0)
    a = predict_tail(to_batch([one]), single_profile(p), o1)
    b = predict_tail(to_batch([one]), single_profile(p), replace(o1, relief=False))
    assert a.pooled_overhead_us[0] == pytest.approx(b.pooled_overhead_us[0])


def test_a_cost_scale_scales_every_crossings_latency_and_cpu() -> None:
    # a topology's calibration (measured ÷ priced mesh CPU at a level it does not score)
    p = profile({Mode.HTTP: {OTHER: ComponentModel(CostModel(50.0), CostModel(100.0))}})
    g = ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, rate=1000)])
    o = TailOptions(percentiles=(50.0,), samples=100, pod_cpus=1, app_cpu_us=100.0)
    one = predict_tail(to_batch([g]), single_profile(p), o)
    two = predict_tail(to_batch([g]), single_profile(p), replace(o, cost_scale=2.0))
    (a,) = [s for s in one.stations if s.name == "shared CPUs"]
    (b,) = [s for s in two.stations if s.name == "shared CPUs"]
    assert a.utilisation == pytest.approx(1000 * (200 + 100) * 1e-6)
    assert b.utilisation == pytest.approx(1000 * (400 + 100) * 1e-6)
    # saturation stays the profile's (the closed loop's queue state, not the level's)
    assert b.full_factor == pytest.approx(a.full_factor)
    with pytest.raises(ValueError):
        TailOptions(cost_scale=0.0)


def test_a_shared_shape_replaces_the_gamma_of_a_requests_work_on_shared_cpus() -> None:
    # one sidecar on one shared CPU, ~0.8 busy, even arrivals: a constant shape queues as
    # SCV 0 does; one request in twenty three times as long queues the others behind it
    g = ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, rate=7_000.0)])
    b = to_batch([g])
    p = single_profile(profile({Mode.HTTP: {OTHER: flat(20.0, 45.0)}}))
    o = TailOptions(
        percentiles=(50.0, 99.0), samples=400, pod_cpus=1, app_cpu_us=20.0, arrivals=0.0
    )
    scv0 = predict_tail(b, p, replace(o, shared_scv=0.0))
    const = predict_tail(b, p, replace(o, shared_scv=1.0, shared_shape=Shape.constant()))
    assert const.stations[-1].utilisation == pytest.approx(scv0.stations[-1].utilisation)
    assert const.pooled_overhead_us.tolist() == pytest.approx(scv0.pooled_overhead_us.tolist())
    probs = (0.0, 0.95, 0.95 + 1e-9, 1.0)
    rare = Shape.from_quantiles(probs, (0.9, 0.9, 2.7, 2.7))
    slow = predict_tail(b, p, replace(o, shared_scv=0.0, shared_shape=rare))
    assert slow.pooled_overhead_us[1] > const.pooled_overhead_us[1] + 20.0
