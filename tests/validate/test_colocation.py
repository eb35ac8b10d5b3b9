"""meshtax.validate.colocation: the exponent fit on chains (pure; the real calibration runs in
tests/validate/test_run.py)."""

from __future__ import annotations

import numpy as np
import pytest

from meshtax.model.sidecar import Mode
from meshtax.validate.colocation import GRID, CalibrationError, colocation_of, fit_alpha
from meshtax.validate.result import CaseResult, RunSample

SERVICES = (1, 2, 4, 8)


def model(alpha: float, n: int) -> float:
    """A made-up engine: n sidecars, each cheaper the more of the CPU's rate warms it."""
    r_own, r_cpu = 100.0, 100.0 * (2 * n - 1)
    r = r_own ** (1 - alpha) * r_cpu**alpha
    return float((2 * n - 1) * 2 * (20.0 + 40.0 * np.log(5000.0 / r)))


def table() -> np.ndarray:
    return np.array([[model(a, n) for n in SERVICES] for a in GRID])


def test_fit_recovers_the_exponent_whatever_the_level() -> None:
    for truth in (0.0, 0.35, 0.8, 1.0):
        for level in (0.7, 1.0, 1.4):  # the machine drifted since the profile: every chain alike
            measured = [level * model(truth, n) for n in SERVICES]
            assert fit_alpha(measured, table()) == pytest.approx(truth, abs=0.011)


def test_fit_refuses_what_it_cannot_fit() -> None:
    with pytest.raises(CalibrationError, match="≥ 2 chains"):
        fit_alpha([100.0], table()[:, :1])
    with pytest.raises(CalibrationError, match="not positive"):
        fit_alpha([100.0, -5.0, 300.0, 900.0], table())


def rs(cpu_ns: int) -> RunSample:
    return RunSample(1000.0, 1500.0, 1100.0, 300, 100.0, 3.0, {"a": cpu_ns})


def chain_case(n: int, overhead_us: list[float]) -> CaseResult:
    """Paired runs whose CPU overhead per request (300 requests each) is ``overhead_us``."""
    pairs = tuple((rs(1_000_000), rs(1_000_000 + int(o * 300 * 1e3))) for o in overhead_us)
    return CaseResult(
        "chain", f"c{n}", "http", 100.0, pairs, None, {f"s{i}": "http" for i in range(n)}
    )


def test_colocation_of_chains_with_an_interval() -> None:
    truth = 0.6
    spread = (-0.04, -0.02, 0.0, 0.01, 0.03, 0.05)  # ±5 % between paired runs
    cases = [chain_case(n, [model(truth, n) * 1.1 * (1 + s) for s in spread]) for n in SERVICES]
    col = colocation_of(
        cases, lambda c, a: model(a, len(c.sidecar_modes)), Mode.HTTP, 100.0, n_boot=100
    )
    assert col.alpha == pytest.approx(truth, abs=0.011)
    assert col.lo <= col.alpha <= col.hi and col.hi - col.lo < 0.5
    assert [p.services for p in col.points] == list(SERVICES)
    # measured: the median paired overhead; predicted at the fitted exponent
    assert col.points[3].measured_us == pytest.approx(model(truth, 8) * 1.1 * 1.005, rel=1e-3)
    assert col.points[3].predicted_us == pytest.approx(model(col.alpha, 8))
    assert col.points[0].measured_lo_us < col.points[0].measured_us < col.points[0].measured_hi_us
    assert "chains of 1, 2, 4, 8 services, http mode, 100 requests/s, 6–6 paired runs" in col.note


def test_a_failed_chain_stops_the_calibration() -> None:
    ok = chain_case(1, [100.0] * 3)
    failed = CaseResult("chain", "c2", "http", 100.0, error="LoadFailed: boom")
    with pytest.raises(CalibrationError, match="c2 http: LoadFailed: boom"):
        colocation_of([ok, failed], lambda c, a: 100.0, Mode.HTTP, 100.0)
