from __future__ import annotations

import numpy as np
import pytest

from meshtax.model.components import Component, Kind, filter_component
from meshtax.model.costmodel import CostModel, extra_units


@pytest.mark.parametrize(
    ("sizes", "split", "expected"),
    [([100, 1000, 1001, 2000, 2001, 0], 1000, [0, 0, 1, 1, 2, 0]), ([5000], None, [0])],
)
def test_extra_units(sizes: list[float], split: int | None, expected: list[float]) -> None:
    assert extra_units(sizes, split).tolist() == expected


def test_fit_recovers_exact_line_and_keeps_samples() -> None:
    m = CostModel.fit([100, 1000, 2000, 4000], [11, 20, 30, 50])
    assert m.intercept == pytest.approx(10.0) and m.slope == pytest.approx(0.01)
    assert m.stats is not None and m.stats.r2 == pytest.approx(1.0) and m.stats.n == 4
    assert m.samples is not None and m.samples.sizes == (100, 1000, 2000, 4000)
    assert m.predict([500]).tolist() == pytest.approx([15.0])


def test_fit_with_split_learns_per_unit_cost() -> None:
    sizes = np.array([100, 1000, 4000, 16384, 65536, 70000], dtype=float)
    y = 5 + 0.001 * sizes + 7 * extra_units(sizes, 16384)
    m = CostModel.fit(sizes, y, split_bytes=16384)
    assert (m.intercept, m.slope, m.per_unit) == pytest.approx((5, 0.001, 7))


def test_fit_statistics_hand_computed() -> None:
    # y = 1 + x with residuals +1, -1, -1, +1 at x = 0, 1, 2, 3 → slope 1, intercept 1
    m = CostModel.fit([0, 1, 2, 3], [2, 1, 2, 5])
    assert (m.intercept, m.slope) == pytest.approx((1.0, 1.0))
    assert m.stats is not None
    assert m.stats.residuals == pytest.approx((1, -1, -1, 1))
    # ss_res = 4, ss_tot = 9 → r2 = 5/9; sigma² = 4/(4-2) = 2, Sxx = 5 → se(b) = sqrt(2/5)
    assert m.stats.r2 == pytest.approx(5 / 9)
    assert m.stats.stderr[1] == pytest.approx((2 / 5) ** 0.5)


def test_fit_single_size_fits_intercept_only() -> None:
    m = CostModel.fit([100, 100, 100], [9, 10, 11])
    assert m.slope == 0 and m.intercept == pytest.approx(10)


@pytest.mark.parametrize("bad", [([1, 2], [1]), ([], []), ([1, 2], [1, float("nan")])])
def test_fit_rejects_bad_samples(bad: tuple[list[float], list[float]]) -> None:
    with pytest.raises(ValueError):
        CostModel.fit(*bad)


def test_scaled_and_round_trip() -> None:
    m = CostModel.fit([100, 1000, 2000], [11, 20, 30], split_bytes=1500)
    assert CostModel.from_dict(m.to_dict()) == m
    s = m.scaled(0.5)
    assert (
        s.intercept == pytest.approx(m.intercept / 2)
        and s.slope == pytest.approx(m.slope / 2)
        and s.stats is None
    )


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("IPC", "ipc"),
        ("Filter(lua)", "filter:lua"),
        ("filter:wasm", "filter:wasm"),
        ("notification", "notification"),
    ],
)
def test_component_parse(text: str, key: str) -> None:
    assert Component.parse(text).key == key


def test_component_rejects_unknown_and_bad_names() -> None:
    with pytest.raises(ValueError, match="unknown component"):
        Component.parse("epoll")
    with pytest.raises(ValueError):
        filter_component("Bad Name")
    with pytest.raises(ValueError):
        Component(Kind.IPC, "x")


def test_fit_rate_term_recovers_cost_below_the_highest_rate_and_clamps() -> None:
    # y = 10 + 0.01·s + 20·ln(3000 / r): exact, so the fit must recover it
    sizes = [100, 1000, 4000] * 3
    rates = [100.0] * 3 + [300.0] * 3 + [3000.0] * 3
    ys = [10 + 0.01 * s + 20 * np.log(3000 / r) for s, r in zip(sizes, rates)]
    m = CostModel.fit(sizes, ys, rates=rates)
    assert (m.intercept, m.slope, m.rate_coef) == pytest.approx((10.0, 0.01, 20.0))
    assert (m.rate_lo, m.rate_hi) == (100.0, 3000.0)
    # without a rate: the highest profiled rate (the intercept is the cost there)
    assert m.predict([1000])[0] == pytest.approx(20.0)
    assert m.predict([1000], [300.0])[0] == pytest.approx(20.0 + 20 * np.log(10))
    # outside the profiled range the rate is clamped, never extrapolated
    assert m.predict([1000], [1.0])[0] == pytest.approx(m.predict([1000], [100.0])[0])
    assert m.predict([1000], [1e6])[0] == pytest.approx(20.0)
    assert m.stats is not None and len(m.stats.stderr) == 4
    back = CostModel.from_dict(m.to_dict())
    assert back.predict([1000], [300.0])[0] == pytest.approx(m.predict([1000], [300.0])[0])
    assert m.scaled(0.5).predict([1000], [100.0])[0] == pytest.approx(
        0.5 * m.predict([1000], [100.0])[0]
    )


