"""The load factor's plateau: a sidecar's capacity runs near the closed loop priced at their
mean busy CPU, not each from its own single run (issue #20, set 17)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from meshtax.model.capacity import Capacity, CapacityPoint
from meshtax.model.components import OTHER
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.ecg import to_batch
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.engine import single_profile
from meshtax.predict.load_factor import load_factor
from meshtax.predict.stations import TailOptions
from meshtax.predict.tail import predict_tail
from tests.helpers import EXTERNAL, ecg, inv, profile


def _profile(runs: tuple[tuple[float, float], ...]) -> Profile:
    """One client's models: 50 CPU-µs a crossing at any rate. The ramp through the sidecar:
    ``runs`` (rate, CPU-s a second), the closed loop 10 000/s at 0.4 CPU-s a second."""
    cpu = CostModel(50.0, rate_lo=100.0, rate_hi=10_000.0)
    base = profile({Mode.HTTP: {OTHER: ComponentModel(CostModel(1.0), cpu)}})
    pts = (CapacityPoint(0.0, 10_000.0, 0.4, 0.9),) + tuple(
        CapacityPoint(r, r, busy, 0.9) for r, busy in runs
    )
    cap = Capacity(10_000.0, 100, 32, 1, 40.0, "shared-cpu", points=pts)
    return replace(base, modes={Mode.HTTP: replace(base.modes[Mode.HTTP], capacity=cap)})


def test_the_runs_near_the_closed_loop_are_priced_at_their_mean_busy_cpu() -> None:
    # 5 000/s at 0.5, 7 500/s at 0.6, 9 000/s at 0.38 (one short run), the closed loop at 0.4:
    # from 7 500/s up the mean, (0.6 + 0.38 + 0.4) / 3 = 0.46 CPU-s a second
    mp = _profile(((5000.0, 0.5), (7500.0, 0.6), (9000.0, 0.38))).modes[Mode.HTTP]
    rates = np.array([5000.0, 7500.0, 9000.0, 10_000.0])
    own = load_factor(mp, rates)
    flat = load_factor(mp, rates, plateau=True)
    crossing = 2 * 50.0  # the models' price of the run's two crossings, µs
    assert (own * crossing).tolist() == pytest.approx([100.0, 80.0, 380 / 9, 40.0])
    assert (flat * crossing).tolist() == pytest.approx([100.0, 61.33333, 51.11111, 46.0])
    assert flat[2] > own[2]  # the short run's price is lifted to the plateau's


def test_a_single_run_near_the_closed_loop_is_kept_as_measured() -> None:
    mp = _profile(((5000.0, 0.5),)).modes[Mode.HTTP]
    rates = np.array([5000.0, 8000.0, 10_000.0])
    # the closed loop alone at ≥ 7 500/s: nothing to average
    assert load_factor(mp, rates, plateau=True).tolist() == load_factor(mp, rates).tolist()


def test_the_tail_model_prices_a_sidecar_near_its_closed_loop_at_the_plateau() -> None:
    # one sidecar on one shared CPU at 9 000/s, the short run's own rate: its busy CPU from the
    # plateau (0.46 CPU-s a second) instead of the run's 0.38
    prof = single_profile(_profile(((5000.0, 0.5), (7500.0, 0.6), (9000.0, 0.38))))
    b = to_batch(
        [ecg({"A": SidecarConfig(Mode.HTTP)}, [inv("r", EXTERNAL, "A", 0, 100, rate=9000.0)])]
    )
    o = TailOptions(percentiles=(50.0, 90.0), samples=50, pod_cpus=1, clients=32)
    own = predict_tail(b, prof, o).stations[-1].utilisation
    flat = predict_tail(b, prof, replace(o, ramp_plateau=True)).stations[-1].utilisation
    assert flat == pytest.approx(own * 0.46 / 0.38, rel=0.02)
