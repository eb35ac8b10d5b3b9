"""The tail model's ramp price: a topology's sidecars priced from the profile's capacity ramp at
their own rates (issue #20, set 11)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from meshtax.model.capacity import Capacity, CapacityPoint
from meshtax.model.components import OTHER
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.ecg import EcgBatch, to_batch
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.engine import single_profile
from meshtax.predict.load_factor import closed_loop_us, ramp_sidecar_us
from meshtax.predict.ramp_price import (
    RAMP_SHAPE,
    closed_loop_scale,
    own_shape,
    priced_from_ramp,
    ramp_price,
)
from meshtax.predict.stations import TailOptions
from meshtax.predict.tail import predict_tail
from tests.helpers import EXTERNAL, ecg, inv, profile

HTTP = SidecarConfig(Mode.HTTP)


def _ramp_profile() -> tuple[Profile, Profile]:
    """One client's models: a crossing's CPU falls with the rate (30 + 10·ln(10 000 / r) µs,
    the warmer CPU). The ramp through the sidecar: 160 CPU-µs a request at 1 000/s, 80 at
    8 000/s (a no-mesh run and the closed loop are not part of it). Without and with it."""
    cpu = CostModel(30.0, rate_coef=10.0, rate_lo=100.0, rate_hi=10_000.0)
    base = profile({Mode.HTTP: {OTHER: ComponentModel(CostModel(1.0), cpu)}})
    pts = (
        CapacityPoint(0.0, 10_000.0, 0.4, 0.9),
        CapacityPoint(1000.0, 1000.0, 0.16, 0.3),
        CapacityPoint(1000.0, 1000.0, 0.0, 0.2, meshed=False),
        CapacityPoint(8000.0, 8000.0, 0.64, 0.9),
    )
    cap = Capacity(10_000.0, 100, 32, 1, 40.0, "shared-cpu", points=pts)
    mp = replace(base.modes[Mode.HTTP], capacity=cap)
    return base, replace(base, modes={Mode.HTTP: mp})


def test_the_ramps_sidecar_cpu_is_interpolated_in_log_rate_and_held_beyond() -> None:
    base, p = _ramp_profile()
    got = ramp_sidecar_us(p.modes[Mode.HTTP], np.array([500.0, 1000.0, 2000.0, 8000.0, 2e4]))
    assert got is not None
    assert got.tolist() == pytest.approx([160.0, 160.0, 160.0 - 80.0 / 3, 80.0, 80.0])
    assert ramp_sidecar_us(base.modes[Mode.HTTP], np.array([1000.0])) is None


@pytest.mark.parametrize(
    ("rate", "want"),
    [
        (1000.0, 40.0 * 2.0 * 0.1**-0.5),  # the shape, the 1 000/s run left out
        (100.0, 40.0 * 2.0 * 0.01**-0.5),  # below the ramp: the shape, not held
        (2500.0, 160.0),  # a quarter of the closed loop's 10 000/s: the shape
        (5000.0, 160.0 - 80.0 * math.log(2.0) / math.log(3.2)),  # towards the 8 000/s run
        (8000.0, 80.0),
        (2e4, 80.0),
    ],
)
def test_a_ramp_shape_prices_below_a_quarter_of_the_closed_loop(rate: float, want: float) -> None:
    # closed loop 10 000/s at 40 CPU-µs a request; shape 2 × (r ÷ 10 000)^−0.5
    _, p = _ramp_profile()
    got = ramp_sidecar_us(p.modes[Mode.HTTP], np.array([rate]), (2.0, -0.5))
    assert got is not None
    assert float(got[0]) == pytest.approx(want, rel=1e-12)


def test_a_ramp_shape_is_refused_unless_positive_and_not_rising() -> None:
    for bad in ((0.0, -0.3), (1.0, 0.2), (math.inf, -0.3)):
        with pytest.raises(ValueError, match="ramp_shape"):
            TailOptions(ramp_shape=bad)


def _a_calls_b() -> tuple[EcgBatch, TailOptions]:
    """A (in and out: 2 sides a request, own rate 2 000/s) calls B (1 side, 1 000/s) on one
    shared CPU at 1 000 requests/s, with 100 µs of app CPU a request."""
    g = ecg(
        {"A": HTTP, "B": HTTP},
        [inv("r", EXTERNAL, "A", 0, 100, rate=1000), inv("b", "A", "B", 10, 30, "r", rate=1000)],
    )
    return to_batch([g]), TailOptions(
        percentiles=(50.0,), samples=100, pod_cpus=1, app_cpu_us=100.0
    )


def test_a_topologys_sidecars_cost_the_ramps_sidecar_at_their_own_rates() -> None:
    # A (in and out: 2 sides a request, own rate 2 000/s) calls B (1 side, 1 000/s) on one
    # shared CPU at 1 000 requests/s. The models price each message at the CPU's rate
    # (6 crossings × 1 000/s ÷ 2 = 3 000/s), cheaper than at A's or B's own rate, and the load
    # factor discounts it again: with ramp_price a request's sidecar work is the ramp's at the
    # sidecars' own rates, 2 × 133.3 + 160 µs, whatever the models say
    _, p = _ramp_profile()
    b, o = _a_calls_b()
    ramp = 2 * (160.0 - 80.0 / 3) + 160.0

    def shared(opts: TailOptions) -> tuple[float, float]:
        tp = predict_tail(b, single_profile(p), opts)
        (s,) = [s for s in tp.stations if s.name == "shared CPUs"]
        return s.utilisation, s.full_factor

    was, was_full = shared(o)
    now, now_full = shared(replace(o, ramp_price=True))
    assert now == pytest.approx(1000 * (ramp + 100.0) * 1e-6, rel=1e-9)
    assert was < 0.95 * now  # the double discount: lower than the ramp at own rates
    scale = ramp_price(b, single_profile(p), o).scale
    assert scale == pytest.approx(ramp / (was * 1e6 / 1000 - 100.0), rel=1e-9)
    # saturation stays the profile's (the closed loop's queue state), as with a cost scale
    assert now_full == pytest.approx(was_full)


def test_no_shared_cpus_or_no_ramp_leave_the_price_alone() -> None:
    base, p = _ramp_profile()
    g = ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, rate=1000)])
    b = to_batch([g])
    o = TailOptions(samples=100, pod_cpus=1)
    assert ramp_price(b, single_profile(base), o).scale == 1.0
    assert ramp_price(b, single_profile(p), replace(o, pod_cpus=None)).scale == 1.0
    assert math.isfinite(ramp_price(b, single_profile(p), o).scale)
    # and each says why, for the report
    no_ramp = ramp_price(b, single_profile(base), o)
    assert not no_ramp.used and "no capacity ramp for http mode" in no_ramp.note
    own = ramp_price(b, single_profile(p), replace(o, pod_cpus=None))
    assert not own.used and "do not share CPUs" in own.note
    used = ramp_price(b, single_profile(p), o)
    assert used.used and used.note.startswith("used") and f"× {used.scale:.2f}" in used.note


def test_a_prediction_records_whether_the_ramp_price_was_used() -> None:
    base, p = _ramp_profile()
    b = to_batch([ecg({"A": HTTP}, [inv("r", EXTERNAL, "A", 0, 100, rate=1000)])])
    o = TailOptions(percentiles=(50.0,), samples=100, pod_cpus=1)
    assert predict_tail(b, single_profile(p), o).ramp is None  # not asked
    asked = replace(o, ramp_price=True)
    got = predict_tail(b, single_profile(p), asked).ramp
    assert got is not None and got.used and got.scale == ramp_price(b, single_profile(p), o).scale
    got = predict_tail(b, single_profile(base), asked).ramp
    assert got is not None and not got.used and got.scale == 1.0


def test_a_topologys_ramp_price_reads_the_shape_when_given() -> None:
    # the topology above (A: 2 sides at 2 000/s, B: 1 side at 1 000/s) with the shape of the
    # test before: the scale follows the shape's price, not the runs'
    _, p = _ramp_profile()
    b, o = _a_calls_b()
    runs = ramp_price(b, single_profile(p), o).scale
    shaped = ramp_price(b, single_profile(p), replace(o, ramp_shape=(2.0, -0.5))).scale
    want = (2 * 80.0 * 0.2**-0.5 + 80.0 * 0.1**-0.5) / (2 * (160.0 - 80.0 / 3) + 160.0)
    assert shaped / runs == pytest.approx(want, rel=1e-9)


def test_a_topology_priced_from_the_ramp_reads_the_shape_below_a_quarter_of_the_closed_loop() -> (
    None
):
    # one rule for `meshtax predict` and the validation's topologies: the set 13 shape, so a
    # sidecar at 1 000/s (a tenth of the closed loop) costs 40 × 1.377 × 0.1^−0.355, not the run's 160
    _, p = _ramp_profile()
    o = priced_from_ramp(TailOptions(percentiles=(50.0,), samples=100, pod_cpus=1))
    assert o.ramp_price and o.ramp_shape == RAMP_SHAPE
    got = ramp_sidecar_us(p.modes[Mode.HTTP], np.array([1000.0]), o.ramp_shape)
    assert got is not None
    assert float(got[0]) == pytest.approx(40.0 * 1.377 * 0.1**-0.355, rel=1e-12)


@pytest.mark.parametrize(
    ("rate", "want"),
    [
        (1000.0, 40.0 * 0.1**-0.5),  # the exponent's law through the closed loop's point
        (2500.0, 40.0 * 0.25**-0.5),  # no join at a quarter: the runs play no part
        (10_000.0, 40.0),  # the closed loop itself
        (2e4, 40.0),  # held beyond it
    ],
)
def test_a_sidecar_at_a_closed_loop_costs_the_shapes_law_through_the_closed_loop(
    rate: float, want: float
) -> None:
    base, p = _ramp_profile()
    got = closed_loop_us(p.modes[Mode.HTTP], np.array([rate]), -0.5)
    assert got is not None
    assert float(got[0]) == pytest.approx(want, rel=1e-12)
    assert closed_loop_us(base.modes[Mode.HTTP], np.array([rate]), -0.5) is None


def _full(b: EcgBatch, p: Profile, o: TailOptions) -> float:
    tp = predict_tail(b, single_profile(p), o)
    (s,) = [s for s in tp.stations if s.name == "shared CPUs"]
    return s.full_factor


def test_a_topologys_closed_loop_priced_at_the_shape_through_the_profiles_closed_loop() -> None:
    # A (2 sides, own rate 2 000/s × f) calls B (1 side, 1 000/s × f), 100 µs of app a request
    # on one CPU; closed loop 10 000/s at 40 µs, shape exponent −0.5: ρ = 1 where
    # 1 000 f × (100 + 2 × 40 (0.2 f)^−0.5 + 40 (0.1 f)^−0.5) µs = 1 s, i.e. √f = 1.9847
    _, p = _ramp_profile()
    b, o = _a_calls_b()
    priced = replace(o, ramp_price=True, ramp_shape=(2.0, -0.5))
    k = 80.0 * 0.2**-0.5 + 40.0 * 0.1**-0.5
    y = (-k * 1e-3 + math.sqrt((k * 1e-3) ** 2 + 0.4)) / 0.2
    closed = _full(b, p, replace(priced, closed_shape=True))
    assert closed == pytest.approx(y * y, rel=5e-3)
    assert abs(_full(b, p, priced) / closed - 1) > 0.05  # the queue factor's price differs
    # not asked, or a graph the ramp does not price (one hop's rule): the queue factor's
    assert _full(b, p, replace(o, closed_shape=True)) == pytest.approx(_full(b, p, o))
    assert closed_loop_scale(b, single_profile(p), priced) == 1.0
    on = replace(priced, closed_shape=True)
    assert closed_loop_scale(b, single_profile(p), replace(on, pod_cpus=None)) == 1.0
    assert closed_loop_scale(b, single_profile(p), on) != 1.0


def _law_profile(a: float, b: float, fractions: tuple[float, ...]) -> Profile:
    """The profile of ``_ramp_profile`` with its ramp through the sidecar on u_R × a × f^b
    (closed loop R = 10 000/s, u_R = 40 µs) at ``fractions`` of R, one more run at R/2 off the
    law (600 µs: above R/4 the runs price, not the shape) and the R/4 run repeated twice."""
    base, _ = _ramp_profile()

    def run(f: float, us: float) -> CapacityPoint:
        return CapacityPoint(f * 10_000.0, f * 10_000.0, us * f * 10_000.0 * 1e-6, 0.9)

    pts = (
        CapacityPoint(0.0, 10_000.0, 0.4, 0.9),
        *(run(f, 40.0 * a * f**b) for f in fractions),
        run(0.5, 600.0),
    )
    rep = tuple(run(0.25, 40.0 * a * 0.25**b) for _ in range(2) if 0.25 in fractions)
    cap = Capacity(10_000.0, 100, 32, 1, 40.0, "shared-cpu", points=pts, repeats=rep)
    return replace(base, modes={Mode.HTTP: replace(base.modes[Mode.HTTP], capacity=cap)})


def test_a_profiles_own_ramp_shape_is_the_law_of_its_runs_below_a_quarter_of_the_closed_loop() -> (
    None
):
    # issue #20, set 20's candidate: RAMP_SHAPE is another VM's; the profile's own runs at
    # ≤ R/4 (with the repeats there) give the same form with this machine's constants
    p = _law_profile(0.8, -0.48, (0.02, 0.05, 0.1, 0.25))
    got = own_shape(p.modes[Mode.HTTP])
    assert got is not None
    assert got[0] == pytest.approx(0.8, rel=1e-9) and got[1] == pytest.approx(-0.48, rel=1e-9)
    # too few rates there, a law that rises with the rate, or no ramp: none of its own
    assert own_shape(_law_profile(0.8, -0.48, (0.1, 0.25)).modes[Mode.HTTP]) is None
    assert own_shape(_law_profile(0.8, 0.2, (0.02, 0.05, 0.1, 0.25)).modes[Mode.HTTP]) is None
    assert own_shape(_ramp_profile()[0].modes[Mode.HTTP]) is None


def test_a_topologys_ramp_price_reads_the_profiles_own_shape_when_asked() -> None:
    # A (2 sides at 2 000/s = R/5) calls B (1 side at 1 000/s = R/10): both below R/4, so the
    # price is u_R × shape × f^b at each — the profile's own (0.8, −0.48) with ramp_own_shape,
    # the pooled RAMP_SHAPE without it or for a profile without enough runs there
    p = _law_profile(0.8, -0.48, (0.02, 0.05, 0.1, 0.25))
    b, o = _a_calls_b()
    o = replace(o, ramp_shape=RAMP_SHAPE)
    pooled = ramp_price(b, single_profile(p), o)
    own = ramp_price(b, single_profile(p), replace(o, ramp_own_shape=True))
    want = (2 * 0.8 * 0.2**-0.48 + 0.8 * 0.1**-0.48) / (
        RAMP_SHAPE[0] * (2 * 0.2 ** RAMP_SHAPE[1] + 0.1 ** RAMP_SHAPE[1])
    )
    assert own.scale / pooled.scale == pytest.approx(want, rel=1e-6)
    assert "the profile's own ramp shape 0.800 × (rate ÷ R)^-0.480" in own.note
    assert "the pooled shape 1.377" in pooled.note
    few = _law_profile(0.8, -0.48, (0.1, 0.25))
    back = ramp_price(b, single_profile(few), replace(o, ramp_own_shape=True))
    assert back.scale == pytest.approx(ramp_price(b, single_profile(few), o).scale, rel=1e-12)
    assert "the pooled shape" in back.note


def test_a_topology_priced_from_the_ramp_reads_the_profiles_own_shape_since_set_20() -> None:
    # issue #20, set 20 (registered, held): the one rule of `meshtax predict` and the
    # validation's topologies reads the profile's own shape where it has one, RAMP_SHAPE else
    o = priced_from_ramp(TailOptions(percentiles=(50.0,), samples=100, pod_cpus=1))
    assert o.ramp_own_shape and o.ramp_shape == RAMP_SHAPE
    p = _law_profile(0.8, -0.48, (0.02, 0.05, 0.1, 0.25))
    b, base = _a_calls_b()
    got = ramp_price(b, single_profile(p), priced_from_ramp(base))
    want = ramp_price(b, single_profile(p), replace(base, ramp_shape=(0.8, -0.48)))
    assert got.scale == pytest.approx(want.scale, rel=1e-6)
    assert "the profile's own ramp shape" in got.note
