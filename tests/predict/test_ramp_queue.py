"""The ramp's queue as a bound on a station's modelled wait on shared CPUs (issue #20, the
variant registered before set 12: ``TailOptions.ramp_queue``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from meshtax.model.capacity import SKETCH_PROBS, Capacity, CapacityPoint
from meshtax.model.components import OTHER
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.ecg import to_batch
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.engine import single_profile
from meshtax.predict.ramp_queue import (
    POOL_FRACTIONS,
    POOLED_QUEUE,
    RampQueue,
    bounded_by_ramp,
    pooled_queue,
    queue_form,
    ramp_draws,
    ramp_queue,
)
from meshtax.predict.stations import TailOptions
from meshtax.predict.tail import predict_tail
from tests.helpers import EXTERNAL, ecg, inv, profile

HTTP = SidecarConfig(Mode.HTTP)
PR = np.asarray(SKETCH_PROBS)
DIRECT = 100.0 + 50.0 * PR  # the no-mesh runs' quantiles (µs), the same at every rate


def _ramp(overheads: dict[float, np.ndarray], closed: float = 10_000.0) -> Capacity:
    """A closed loop of ``closed``/s and, per fixed rate, a run without the sidecar and one
    through it whose quantiles are the direct ones + ``overheads[rate]``."""
    pts = [CapacityPoint(0.0, closed, 0.5, 1.0)]
    for r, ov in overheads.items():
        pts.append(CapacityPoint(r, r, 0.1, 0.3, quantiles_us=tuple(DIRECT + ov)))
        pts.append(CapacityPoint(r, r, 0.0, 0.2, meshed=False, quantiles_us=tuple(DIRECT)))
    return Capacity(closed, 100, 32, 1, 40.0, "shared-cpu", points=tuple(pts))


def _profile(cap: Capacity | None) -> Profile:
    p = profile({Mode.HTTP: {OTHER: ComponentModel(CostModel(20.0), CostModel(45.0))}})
    return replace(p, modes={Mode.HTTP: replace(p.modes[Mode.HTTP], capacity=cap)})


def test_the_queue_is_each_runs_overhead_above_the_lowest_rates_in_requests_worth() -> None:
    flat = np.full(PR.size, 80.0)  # the crossing itself, unloaded
    busy = 80.0 + 400.0 * PR  # 0 → 400 µs more from rank 0 to 1
    dip = 80.0 - 30.0 * (PR > 0.5)  # below the floor: no queue, not a negative one
    cap = _ramp({200.0: flat, 5000.0: dip, 8000.0: busy})
    rq = ramp_queue(_profile(cap).modes[Mode.HTTP])
    assert rq is not None
    assert rq.fractions.tolist() == pytest.approx([0.02, 0.5, 0.8])
    assert rq.queue[0].tolist() == pytest.approx([0.0] * PR.size)
    assert rq.queue[1].tolist() == pytest.approx([0.0] * PR.size)
    # 400 µs × 10 000/s = 4 requests' worth at rank 1
    assert rq.queue[2].tolist() == pytest.approx((400.0 * PR * 1e-2).tolist())
    # linear in the fraction between runs, held beyond the last and 0 below the first
    assert rq.at(0.65, np.array([1.0]))[0] == pytest.approx(2.0)
    assert rq.at(0.95, np.array([0.5]))[0] == pytest.approx(2.0)
    assert rq.at(0.001, np.array([1.0]))[0] == pytest.approx(0.0)


def test_a_quantile_function_never_falls_with_the_rank() -> None:
    wobbly = 80.0 + np.where(PR > 0.9, 100.0, 300.0) * (PR > 0.2)
    cap = _ramp({200.0: np.full(PR.size, 80.0), 8000.0: wobbly})
    rq = ramp_queue(_profile(cap).modes[Mode.HTTP])
    assert rq is not None
    assert np.all(np.diff(rq.queue[1]) >= 0)
    assert rq.queue[1][-1] == pytest.approx(3.0)


def test_no_ramp_no_queue() -> None:
    assert ramp_queue(_profile(None).modes[Mode.HTTP]) is None
    one = _ramp({200.0: np.full(PR.size, 80.0)})  # one run: no rise to read
    assert ramp_queue(_profile(one).modes[Mode.HTTP]) is None


def _one_hop() -> TailOptions:
    return TailOptions(
        percentiles=(50.0, 90.0, 99.0),
        samples=400,
        pod_cpus=1,
        app_cpu_us=10.0,
        clients=32,
        arrivals=0.0,
        shared_scv=1.0,
    )


def test_a_short_queue_on_the_ramp_bounds_a_busy_cpus_modelled_wait() -> None:
    # one sidecar on one shared CPU, priced ~0.9 busy: the G/G/1 queue of 32 clients builds;
    # a ramp that showed no queue at that load keeps the overhead to the crossing itself,
    # one that showed a long one leaves the model's wait as it is; saturation is unchanged
    g = ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, rate=9_000.0)])
    b = to_batch([g])
    o = _one_hop()
    none = _profile(_ramp({200.0: np.full(PR.size, 80.0), 9_500.0: np.full(PR.size, 80.0)}))
    long = _profile(_ramp({200.0: np.zeros(PR.size), 9_500.0: np.full(PR.size, 1e6)}))
    free = predict_tail(b, single_profile(none), o)
    short = predict_tail(b, single_profile(none), replace(o, ramp_queue=True))
    loose = predict_tail(b, single_profile(long), replace(o, ramp_queue=True))
    assert free.stations[-1].utilisation > 0.8
    assert free.pooled_overhead_us[2] > 300.0  # the queue the model builds
    assert short.pooled_overhead_us[2] < 0.5 * free.pooled_overhead_us[2]
    # what is left: the request's own sidecar work on the one CPU (2 crossings × 45 CPU-µs,
    # more than their 2 × 20 µs latency — the engine's placement bound)
    assert short.pooled_overhead_us[2] == pytest.approx(90.0, abs=1.0)
    assert loose.pooled_overhead_us.tolist() == pytest.approx(free.pooled_overhead_us.tolist())
    assert short.stations[-1].full_factor == pytest.approx(free.stations[-1].full_factor)
    # the prediction says whether the bound was used
    assert free.queue_bound == ""
    assert short.queue_bound.startswith("used: the shared CPUs at ")
    bare = predict_tail(b, single_profile(_profile(None)), replace(o, ramp_queue=True))
    assert bare.queue_bound.startswith("not used: the profile has no capacity ramp")


def test_heavy_reads_between_two_runs_in_one_over_one_minus_the_fraction() -> None:
    # issue #20, set 16's option: a queue grows as ρ/(1 − ρ), so between runs at 0.5 and 0.8
    # of the closed loop the fraction 0.65 is 2/7 of the way, not half
    busy = 80.0 + 400.0 * PR
    cap = _ramp({200.0: np.full(PR.size, 80.0), 5000.0: 80.0 + 200.0 * PR, 8000.0: busy})
    rq = ramp_queue(_profile(cap).modes[Mode.HTTP])
    assert rq is not None
    one = np.array([1.0])
    assert rq.at(0.65, one)[0] == pytest.approx(3.0)
    assert rq.at(0.65, one, heavy=True)[0] == pytest.approx(2.0 + 2.0 * (2.0 / 7.0))
    # at the runs themselves both read the run
    assert rq.at(0.8, one, heavy=True)[0] == pytest.approx(4.0)
    assert rq.at(0.5, one, heavy=True)[0] == pytest.approx(2.0)


def test_on_the_profiles_own_bed_the_bound_is_read_at_its_measured_closed_loop() -> None:
    # one sidecar on one shared CPU at 6 000/s; the ramp's closed loop measured 20 000/s, its
    # run at 0.2 of it queued nothing, its run at 0.3 (6 000/s, this rate) a long one. Read at
    # the bed's own maximum the level is that run (the model's queue stands); at the model's
    # predicted saturation (~5× the rate here) the quiet one (the crossing alone).
    g = ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, rate=6_000.0)])
    b = to_batch([g])
    o = replace(_one_hop(), ramp_queue=True)
    flat = np.full(PR.size, 80.0)
    cap = _ramp({200.0: flat, 4_000.0: flat, 6_000.0: 80.0 + 5000.0 * PR}, closed=20_000.0)
    prof = single_profile(_profile(cap))
    pred = predict_tail(b, prof, o)
    own = predict_tail(b, prof, replace(o, ramp_own_bed=True))
    assert 1 / pred.stations[-1].full_factor < 0.21  # the model's saturation: > 28 500/s
    assert own.stations[-1].full_factor == pytest.approx(pred.stations[-1].full_factor)
    assert own.queue_bound.startswith("used: the shared CPUs at 30% ")
    assert own.pooled_overhead_us[2] > pred.pooled_overhead_us[2] + 200.0


def test_pooled_the_queue_is_each_fraction_and_ranks_median_over_the_profiles() -> None:
    # issue #20, set 18's option: three profiles' ramps (closed loops 10 000 and 20 000/s),
    # pooled at their runs' fractions: the middle one's queue at each, whatever the closed loop
    flat = np.full(PR.size, 80.0)
    qs = []
    for top, closed in ((100.0, 10_000.0), (500.0, 10_000.0), (100.0, 20_000.0)):
        rate = 0.8 * closed
        cap = _ramp({0.02 * closed: flat, rate: 80.0 + top * PR}, closed=closed)
        rq = ramp_queue(_profile(cap).modes[Mode.HTTP])
        assert rq is not None
        qs.append(rq)
    pooled = pooled_queue(qs, fractions=(0.02, 0.8))
    assert pooled.fractions.tolist() == pytest.approx([0.02, 0.8])
    # requests' worth at rank 1: 1, 5 and 2 (100 µs × 20 000/s) — the median 2, not the mean
    assert pooled.queue[1][-1] == pytest.approx(2.0)
    assert pooled.queue[0].tolist() == pytest.approx([0.0] * PR.size)
    assert np.all(np.diff(pooled.queue[1]) >= 0)
    back = RampQueue.from_table(pooled.table())
    assert np.allclose(back.queue, pooled.queue) and np.allclose(back.fractions, pooled.fractions)
    with pytest.raises(ValueError):
        RampQueue.from_table(((0.5,), ((1.0,) * PR.size,)))


def test_a_pooled_table_replaces_the_profiles_own_runs_in_the_bound() -> None:
    # the profile's own ramp showed no queue at 0.95 of its closed loop; a pooled table that
    # queued 1e4 requests' worth there leaves the model's wait standing, one of 0 bounds it
    g = ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, rate=9_000.0)])
    b = to_batch([g])
    o = replace(_one_hop(), ramp_queue=True)
    flat = np.full(PR.size, 80.0)
    prof = single_profile(_profile(_ramp({200.0: flat, 9_500.0: flat})))
    own = predict_tail(b, prof, o)
    free = predict_tail(b, prof, replace(o, ramp_queue=False))
    long = ((0.02, 0.95), ((0.0,) * PR.size, (1e4,) * PR.size))
    zero = ((0.02, 0.95), ((0.0,) * PR.size, (0.0,) * PR.size))
    pooled_long = predict_tail(b, prof, replace(o, ramp_pooled=long))
    pooled_zero = predict_tail(b, prof, replace(o, ramp_pooled=zero))
    assert own.pooled_overhead_us[2] < 0.5 * free.pooled_overhead_us[2]
    assert pooled_long.pooled_overhead_us.tolist() == pytest.approx(
        free.pooled_overhead_us.tolist()
    )
    assert pooled_zero.pooled_overhead_us.tolist() == pytest.approx(own.pooled_overhead_us.tolist())
    assert pooled_long.stations[-1].full_factor == pytest.approx(own.stations[-1].full_factor)


def test_the_bound_reads_this_machines_pooled_queue_unless_given_a_table() -> None:
    # issue #20, set 18: s18-pooled-queue held — bounded_by_ramp reads POOLED_QUEUE (the eight
    # profiles' median), so a profile whose own runs queued nothing is still bounded by it
    assert POOLED_QUEUE[0] == POOL_FRACTIONS
    rq = RampQueue.from_table(POOLED_QUEUE)
    assert np.all(np.diff(rq.queue, axis=1) >= 0)  # each row a quantile function
    assert rq.at(0.9, np.array([0.9]))[0] == pytest.approx(28.88, abs=0.01)
    g = ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, rate=9_000.0)])
    b = to_batch([g])
    flat = np.full(PR.size, 80.0)
    prof = single_profile(_profile(_ramp({200.0: flat, 9_500.0: flat})))
    o = _one_hop()
    assert bounded_by_ramp(o).ramp_pooled == POOLED_QUEUE
    own = predict_tail(b, prof, replace(o, ramp_queue=True))
    model = predict_tail(b, prof, bounded_by_ramp(o))
    table = predict_tail(b, prof, replace(o, ramp_queue=True, ramp_pooled=POOLED_QUEUE))
    assert model.pooled_overhead_us.tolist() == pytest.approx(table.pooled_overhead_us.tolist())
    assert model.pooled_overhead_us[2] > own.pooled_overhead_us[2] + 50.0
    assert "pooled capacity ramps" in model.queue_bound  # says which ramp bounds it
    assert "the profile's capacity ramp" in own.queue_bound
    given = ((0.02, 0.95), ((0.0,) * PR.size, (0.0,) * PR.size))
    assert bounded_by_ramp(replace(o, ramp_pooled=given)).ramp_pooled == given


def _repeated(cap: Capacity, again: dict[float, list[np.ndarray]]) -> Capacity:
    """``cap`` with more draws at its rates: per rate, each overhead a run without the
    sidecar then one through it (``Capacity.repeats``), achieving ``achieved`` of the rate."""
    reps: list[CapacityPoint] = []
    for r, ovs in again.items():
        for ov in ovs:
            reps.append(CapacityPoint(r, r, 0.0, 0.2, meshed=False, quantiles_us=tuple(DIRECT)))
            reps.append(CapacityPoint(r, r, 0.1, 0.3, quantiles_us=tuple(DIRECT + ov)))
    return replace(cap, repeats=tuple(reps))


def test_repeated_rates_read_the_median_of_their_draws() -> None:
    # issue #20, set 19: the ramp's run at 0.8 queued 400 µs at rank 1 (4 requests' worth),
    # its two repeats 100 and 200: with repeats the row is their median, 2 requests' worth
    flat = np.full(PR.size, 80.0)
    cap = _ramp({200.0: flat, 8000.0: 80.0 + 400.0 * PR})
    more = _repeated(cap, {8000.0: [80.0 + 100.0 * PR, 80.0 + 200.0 * PR]})
    mp = _profile(more).modes[Mode.HTTP]
    single = ramp_queue(mp)
    pooled = ramp_queue(mp, repeats=True)
    assert single is not None and pooled is not None
    assert single.queue[1][-1] == pytest.approx(4.0) and single.draws == (1, 1)
    assert pooled.queue[1].tolist() == pytest.approx((200.0 * PR * 1e-2).tolist())
    assert pooled.draws == (1, 3) and pooled.fractions.tolist() == pytest.approx([0.02, 0.8])
    draws = ramp_draws(mp, repeats=True)
    assert [len(g) for g in draws] == [1, 3]
    assert [row[-1] for _, row in draws[1]] == pytest.approx([4.0, 1.0, 2.0])
    # a profile without repeats reads as before
    plain = ramp_queue(_profile(cap).modes[Mode.HTTP], repeats=True)
    assert plain is not None and np.array_equal(plain.queue, single.queue)


def test_a_profile_with_repeats_bounds_with_its_own_draws_else_the_table() -> None:
    # issue #20, set 19's option ramp_repeats: ahead of a pooled table when the profile has
    # repeats (the median of its three draws: none queued), the table when it has not
    g = ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, rate=9_000.0)])
    b = to_batch([g])
    flat = np.full(PR.size, 80.0)
    cap = _ramp({200.0: flat, 9_500.0: flat})
    more = _repeated(cap, {9_500.0: [flat, 80.0 + 1e6 * PR]})
    long = ((0.02, 0.95), ((0.0,) * PR.size, (1e4,) * PR.size))
    o = replace(_one_hop(), ramp_queue=True, ramp_pooled=long, ramp_repeats=True)
    own = predict_tail(b, single_profile(_profile(more)), o)
    table = predict_tail(b, single_profile(_profile(cap)), o)
    free = predict_tail(b, single_profile(_profile(more)), replace(o, ramp_queue=False))
    off = predict_tail(b, single_profile(_profile(more)), replace(o, ramp_repeats=False))
    assert own.pooled_overhead_us[2] < 0.5 * free.pooled_overhead_us[2]
    assert table.pooled_overhead_us.tolist() == pytest.approx(free.pooled_overhead_us.tolist())
    assert off.pooled_overhead_us.tolist() == pytest.approx(free.pooled_overhead_us.tolist())
    assert "the median of up to 3 runs a rate" in own.queue_bound  # says which bounds it
    assert "pooled capacity ramps" in table.queue_bound


def _formed(k: float, rates: tuple[float, ...], closed: float = 10_000.0) -> Capacity:
    """A ramp whose draws at ``rates`` queue exactly k × f/(1 − f) × −ln(1 − u) requests'
    worth (f = rate ÷ ``closed``), above a flat crossing at 200/s."""
    g = -np.log1p(-np.minimum(PR, 0.999))
    flat = np.full(PR.size, 80.0)
    ovs = {r: 80.0 + k * (r / closed) / (1 - r / closed) * g * 1e6 / closed for r in rates}
    return _ramp({200.0: flat, **ovs}, closed)


def test_the_queue_form_is_one_constant_fitted_on_the_ramps_top_draws() -> None:
    # issue #20, set 21's candidate: k × f/(1 − f) × −ln(1 − u), k from every draw at ≥ half
    # the closed loop; held beyond the highest fraction fitted and beyond rank 0.999
    cap = _formed(1.5, (2_500.0, 5_000.0, 7_500.0, 9_000.0))
    form = queue_form(_profile(cap).modes[Mode.HTTP])
    assert form is not None
    assert form.k == pytest.approx(1.5, rel=1e-6)
    assert form.top == pytest.approx(0.9) and form.draws == 3  # the 0.25 run is not fitted
    rq = form.ramp()
    assert rq.at(0.75, np.array([0.9]))[0] == pytest.approx(1.5 * 3 * np.log(10), rel=1e-3)
    assert rq.at(0.99, np.array([0.9]))[0] == pytest.approx(1.5 * 9 * np.log(10), rel=1e-3)
    assert rq.at(0.9, np.array([1.0]))[0] == pytest.approx(1.5 * 9 * np.log(1000), rel=1e-3)
    # a noisy draw moves the one constant, not one cell: the 0.9 draw doubled at every rank
    twice = 80.0 + 2 * 1.5 * 9 * -np.log1p(-np.minimum(PR, 0.999)) * 100.0  # 100 µs a request
    noisy = queue_form(_profile(_repeated(cap, {9_000.0: [twice]})).modes[Mode.HTTP])
    assert noisy is not None and noisy.draws == 4 and 1.5 < noisy.k < 3.0
    # too few draws at ≥ half the closed loop, or none that queued: no form
    assert queue_form(_profile(_formed(1.5, (2_500.0, 5_000.0, 9_000.0))).modes[Mode.HTTP]) is None
    assert queue_form(_profile(_formed(0.0, (5_000.0, 7_500.0, 9_000.0))).modes[Mode.HTTP]) is None
    assert queue_form(None) is None


def test_with_the_form_the_bound_is_the_profiles_own_ahead_of_the_table() -> None:
    # issue #20, set 21's option ramp_form: a profile whose top draws queued little bounds the
    # busy CPU's wait with its own form although the table would not bind; a profile without
    # 3 draws at ≥ half its closed loop keeps the table; the sentence says which
    g = ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, rate=9_000.0)])
    b = to_batch([g])
    long = ((0.02, 0.95), ((0.0,) * PR.size, (1e4,) * PR.size))
    o = replace(_one_hop(), ramp_queue=True, ramp_pooled=long)
    small = _profile(_formed(0.01, (5_000.0, 7_500.0, 9_500.0)))
    few = _profile(_formed(0.01, (5_000.0, 9_500.0)))
    free = predict_tail(b, single_profile(small), replace(o, ramp_queue=False))
    table = predict_tail(b, single_profile(small), o)
    own = predict_tail(b, single_profile(small), replace(o, ramp_form=True))
    fallback = predict_tail(b, single_profile(few), replace(o, ramp_form=True))
    assert table.pooled_overhead_us.tolist() == pytest.approx(free.pooled_overhead_us.tolist())
    assert own.pooled_overhead_us[2] < 0.5 * free.pooled_overhead_us[2]
    assert fallback.pooled_overhead_us.tolist() == pytest.approx(free.pooled_overhead_us.tolist())
    assert "own queue form (0.01 × f/(1 − f)" in own.queue_bound
    assert "pooled capacity ramps" in fallback.queue_bound
    assert own.stations[-1].full_factor == pytest.approx(table.stations[-1].full_factor)
