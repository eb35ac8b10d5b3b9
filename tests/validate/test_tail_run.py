"""The tail validation's measuring loop against a scripted load (exact expectations), and what
each run records of the processes and CPUs (this process on this machine's /proc)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from meshtax.model.components import OTHER
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.stations import TailOptions
from meshtax.testbed.fortio import LoadResult, LoadSpec
from meshtax.testbed.paired import PairPolicy
from meshtax.testbed.pinning import Pinning
from meshtax.validate.tail import (
    BASE_PROBS,
    TOPOLOGY_SHARED_SCV,
    TailPoint,
    TailRun,
    predict_one_hop,
)
from meshtax.validate.tail_run import (
    GO_NETPOLL_WAKEUP_US,
    LoadPlan,
    _cpu,
    _measure,
    _options,
    one_hop_options,
    onehop_load,
    predict_one_hop_levels,
    topology_options,
)
from tests.helpers import flat, profile
from tests.profile.fakes import fake_load_result


def scripted(tops: dict[str, float], calls: list[tuple[str, float, tuple[str, ...]]]):  # type: ignore[no-untyped-def]
    def load(side: str, qps: float, secs: float, extra: tuple[str, ...]) -> LoadResult:
        calls.append((side, qps, extra))
        got = tops[side] if qps == 0 else qps
        spec = LoadSpec("x", Mode.HTTP, 100, qps, duration_s=secs)
        r = fake_load_result(spec, int(got * secs), 100.0 if side == "no_mesh" else 300.0)
        h = {"Data": [{"Start": 50e-6, "End": 150e-6, "Count": r.count}]}
        return LoadResult(
            **{**r.__dict__, "actual_qps": got, "duration_s": secs, "raw": {"DurationHistogram": h}}
        )

    return load


def test_levels_are_shares_of_whose_maximum_and_runs_keep_quantiles_and_cpu() -> None:
    calls: list[tuple[str, float, tuple[str, ...]]] = []
    load = scripted({"no_mesh": 8000.0, "mesh": 2000.0}, calls)
    ticks = iter(range(10_000))

    def cpu(side: str) -> dict[str, int]:
        n = next(ticks)
        return {"app": 1000 * n, "pods_busy": 10 * n}

    plan = LoadPlan(fractions=(0.25, 0.5), duration_s=2.0, policy=PairPolicy.fixed(2))
    top, top_mesh, points = _measure(plan, load, cpu, lambda _m: None)
    assert (top, top_mesh) == (8000.0, 2000.0)
    assert [p.rate for p in points] == [2000.0, 4000.0]  # of the no-mesh maximum
    assert all(len(p.pairs) == 2 for p in points)
    b, m = points[0].pairs[0]
    assert b.count == 4000 and b.achieved_qps == 2000.0 and len(b.quantiles_us) == len(BASE_PROBS)
    assert b.cpu_ns == {"app": 1000, "pods_busy": 10}  # after − before of one run
    assert all(extra == ("-uniform",) for _, qps, extra in calls if qps > 0)
    mesh_plan = LoadPlan(fractions=(0.5,), policy=PairPolicy.fixed(1), relative_to="mesh")
    assert _measure(mesh_plan, load, cpu, lambda _m: None)[2][0].rate == 1000.0
    # predicted on fortio's even schedule, at most one request per connection in flight
    opts = _options(plan, Pinning((0,), (1,), (1,)), 35.0, 400)
    assert opts.arrivals == 0.0 and opts.clients == 32 and opts.pod_cpus == 1
    # one hop: equal requests, the no-mesh tail's stalls drained at 1 − ρ
    one = one_hop_options(opts)
    assert (one.arrivals, one.shared_scv, one.stalls) == (0.0, 0.0, True)
    assert one.wakeup_us == GO_NETPOLL_WAKEUP_US == 1000.0  # fortio sends when it wakes


def _one_hop_level(
    fraction: float, rate: int, lo_us: float, mesh_us: float, width_us: float | None = None
) -> tuple[Profile, TailPoint, LoadPlan, Pinning]:
    """One measured one-hop level for the prediction: an http profile of two 25 µs / 50 CPU-µs
    crossings, 4 pairs of 3 s runs at ``rate`` whose no-mesh latencies are uniform in
    ``lo_us`` … ``lo_us + width_us`` (default: as wide as ``lo_us``), the mesh side's ``mesh_us``
    later, the app at 20 CPU-µs a request; the client on CPU 0, pods on CPU 1."""
    width = lo_us if width_us is None else width_us
    q = lo_us + width * np.asarray(BASE_PROBS)
    pcts = {f"p{p:g}": float(lo_us + width * p / 100) for p in (50.0, 90.0, 99.0)}
    n = 3 * rate

    def side(extra: float) -> TailRun:
        return TailRun(rate, rate, n, 3.0, pcts, tuple((q + extra).tolist()), {"app": n * 20_000})

    pt = TailPoint(fraction, float(rate), tuple((side(0), side(mesh_us)) for _ in range(4)))
    plan = LoadPlan(fractions=(fraction,), percentiles=(50.0, 90.0, 99.0))
    prof = profile({Mode.HTTP: {OTHER: flat(25, 50)}})
    return prof, pt, plan, Pinning((0,), (1,), (1,))


def test_one_hop_below_saturation_with_a_stall_free_no_mesh_side_barely_waits() -> None:
    """fortio paces its calls: a level at ρ 0.6 whose no-mesh side shows no stalls adds the
    crossings and next to no queue (Poisson arrivals of exponential requests, the model until
    set 6 of issue #20, gave its p90 ≈ 0.5 ms of waits here)."""
    # two crossings: 50 µs on the path, 100 CPU-µs (on one CPU: at least 100 µs more); no-mesh
    # latencies uniform in 100…200 µs; the pods' CPU: 5000/s × (100 + 20) µs = 0.6 busy
    prof, pt, plan, pinning = _one_hop_level(0.5, 5000, 100.0, 300.0)
    (got,) = predict_one_hop_levels([pt], prof, Mode.HTTP, 100, plan, pinning)
    assert got.predicted is not None
    assert got.predicted.utilisation == pytest.approx(0.6, rel=0.02)
    p90 = got.predicted.overhead["p90"][0]
    assert 100 <= p90 < 150
    poisson = _options(replace(plan, arrivals=1.0), pinning, 20.0, 400)
    base = [x for b, _ in pt.pairs for x in b.quantiles_us]
    old = predict_one_hop(prof, SidecarConfig(Mode.HTTP), 100, 5000.0, base, poisson)
    assert old.overhead["p90"][0] > 3 * p90


def test_one_hop_whose_client_idles_between_responses_sends_in_bunches() -> None:
    """Issue #20, set 8: at 4 000/s a send is due every 250 µs, but a request is back in
    80 µs without the mesh and 130 with it, so fortio's scheduler is idle and sleeps its
    millisecond: about four requests leave together, and through the sidecar (120 CPU-µs a
    request on the pods' CPU, 20 without) the last of them waits ≈ 360 µs, not 60. On the
    even schedule alone (set 7's model) nothing queues and p90 is the crossings' 100 µs."""
    prof, pt, plan, pinning = _one_hop_level(0.25, 4000, 60.0, 150.0, width_us=40.0)
    (got,) = predict_one_hop_levels([pt], prof, Mode.HTTP, 100, plan, pinning)
    assert got.predicted is not None
    assert got.predicted.utilisation == pytest.approx(0.48, rel=0.02)
    p90 = got.predicted.overhead["p90"][0]
    assert 300 < p90 < 500
    base = [x for b, _ in pt.pairs for x in b.quantiles_us]
    on_time = replace(one_hop_options(_options(plan, pinning, 20.0, len(base))), wakeup_us=None)
    even = predict_one_hop(prof, SidecarConfig(Mode.HTTP), 100, 4000.0, base, on_time)
    assert even.overhead["p90"][0] < 150 < p90 / 2


def test_passes_repeat_every_level_after_an_unrecorded_settling_run() -> None:
    calls: list[tuple[str, float, tuple[str, ...]]] = []
    load = scripted({"no_mesh": 8000.0, "mesh": 2000.0}, calls)
    plan = LoadPlan(
        fractions=(0.25, 0.5), duration_s=2.0, policy=PairPolicy.fixed(1), passes=2, settle_s=0.5
    )
    _, _, points = _measure(plan, load, lambda _s: {}, lambda _m: None)
    assert [p.passes for p in points] == [(1, 1), (1, 1)]
    assert all(len(p.pairs) == 2 for p in points)  # settling runs are not recorded
    fixed = [(side, qps) for side, qps, _ in calls if qps > 0]
    # pass 1: 25 % (settle both sides, a pair), 50 % (the same); pass 2 again, each level's
    # second pair in the other order (the alternation continues over the passes)
    assert fixed == [
        *[("no_mesh", 2000.0), ("mesh", 2000.0), ("no_mesh", 2000.0), ("mesh", 2000.0)],
        *[("no_mesh", 4000.0), ("mesh", 4000.0), ("no_mesh", 4000.0), ("mesh", 4000.0)],
        *[("no_mesh", 2000.0), ("mesh", 2000.0), ("mesh", 2000.0), ("no_mesh", 2000.0)],
        *[("no_mesh", 4000.0), ("mesh", 4000.0), ("mesh", 4000.0), ("no_mesh", 4000.0)],
    ]
    assert (
        points[0].pairs[0][0].t_start
        < points[1].pairs[0][0].t_start
        < points[0].pairs[1][0].t_start
    )
    one = LoadPlan(fractions=(0.25,), policy=PairPolicy.fixed(2))
    assert _measure(one, load, lambda _s: {}, lambda _m: None)[2][0].passes == ()
    with pytest.raises(ValueError):
        LoadPlan(passes=0)


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")
def test_a_run_records_cpu_run_queue_waits_and_busy_cpus() -> None:
    read = _cpu({"mesh": {"app": [os.getpid()], "sidecar": []}}, Pinning((0,), (0,), (0,)))
    got = read("mesh")
    assert set(got) == {
        "app",
        "sidecar",
        "app_wait",
        "sidecar_wait",
        "pods_busy",
        "pods_total",
        "client_busy",
        "client_total",
        "pods_steal",
        "client_steal",
        "pods_irq",
        "client_irq",
    }
    assert got["app"] > 0 and got["sidecar"] == 0 and got["pods_total"] >= got["pods_busy"] >= 0
    assert got["pods_total"] >= got["pods_steal"] >= 0
    assert got["pods_busy"] >= got["pods_irq"] >= 0


def test_a_run_counts_a_process_in_every_group_it_is_in() -> None:
    me = [os.getpid()]
    groups = {"mesh": {"app": me, "sidecar": [], "app:x": me, "sidecar:x": []}}
    got = _cpu(groups, Pinning((0,), (0,), (0,)))("mesh")
    assert got["app:x"] > 0 and got["sidecar:x"] == 0 and "app:x_wait" in got
    # one read per process: both groups see the same reading
    assert got["app"] == got["app:x"] and got["app_wait"] == got["app:x_wait"]


def test_a_run_that_kept_every_latency_sketches_those_not_the_buckets() -> None:
    """With fortio's access log a run's quantiles are its requests' own: a no-mesh side whose
    requests all took 1.15–1.25 ms, which the histogram's ]1000, 2000] µs bucket would spread
    up to 2 ms (the tail's p99 read 1.99 ms instead of 1.25)."""
    lat = np.linspace(1150.0, 1250.0, 4000)

    def load(side: str, qps: float, secs: float, extra: tuple[str, ...]) -> LoadResult:
        spec = LoadSpec("x", Mode.HTTP, 100, qps, duration_s=secs)
        r = fake_load_result(spec, 4000, 1200.0)
        h = {"Data": [{"Start": 1150e-6, "End": 2000e-6, "Count": r.count}]}
        kept = lat if side == "no_mesh" else np.zeros(0)
        return replace(r, actual_qps=qps or 2000.0, raw={"DurationHistogram": h}, latencies_us=kept)

    plan = LoadPlan(fractions=(0.5,), duration_s=2.0, policy=PairPolicy.fixed(1))
    _, _, (pt,) = _measure(plan, load, lambda _s: {}, lambda _m: None)
    b, m = pt.pairs[0]
    assert max(b.quantiles_us) <= 1250.0 and min(b.quantiles_us) >= 1150.0
    assert max(m.quantiles_us) > 1900.0  # no log: the bucket's linear interpolation
    # the run with a log keeps the histogram's reading beside its own, for the bucket error
    assert max(b.histogram_quantiles_us) > 1900.0 and m.histogram_quantiles_us == ()
    assert TailRun.from_dict(b.to_dict()) == b and "histogram_quantiles_us" not in m.to_dict()


def test_one_hop_keeps_an_access_log_only_when_asked_and_never_in_closed_loops(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Set 9: fortio's buckets misread one hop's p90/p99 overhead by ~5 %, while the log cost the
    client 17–47 % more CPU a request at 15 728/s: off by default; asked, a fixed-rate run keeps
    every request's latency, a closed loop (only its rate is used) never."""
    seen: list[tuple[str, float, str]] = []

    class Bed:
        def load(self, target: str, mode: Mode, size: int, qps: float = 0.0, **kw: Any) -> Any:
            seen.append((target, qps, kw["access_log"]))
            return fake_load_result(LoadSpec(target, mode, size, qps, duration_s=1.0), 10, 100.0)

    assert LoadPlan().onehop_log is False
    targets = {"no_mesh": "d", "mesh": "m"}
    onehop_load(Bed(), targets, Mode.HTTP, 100, 32, None)("mesh", 5000.0, 3.0, ("-uniform",))
    assert seen.pop() == ("m", 5000.0, "")
    load = onehop_load(Bed(), targets, Mode.HTTP, 100, 32, tmp_path)
    load("no_mesh", 0.0, 3.0, ())
    load("mesh", 5000.0, 3.0, ("-uniform",))
    load("no_mesh", 5000.0, 3.0, ("-uniform",))
    assert seen[0] == ("d", 0.0, "")
    assert seen[1] == ("m", 5000.0, str(tmp_path / "mesh-access.jsonl"))
    assert seen[2] == ("d", 5000.0, str(tmp_path / "no_mesh-access.jsonl"))


def test_a_topology_is_priced_from_the_ramp_at_its_sidecars_own_rates_one_hop_is_not() -> None:
    # issue #20, set 11: Bookinfo's sidecars at the ramp's sidecar CPU at their own rates
    o = topology_options(TailOptions(pod_cpus=1, clients=32), 600.0)
    assert o.ramp_price and o.jitter_us == 600.0 and o.shared_scv == TOPOLOGY_SHARED_SCV
    assert not one_hop_options(TailOptions(pod_cpus=1, clients=32)).ramp_price


def test_a_topologys_ramp_price_reads_the_shape_one_hops_does_not_price_from_the_ramp() -> None:
    from meshtax.predict.ramp_price import RAMP_SHAPE

    assert topology_options(TailOptions(pod_cpus=1, clients=32), 600.0).ramp_shape == RAMP_SHAPE
    assert not one_hop_options(TailOptions(pod_cpus=1, clients=32)).ramp_price


def test_one_hop_and_a_topology_both_bound_the_shared_cpus_wait_by_the_ramps_queue() -> None:
    # issue #20, set 12: the one rule (predict.ramp_queue.bounded_by_ramp) for both
    assert one_hop_options(TailOptions(pod_cpus=1, clients=32)).ramp_queue
    assert topology_options(TailOptions(pod_cpus=1, clients=32), 600.0).ramp_queue


def test_both_read_the_bound_from_the_ramps_queue_pooled_over_profiles() -> None:
    # issue #20, set 18 (s18-pooled-queue held): the pooled table, not the profile's own runs
    from meshtax.predict.ramp_queue import POOLED_QUEUE

    one = one_hop_options(TailOptions(pod_cpus=1, clients=32))
    assert one.ramp_pooled == POOLED_QUEUE
    assert topology_options(TailOptions(pod_cpus=1, clients=32), 600.0).ramp_pooled == POOLED_QUEUE