def test_fit_one_rate_has_no_rate_term_and_old_documents_still_read() -> None:
    m = CostModel.fit([100, 1000, 4000], [11, 20, 50], rates=[500.0] * 3)
    assert m.rate_coef == 0.0 and m.rate_lo is None
    assert m.predict([1000], [5.0])[0] == pytest.approx(m.predict([1000])[0])
    # a document written before the rate term: 3 standard errors, a 3×3 covariance
    d = CostModel.fit([100, 1000, 2000, 4000], [11, 20, 31, 50]).to_dict()
    for k in ("rate_coef", "rate_lo", "rate_hi"):
        d.pop(k)
    d["stats"]["stderr"] = d["stats"]["stderr"][:3]
    d["stats"]["cov"] = [row[:3] for row in d["stats"]["cov"][:3]]
    old = CostModel.from_dict(d)
    assert old.stderr_at([1000], [50.0])[0] > 0 and old.rate_coef == 0.0


def test_fit_rejects_bad_rates() -> None:
    with pytest.raises(ValueError, match="rates"):
        CostModel.fit([100, 1000], [1, 2], rates=[0.0, 10.0])
    with pytest.raises(ValueError, match="one rate per sample"):
        CostModel.fit([100, 1000], [1, 2], rates=[10.0])


def test_rate_term_is_kept_when_the_samples_just_identify_it() -> None:
    # a quick profile's tcp sidecar carrying gRPC: 100 B at the max rate and at 100/s, 4 KB at
    # its max rate only — three samples, three terms: the rate term must not be dropped
    m = CostModel.fit([100, 100, 4096], [87.0, 323.0, 168.0], rates=[1094.0, 100.0, 623.0])
    assert (m.rate_lo, m.rate_hi) == (100.0, 1094.0)
    got = m.predict([100, 100, 4096], [1094.0, 100.0, 623.0])
    assert got.tolist() == pytest.approx([87.0, 323.0, 168.0])
    # one size at two rates: the cost between them follows ln(rate)
    two = CostModel.fit([100, 100], [40.0, 20.0], rates=[100.0, 1000.0])
    assert two.predict([100], [np.sqrt(100 * 1000)])[0] == pytest.approx(30.0)


def test_a_rate_term_never_carries_the_model_below_zero() -> None:
    """One costly low-rate run makes the rate term steep; unconstrained, the intercept (the
    cost at the highest rate) goes negative (a quick profile's carried gRPC, refused by the
    store: −1.6 CPU-µs). Costs measured ≥ 0 keep the model ≥ 0 over its rate range."""
    rates = [100.0, 300.0, 1000.0, 6000.0]
    ys = [134.7, 44.2, 39.0, 0.0]
    x = np.log(6000.0 / np.asarray(rates))
    free = np.polyfit(x, ys, 1)
    assert free[1] < 0  # the unconstrained intercept
    m = CostModel.fit([100] * 4, ys, rates=rates)
    assert m.intercept == 0.0 and m.rate_coef > 0 and "intercept" in m.note
    assert m.predict([0, 100], [6000.0, 6000.0]).min() >= 0
    # a rate term that would make the cost negative at the lowest rate is held instead
    up = CostModel.fit([100] * 3, [0.0, 5.0, 30.0], rates=[100.0, 1000.0, 5000.0])
    assert up.rate_coef == 0.0 and up.rate_lo is None and "rate term" in up.note
    assert up.predict([100], [100.0])[0] >= 0
    # a model of differences (samples below 0 allowed) is fitted as before
    diff = CostModel.fit([100] * 3, [-4.0, 5.0, 30.0], rates=[100.0, 1000.0, 5000.0])
    assert diff.rate_coef < 0 and "held" not in diff.note


def test_a_size_slope_below_zero_is_held_at_zero() -> None:
    # noise between sizes: unconstrained, the line falls 6 µs per KB and is negative at 1 MB
    free = np.polyfit([100, 1000, 4096, 65536], [52.0, 60.0, 41.0, 40.0], 1)
    assert np.polyval(free, 1 << 20) < 0
    m = CostModel.fit([100, 1000, 4096, 65536], [52.0, 60.0, 41.0, 40.0])
    assert m.slope == 0.0 and m.intercept == pytest.approx(48.25)
    assert "held at 0" in m.note and m.predict([1 << 30])[0] == pytest.approx(48.25)
    # with a split, the per-unit term too; a positive slope is kept as fitted
    s = CostModel.fit([100, 1000, 20000, 65536], [10, 12, 9, 8], split_bytes=16384)
    assert s.slope >= 0 and s.per_unit >= 0 and s.predict([1 << 30])[0] > 0
    up = CostModel.fit([100, 1000, 4096], [10.0, 19.0, 49.96])
    assert up.slope == pytest.approx(0.01, rel=1e-6) and "held" not in up.note
