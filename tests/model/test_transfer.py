"""meshtax.model.transfer: the per-mode factor fitted on calibration cases, its interval, the
part of a prediction it does not scale, leave-one-topology-out, the document round trip."""

from __future__ import annotations

import pytest

from meshtax.model.sidecar import Mode
from meshtax.model.transfer import Transfer, TransferSample, fit_transfer, loto_errors


def s(
    topo: str, mode: Mode, measured: float, per_message: float, fixed: float = 0.0
) -> TransferSample:
    return TransferSample(topo, mode, measured, per_message, fixed)


def test_factor_is_the_median_ratio_of_the_per_message_part_per_mode() -> None:
    samples = [
        s("a", Mode.HTTP, 1200, 1000),  # 1.2
        s("b", Mode.HTTP, 1500, 1000, 100),  # (1500 − 100) / 1000 = 1.4: idle not scaled
        s("c", Mode.HTTP, 900, 1000),  # 0.9
        s("a", Mode.TCP, 500, 1000),  # 0.5
        s("z", Mode.TCP, 100, 0, 100),  # no per-message part: skipped
    ]
    t = fit_transfer(samples, "unit")
    assert t.modes[Mode.HTTP].factor == pytest.approx(1.2)
    assert t.modes[Mode.HTTP].cases == 3 and t.modes[Mode.TCP].cases == 1
    assert t.factor(Mode.TCP) == pytest.approx(0.5)
    assert t.factor(Mode.GRPC) == 1.0  # not calibrated: unchanged
    h = t.modes[Mode.HTTP]
    assert h.lo <= h.factor <= h.hi and h.lo == pytest.approx(0.9) and h.hi == pytest.approx(1.4)
    assert "http ×1.20" in t.describe() and "unit" in t.describe()


def test_round_trip_and_refusals() -> None:
    t = fit_transfer([s("a", Mode.GRPC, 300, 200), s("b", Mode.GRPC, 260, 200)], "suite x")
    assert Transfer.from_dict(t.to_dict()) == t
    with pytest.raises(ValueError, match="less CPU than the idle sidecars"):
        fit_transfer([s("a", Mode.TCP, 50, 100, 80)], "x")  # (50 − 80) / 100 < 0
    with pytest.raises(ValueError, match="no calibration case"):
        fit_transfer([s("a", Mode.TCP, 50, 0, 80)], "x")


def test_leave_one_topology_out_fits_without_the_topology_it_predicts() -> None:
    samples = [
        s("a", Mode.HTTP, 200, 100),  # ratio 2
        s("b", Mode.HTTP, 100, 100),  # ratio 1
        s("c", Mode.HTTP, 150, 100, 10),  # ratio 1.4
        s("c", Mode.TCP, 100, 100),  # the only tcp case: factor 1 when c is left out
    ]
    errs = loto_errors(samples)
    # a: fit on b, c → median(1, 1.4) = 1.2 → 120 vs 200; b: median(2, 1.4) = 1.7 → 170 vs 100;
    # c: median(2, 1) = 1.5 → 160 vs 150; c tcp: 1 → 100 vs 100
    assert errs == pytest.approx([120 / 200 - 1, 170 / 100 - 1, 160 / 150 - 1, 0.0])
