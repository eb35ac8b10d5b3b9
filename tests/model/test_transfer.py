"""meshtax.model.transfer: a factor per cost model fitted on calibration cases — the model
that dominates a case, the others at their own factors, the part no factor scales — its
interval, leave-one-topology-out, the fall-back to the mode's factor, the document round trip."""

from __future__ import annotations

import pytest

from meshtax.model.sidecar import Mode
from meshtax.model.transfer import (
    Transfer,
    TransferSample,
    fit_factors,
    fit_transfer,
    key,
    loto_errors,
)


def s(topo: str, measured: float, fixed: float = 0.0, **parts: float) -> TransferSample:
    return TransferSample(topo, measured, {k.replace("_", "+"): v for k, v in parts.items()}, fixed)


def test_keys_name_the_model_a_message_is_priced_with() -> None:
    assert key(Mode.HTTP) == "http" and key(Mode.TCP) == "tcp"
    assert key(Mode.TCP, "grpc") == "tcp+grpc"
    assert key(Mode.HTTP, "grpc") == "http"  # only a tcp-mode sidecar carries a protocol


def test_a_factor_is_the_median_ratio_over_the_cases_its_model_dominates() -> None:
    samples = [
        s("a", 1200, http=1000),  # 1.2
        s("b", 1500, 100, http=1000),  # (1500 − 100) / 1000 = 1.4: the idle part not scaled
        s("c", 900, http=1000),  # 0.9
        s("a", 500, tcp=1000),  # 0.5
        s("z", 100, 100),  # no per-message part: skipped
    ]
    t = fit_transfer(samples, "unit")
    assert t.factor("http") == pytest.approx(1.2)
    assert t.factors["http"].cases == 3 and t.factors["tcp"].cases == 1
    h = t.factors["http"]
    assert (h.lo, h.hi) == pytest.approx((0.9, 1.4))
    assert t.factor("tcp+grpc") == pytest.approx(0.5)  # not measured: its mode's factor
    assert t.factor("grpc") == 1.0  # not calibrated at all: unchanged
    assert "http ×1.20" in t.describe() and "unit" in t.describe()


def test_a_case_of_two_models_prices_the_minor_one_at_its_own_factor() -> None:
    # tcp+grpc dominates "v" (800 of 1000); its 200 of plain tcp take tcp's factor 2 (from "t")
    samples = [s("t", 200, tcp=100), s("v", 1600, tcp=200, tcp_grpc=800)]
    f = {k: rs[0] for k, rs in fit_factors(samples).items()}
    assert f == pytest.approx({"tcp": 2.0, "tcp+grpc": (1600 - 2 * 200) / 800})
    # no model carries half of this case's per-message CPU: it dominates nothing
    assert s("x", 1, http=40, grpc=40, tcp=20).dominant() is None


def test_round_trip_and_refusals() -> None:
    t = fit_transfer([s("a", 300, grpc=200), s("b", 260, grpc=200)], "suite x")
    assert Transfer.from_dict(t.to_dict()) == t
    with pytest.raises(ValueError, match="less CPU than the rest"):
        fit_transfer([s("a", 50, 80, tcp=100)], "x")  # (50 − 80) / 100 < 0
    with pytest.raises(ValueError, match="no calibration case"):
        fit_transfer([s("a", 50, 80)], "x")


def test_leave_one_topology_out_fits_without_the_topology_it_predicts() -> None:
    samples = [
        s("a", 200, http=100),  # ratio 2
        s("b", 100, http=100),  # ratio 1
        s("c", 150, 10, http=100),  # ratio 1.4
        s("c", 100, tcp=100),  # the only tcp case: factor 1 when c is left out
    ]
    errs = loto_errors(samples)
    # a: fit on b, c → median(1, 1.4) = 1.2 → 120 vs 200; b: median(2, 1.4) = 1.7 → 170 vs 100;
    # c: median(2, 1) = 1.5 → 160 vs 150; c tcp: 1 → 100 vs 100
    assert errs == pytest.approx([120 / 200 - 1, 170 / 100 - 1, 160 / 150 - 1, 0.0])


def test_latency_has_factors_of_its_own_when_fitted_else_the_cpus() -> None:
    cpu = [s("a", 300, grpc=200), s("b", 260, grpc=200)]  # grpc ×1.4 (median of 1.5, 1.3)
    lat = [s("a", 180, 20, grpc=200), s("b", 220, 20, tcp=10, grpc=200)]  # ×0.8, ×1.0 − tcp's
    t = fit_transfer(cpu, "suite x", lat)
    assert t.factor("grpc") == pytest.approx(1.4)
    assert t.latency_factor("grpc") == pytest.approx(((180 - 20) / 200 + (220 - 20 - 10) / 200) / 2)
    assert t.latency_factor("tcp+grpc") == 1.0  # no latency factor for tcp: unchanged, not CPU's
    assert "latency grpc ×0.88" in t.describe() and "CPU grpc ×1.40" in t.describe()
    assert Transfer.from_dict(t.to_dict()) == t
    old = fit_transfer(cpu, "suite x")  # no latency samples: latency takes the CPU's factors
    assert old.latency_factor("grpc") == pytest.approx(1.4) and "latency" not in old.to_dict()
    assert "latency_factors" not in old.to_dict()
    bad = fit_transfer(cpu, "x", [s("a", 10, 100, grpc=50)])  # (10 − 100) / 50 < 0
    assert not bad.latency and bad.factor("grpc") == pytest.approx(1.4)
    assert "latency at the CPU factors" in bad.source and "less latency than" in bad.source
