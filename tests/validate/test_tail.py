"""Tail validation results (pure): measured percentiles per pair, comparisons, errors and bias,
saturation, the document the report reads, traces cut to a level's windows, and the one-hop
prediction at no load."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from meshtax.model.components import OTHER
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.tail import TailOptions
from meshtax.report.build import ReportInputs, render_report
from meshtax.validate.tail import (
    BASE_PROBS,
    Predicted,
    TailPoint,
    TailRun,
    TailValidation,
    cost_calibration,
    mesh_cpu_us,
    paced_jitter,
    predict_one_hop,
)
from meshtax.validate.tail_traces import arrival_lag_us, traces_within
from tests.helpers import flat, profile


def run(rate: float, achieved: float, p50: float, p90: float, p99: float) -> TailRun:
    return TailRun(
        rate, achieved, 1000, 1.0, {"p50": p50, "p90": p90, "p99": p99}, (), {"app": 30_000_000}
    )


def pred(p50: float, p90: float, p99: float, sat: float = 8000.0) -> Predicted:
    ov = {k: (v, v * 0.9, v * 1.1) for k, v in (("p50", p50), ("p90", p90), ("p99", p99))}
    return Predicted(ov, 0.5, sat, "echo")


def validation() -> TailValidation:
    base = [run(1000, 1000, 100, 150, 300), run(1000, 1000, 110, 160, 320)]
    mesh = [run(1000, 1000, 200, 300, 600), run(1000, 1000, 220, 300, 640)]
    low = TailPoint(0.25, 1000, tuple(zip(base, mesh)), pred(110, 160, 330))
    # the mesh side fell short at the top level: not compared
    hot = TailPoint(
        0.9,
        3600,
        ((run(3600, 3600, 1, 1, 1), run(3600, 3000, 9, 9, 9)),),
        pred(1e9, 1e9, 1e9, 3500),
    )
    sat = TailPoint(0.5, 2000, ((run(2000, 2000, 1, 1, 1), run(2000, 2000, 5, 5, 5)),), None)
    return TailValidation("one-hop", "http", (low, sat, hot), 32, 4000, 3200, "p", notes=("n",))


def test_measured_overhead_is_the_median_of_paired_differences() -> None:
    low = validation().points[0]
    m = low.measured("p50")
    assert m.median == pytest.approx(105.0) and m.n == 2  # (100 + 110) / 2
    assert low.measured("p99").median == pytest.approx(310.0)
    assert low.sustained and not validation().points[2].sustained


def test_measured_overhead_pools_every_request_of_the_level() -> None:
    # uniform latencies: 100–200 µs without the mesh; with it 200–400 µs in one run and
    # 200–300 µs in a run with three times its requests (pooled: ¼ and ¾ of the requests)
    probs = np.asarray(BASE_PROBS)

    def runq(lo: float, width: float, count: int) -> TailRun:
        q = tuple((lo + width * probs).tolist())
        return TailRun(1000, 1000, count, 1.0, {"p90": lo + 0.9 * width}, q)

    pairs = (
        (runq(100, 100, 1000), runq(200, 200, 1000)),
        (runq(100, 100, 3000), runq(200, 100, 3000)),
    )
    m = TailPoint(0.5, 1000, pairs).measured("p90")
    # with the mesh P(X ≤ 300) = ¼ · ½ + ¾ = 0.875; above, ¼ (x − 200)/200 + ¾ = 0.9 → 320
    assert m.median == pytest.approx(320 - 190, abs=0.5)
    assert m.lo <= m.median <= m.hi and m.n == 2
    assert m.samples == pytest.approx((380 - 190, 290 - 190))  # per pair, kept as the record
    same = TailPoint(0.5, 1000, (pairs[0], pairs[0])).measured("p90")
    assert same.median == same.lo == same.hi == pytest.approx(190, abs=0.5)


def test_errors_bias_and_saturation() -> None:
    v = validation()
    s = v.summary()
    # only the sustained, predicted level counts: p50 110 vs 105, p90 160 vs 145, p99 330 vs 310
    assert s["p50"]["points"] == 1 and s["p50"]["bias"] == pytest.approx(110 / 105 - 1)
    assert s["p90"]["median_abs_error"] == pytest.approx(160 / 145 - 1)
    assert s["p99"]["errors"] == [pytest.approx(330 / 310 - 1)]
    # the highest predicted level's saturation (its applications' CPU nearest that load)
    assert s["saturation"]["predicted"] == 3500 and s["saturation"]["measured"] == 3200
    assert s["saturation"]["error"] == pytest.approx(3500 / 3200 - 1)
    assert s["not_sustained"] == [0.9]


def test_document_cases_are_what_the_report_reads() -> None:
    doc = validation().to_document()
    assert doc["format"] == "meshtax-validation/1"
    names = [c["name"] for c in doc["cases"]]
    assert names == ["25% (1000/s) p50", "25% (1000/s) p90", "25% (1000/s) p99"]
    assert doc["tail"]["points"][0]["predicted"]["overhead_us"]["p99"]["value"] == 330
    assert doc["tail"]["points"][0]["app_cpu_us_per_request"] == pytest.approx(30.0)
    rep = render_report((), (), ReportInputs(validations=[doc]))
    kinds = [c.kind for c in rep.charts]
    assert "validation" in kinds and "load" in kinds
    table = validation().table()
    assert "| 25% | 1000 | 1000 / 1000 | 0.50 | 105 [100, 110] | 110 |" in table
    assert "Saturation (ρ = 1) predicted 3500/s, measured 3200/s (+9.4%)" in table


def _shifted(lo_base: float, shift: float) -> tuple[TailRun, TailRun]:
    """A pair whose with-mesh latencies are the no-mesh ones (uniform over 100 µs) + shift."""
    probs = np.asarray(BASE_PROBS)
    q = tuple((lo_base + 100 * probs).tolist())
    qm = tuple((lo_base + shift + 100 * probs).tolist())
    pcts = dict.fromkeys(("p50", "p90", "p99"), 0.0)
    return TailRun(1000, 1000, 1000, 1.0, pcts, q), TailRun(1000, 1000, 1000, 1.0, pcts, qm)


def test_halves_are_the_passes_or_the_pairs_in_time_order() -> None:
    # three pairs of the first pass add 100 µs, one of the second 300 µs
    pairs = (*(_shifted(100, 100) for _ in range(3)), _shifted(100, 300))
    two = TailPoint(0.5, 1000, pairs, passes=(3, 1))
    assert two.halves("p90") == pytest.approx((100, 300), abs=0.5)
    # one pass: the first two pairs against the last two
    one = TailPoint(0.5, 1000, pairs)
    a, b = one.halves("p90") or (0.0, 0.0)
    assert a == pytest.approx(100, abs=0.5) and 100 < b < 300
    assert TailPoint(0.5, 1000, pairs[:1]).halves("p90") is None  # nothing to split
    assert "halves" in two.to_dict() and two.to_dict()["passes"] == [3, 1]


def test_repeat_says_how_far_the_halves_and_the_prediction_on_each_are() -> None:
    pairs = (_shifted(100, 100), _shifted(100, 100), _shifted(100, 200), _shifted(100, 200))
    pt = TailPoint(0.5, 1000, pairs, pred(150, 150, 150), passes=(2, 2))
    v = TailValidation("one-hop", "http", (pt,), 32, 4000, 3200, "p")
    whole = pt.measured("p90").median
    r = v.repeat("p90")
    assert r["diffs"] == [pytest.approx(-100 / whole, abs=1e-2)]
    assert r["median_abs_error_halves"] == pytest.approx([0.5, 0.25], abs=1e-2)
    assert v.summary()["repeat"]["p90"]["median_abs_diff"] == pytest.approx(100 / whole, abs=1e-2)
    assert "Repeat within the sitting" in v.table()


def test_traces_within_keeps_whole_traces_that_started_in_a_window() -> None:
    def span(trace: str, t_s: float) -> dict[str, object]:
        return {
            "traceId": trace,
            "spanId": trace + str(t_s),
            "startTimeUnixNano": str(int(t_s * 1e9)),
        }

    doc = {
        "resourceSpans": [
            {"resource": {"a": 1}, "scopeSpans": [{"spans": [span("a", 10.0), span("b", 20.0)]}]},
            {"resource": {"a": 2}, "scopeSpans": [{"spans": [span("a", 10.5), span("c", 30.0)]}]},
        ]
    }
    got = traces_within(doc, [(9.0, 11.0), (29.0, 29.5)])
    spans = [
        s["traceId"] for rs in got["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]
    ]
    assert spans == ["a", "a"]
    assert [rs["resource"] for rs in got["resourceSpans"]] == [{"a": 1}, {"a": 2}]


def test_one_hop_prediction_at_no_load_is_the_profile_overhead() -> None:
    p = profile({Mode.HTTP: {OTHER: flat(25, 0.01)}})
    opts = TailOptions(percentiles=(50.0, 99.0), samples=20, pod_cpus=1, app_cpu_us=10.0)
    got = predict_one_hop(p, SidecarConfig(Mode.HTTP), 100, 1.0, [100.0, 200.0, 300.0], opts)
    # two crossings of 25 µs on every graph: every percentile moves by 50 µs
    assert got.overhead["p50"][0] == pytest.approx(50.0, abs=0.5)
    assert got.overhead["p99"][0] == pytest.approx(50.0, abs=0.5)
    # the echo app and its sidecar share one CPU: it saturates first, at 1e6 / (10 + 0.02) per s
    assert got.first == "shared CPUs"
    assert got.saturation_rate == pytest.approx(1e6 / 10.02, rel=1e-3)


def test_the_paced_lag_is_the_one_that_best_predicts_the_profiles_ramp() -> None:
    # a profile whose ramp (4 000/s, one shared CPU, 100 CPU-µs a side, 20 of the app) saw
    # no waits through the sidecar beyond its own latency: an even schedule (lag 0) predicts
    # that, a lag of 2 ms (Poisson-like at 250 µs spacing) predicts waits; without a ramp
    # nothing is calibrated
    from dataclasses import replace

    from meshtax.model.capacity import SKETCH_PROBS, Capacity, CapacityPoint

    base = profile({Mode.HTTP: {OTHER: flat(30, 50)}})
    direct = tuple(100.0 + 10 * p for p in SKETCH_PROBS)
    meshed = tuple(x + 60.0 for x in direct)
    pts = (
        CapacityPoint(0.0, 8000.0, 0.6, 0.9, meshed=True),
        CapacityPoint(4000.0, 4000.0, 0.0, 0.08, meshed=False, quantiles_us=direct),
        CapacityPoint(4000.0, 4000.0, 0.4, 0.48, meshed=True, quantiles_us=meshed),
    )
    cap = Capacity(8000.0, 100, 32, 1, 75.0, "shared-cpu", points=pts)
    p = replace(base, modes={Mode.HTTP: replace(base.modes[Mode.HTTP], capacity=cap)})
    opts = TailOptions(pod_cpus=1)
    lag, errs = paced_jitter(p, Mode.HTTP, opts, grid=(0.0, 2000.0))
    assert lag == 0.0 and errs[0.0] < errs[2000.0]
    assert paced_jitter(base, Mode.HTTP, opts) == (None, {})


def test_the_arrival_lag_is_read_from_the_entrys_sampled_spans() -> None:
    # 400/s on an even schedule (2 500 µs apart), every 10th request traced, each late by an
    # exponential lag of 700 µs: the entry's spans (no parent) give the lag back; the
    # children are ignored; too few spans give None
    rng = np.random.default_rng(3)
    a, lag = 2500.0, 700.0
    t0 = 1.7e9
    spans = []
    for i in range(600):
        start = t0 * 1e9 + (i * 10 * a + rng.exponential(lag)) * 1e3
        spans.append({"spanId": f"r{i}", "startTimeUnixNano": str(int(start))})
        spans.append(
            {"spanId": f"c{i}", "parentSpanId": f"r{i}", "startTimeUnixNano": str(int(start + 5e5))}
        )
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}
    got = arrival_lag_us(doc, 400.0)
    assert got is not None and got == pytest.approx(lag, rel=0.15)
    few = {"resourceSpans": [{"scopeSpans": [{"spans": spans[:20]}]}]}
    assert arrival_lag_us(few, 400.0) is None


def test_the_cost_calibration_is_the_measured_mesh_cpu_over_what_was_served() -> None:
    # a level at 1 000/s: 1 000 requests, the app 30 CPU-µs a request without the mesh and 40
    # with it, the sidecar 120: the mesh costs 130 a request. Predicted on one shared CPU with
    # the app's 30: ρ 0.095 at the rate's price → 65 µs of mesh work a request (at a scale of
    # 0.5 it had already: 130 unscaled) → the scale that prices it as measured
    def r(app: int, sidecar: int) -> TailRun:
        return TailRun(1000, 1000, 1000, 1.0, {}, (), {"app": app, "sidecar": sidecar})

    pt = TailPoint(0.6, 1000, ((r(30_000_000, 0), r(40_000_000, 120_000_000)),))
    assert mesh_cpu_us(pt) == pytest.approx(130.0)
    got = Predicted({}, 0.095, 1.0)
    o = TailOptions(pod_cpus=1, app_cpu_us=30.0)
    assert cost_calibration(pt, got, o, 1) == pytest.approx(2.0)
    assert cost_calibration(pt, got, replace(o, cost_scale=0.5), 1) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        cost_calibration(pt, Predicted({}, 0.01, 1.0), o, 1)
