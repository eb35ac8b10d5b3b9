"""Pure tests of the repeat-until-narrow helpers, with exact expectations."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from meshtax.model.stats import Estimate, estimate, median, median_ci_ranks, repeat_until


@pytest.mark.parametrize(
    ("xs", "want"),
    [([5.0], 5.0), ([3.0, 1.0], 2.0), ([9.0, 1.0, 5.0], 5.0), ([4.0, 1.0, 3.0, 2.0], 2.5)],
)
def test_median(xs: list[float], want: float) -> None:
    assert median(xs) == want


def test_median_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError):
        median([])


# (n, l, u, coverage) — textbook order-statistic intervals for the median at 95 %
@pytest.mark.parametrize(
    ("n", "lo", "hi", "cov"),
    [
        (1, 1, 1, 0.0),
        (3, 1, 3, 0.75),
        (5, 1, 5, 0.9375),
        (6, 1, 6, 0.96875),
        (9, 2, 8, 1 - 2 * 10 / 512),
        (10, 2, 9, 1 - 2 * 11 / 1024),
        (20, 6, 15, 1 - 2 * sum(__import__("math").comb(20, i) for i in range(6)) / 2**20),
    ],
)
def test_median_ci_ranks(n: int, lo: int, hi: int, cov: float) -> None:
    got_lo, got_hi, got_cov = median_ci_ranks(n)
    assert (got_lo, got_hi) == (lo, hi)
    assert got_cov == pytest.approx(cov, abs=1e-12)


def test_estimate_uses_order_statistics() -> None:
    e = estimate([10.0, 1.0, 9.0, 2.0, 8.0, 3.0, 7.0, 4.0, 6.0, 5.0])
    assert (e.median, e.lo, e.hi, e.n) == (5.5, 2.0, 9.0, 10)
    assert e.rel_halfwidth == pytest.approx(3.5 / 5.5)
    assert e.samples[0] == 10.0  # samples keep measurement order


@pytest.mark.parametrize(
    ("est", "want"),
    [
        (Estimate(100.0, 95.0, 105.0, 6, ()), 0.05),
        (Estimate(0.0, 0.0, 0.0, 6, ()), 0.0),
        (Estimate(0.0, -1.0, 1.0, 6, ()), float("inf")),
    ],
)
def test_rel_halfwidth(est: Estimate, want: float) -> None:
    assert est.rel_halfwidth == want


def _seq(values: list[float]) -> Callable[[], float]:
    it = iter(values)
    return lambda: next(it)


def _clock(step: float) -> Callable[[], float]:
    """A fake clock advancing ``step`` per reading (two readings per run, plus one at start)."""
    counter: Iterator[int] = itertools.count()
    return lambda: next(counter) * step


@pytest.mark.parametrize(
    ("values", "kwargs", "n", "stop", "med"),
    [
        # identical runs: narrow as soon as coverage reaches 95 % (n=6), not at min_runs=3
        ([100.0] * 20, {}, 6, "narrow", 100.0),
        # min_runs above 6 is honoured
        ([100.0] * 20, {"min_runs": 8}, 8, "narrow", 100.0),
        # one outlier among 6 widens [min, max]; the 7th run keeps it wide (l stays 1 until n=9)
        ([100.0, 101.0, 99.0, 100.0, 100.0, 200.0] + [100.0] * 14, {}, 9, "narrow", 100.0),
        # never narrow: stops at max_runs
        ([float(v) for v in range(1, 21)], {"max_runs": 7}, 7, "max_runs", 4.0),
        # a 10 % target accepts what 5 % refuses
        (
            [100.0, 108.0, 92.0, 100.0, 104.0, 96.0] + [100.0] * 14,
            {"rel_halfwidth": 0.1},
            6,
            "narrow",
            100.0,
        ),
    ],
)
def test_repeat_until(
    values: list[float], kwargs: dict[str, float], n: int, stop: str, med: float
) -> None:
    e = repeat_until(_seq(values), clock=_clock(0.0), **kwargs)  # type: ignore[arg-type]
    assert (e.n, e.stop, e.median) == (n, stop, med)
    assert e.samples == tuple(values[:n])


def test_repeat_until_stops_before_overrunning_the_budget() -> None:
    # each reading advances 1 s: a run takes 1 s, and run k ends at 2k s after the start
    # reading; after run 2 (ends at t=4, elapsed 4) the next would end past 4+1=5 > budget 4.5
    e = repeat_until(_seq([float(v) for v in range(1, 21)]), budget_s=4.5, clock=_clock(1.0))
    assert (e.n, e.stop) == (2, "budget")


def test_repeat_until_always_runs_once() -> None:
    e = repeat_until(_seq([42.0]), budget_s=0.0, clock=_clock(1.0))
    assert (e.n, e.stop, e.median, e.lo, e.hi) == (1, "budget", 42.0, 42.0, 42.0)


@pytest.mark.parametrize("kwargs", [{"min_runs": 0}, {"min_runs": 5, "max_runs": 4}])
def test_repeat_until_rejects_bad_run_counts(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        repeat_until(lambda: 1.0, **kwargs)  # type: ignore[arg-type]
