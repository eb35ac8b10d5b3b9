"""Repeat-until-narrow measurement on a noisy machine (pure; time comes from an injected clock).

A measurement (one fortio run → its p50, one CPU run → CPU per message …) is repeated until
the 95 % confidence interval of the median of the repeats is narrow relative to the median,
or a run count or time budget ends. The interval is the distribution-free order-statistic
interval for the median: ``[x(l), x(n+1-l)]`` of the sorted samples covers the true median
with probability ``1 - 2·P(Binomial(n, ½) ≤ l-1)``; no normality is assumed (latency medians
of repeated runs are skewed by noisy neighbours). With fewer than 6 samples no such interval
reaches 95 % (n=5 gives [min, max] at 93.75 %); the estimate then records its actual, lower
coverage and ``repeat_until`` does not stop early on it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Estimate", "estimate", "median", "median_ci_ranks", "repeat_until"]


def median(xs: Sequence[float]) -> float:
    """The sample median (mean of the two middle values for even ``n``)."""
    if not xs:
        raise ValueError("median of no samples")
    s = sorted(xs)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2


def _binom_cdf_half(k: int, n: int) -> float:
    """P(Binomial(n, ½) ≤ k), exactly."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(min(k, n) + 1)) / float(1 << n)


def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int, float]:
    """1-based ranks ``(l, u)`` of the narrowest symmetric order-statistic interval for the
    median with coverage ≥ ``confidence``, and its exact coverage.

    If no interval reaches ``confidence`` (small ``n``), returns ``(1, n)`` and its coverage.
    """
    if n < 1:
        raise ValueError("need at least one sample")
    best = (1, n, 1.0 - 2 * _binom_cdf_half(0, n))
    for low in range(2, (n + 1) // 2 + 1):
        cov = 1.0 - 2 * _binom_cdf_half(low - 1, n)
        if cov < confidence:
            break
        best = (low, n + 1 - low, cov)
    return best


@dataclass(frozen=True)
class Estimate:
    """Median of repeated measurements with its order-statistic confidence interval.

    ``coverage`` is the interval's exact coverage (≥ the requested confidence once n ≥ 6 for
    95 %); ``stop`` says why repetition ended: ``narrow``, ``max_runs``, ``budget`` or ``""``.
    """

    median: float
    lo: float
    hi: float
    n: int
    samples: tuple[float, ...]
    coverage: float = 0.0
    stop: str = ""

    @property
    def rel_halfwidth(self) -> float:
        """Half the interval width relative to the median (inf if the median is 0)."""
        half = (self.hi - self.lo) / 2
        if half == 0:
            return 0.0
        return math.inf if self.median == 0 else half / abs(self.median)

    def to_dict(self) -> dict[str, object]:
        return {
            "median": self.median,
            "lo": self.lo,
            "hi": self.hi,
            "n": self.n,
            "coverage": self.coverage,
            "stop": self.stop,
            "samples": list(self.samples),
        }


def estimate(samples: Sequence[float], confidence: float = 0.95, stop: str = "") -> Estimate:
    """:class:`Estimate` of the median of ``samples``."""
    s = sorted(samples)
    low, up, cov = median_ci_ranks(len(s), confidence)
    return Estimate(median(s), s[low - 1], s[up - 1], len(s), tuple(samples), cov, stop)


def repeat_until(
    measure: Callable[[], float],
    rel_halfwidth: float = 0.05,
    min_runs: int = 3,
    max_runs: int = 20,
    budget_s: float | None = None,
    confidence: float = 0.95,
    clock: Callable[[], float] = time.monotonic,
) -> Estimate:
    """Call ``measure`` until the median's CI half-width is ≤ ``rel_halfwidth`` × median (with
    at least ``min_runs`` runs and coverage ≥ ``confidence``), or ``max_runs`` runs are done,
    or the next run would overrun ``budget_s`` (judged by the longest run so far).

    At least one run is always made. ``Estimate.stop`` records which condition ended it.
    """
    if min_runs < 1 or max_runs < min_runs:
        raise ValueError("need 1 <= min_runs <= max_runs")
    t0 = clock()
    samples: list[float] = []
    longest = 0.0
    while True:
        start = clock()
        samples.append(float(measure()))
        end = clock()
        longest = max(longest, end - start)
        est = estimate(samples, confidence)
        n = len(samples)
        if n >= min_runs and est.coverage >= confidence and est.rel_halfwidth <= rel_halfwidth:
            return _with_stop(est, "narrow")
        if n >= max_runs:
            return _with_stop(est, "max_runs")
        if budget_s is not None and (end - t0) + longest > budget_s:
            return _with_stop(est, "budget")


def _with_stop(e: Estimate, why: str) -> Estimate:
    return Estimate(e.median, e.lo, e.hi, e.n, e.samples, e.coverage, why)
