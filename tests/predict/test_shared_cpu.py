"""Shared CPUs: the rate each message is priced at, and the crowding the profiler measured."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from meshtax.model.components import OTHER
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.crowding import Crowding, CrowdPoint
from meshtax.model.ecg import EcgBatch, to_batch
from meshtax.model.profile import Colocation, Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.engine import predict_batch, single_profile
from meshtax.predict.shared_cpu import priced_rates, shared_cpu_rates, side_alphas, sidecar_rates
from tests.helpers import EXTERNAL, ecg, inv, profile

HTTP = SidecarConfig(Mode.HTTP)


def test_shared_cpus_price_messages_at_the_rate_that_loads_the_cpu_alike() -> None:
    # OTHER CPU: 2 CPU-µs at 1000/s, +3 per e-fold below, profiled from 10/s; no latency-path effect
    rated = ComponentModel(
        CostModel(0.1), CostModel(2.0, rate_coef=3.0, rate_lo=10.0, rate_hi=1000.0)
    )
    prof = profile({Mode.HTTP: {OTHER: rated}})
    calls = [
        inv("r", EXTERNAL, "A", 0, 100, rate=100),
        inv("b", "A", "B", 10, 30, "r", rate=100),
        inv("c", "A", "C", 50, 30, "r", rate=100),
    ]
    b = to_batch([ecg({"A": HTTP, "B": HTTP, "C": HTTP}, calls)])
    # 10 crossings per request at 100/s = 1000 crossings/s on one CPU: a one-hop at 500/s loads it alike
    assert shared_cpu_rates(b, 1).tolist() == [500.0] * 3
    assert shared_cpu_rates(b, 2).tolist() == [250.0] * 3
    per_crossing = 2.0 + 3.0 * np.log(1000 / 500)
    one = predict_batch(b, single_profile(prof), pod_cpus=1)
    assert one.cpu_vcpu[0] == pytest.approx(10 * per_crossing * 100 * 1e-6)
    # on CPUs of their own, every sidecar is priced at its own rate (100/s)
    own = predict_batch(b, single_profile(prof))
    assert own.cpu_vcpu[0] == pytest.approx(10 * (2.0 + 3.0 * np.log(10)) * 100 * 1e-6)


def test_colocation_exponent_prices_between_each_sidecars_own_rate_and_the_cpus() -> None:
    rated = ComponentModel(
        CostModel(0.1), CostModel(2.0, rate_coef=3.0, rate_lo=10.0, rate_hi=1000.0)
    )
    prof = profile({Mode.HTTP: {OTHER: rated}})
    calls = [
        inv("r", EXTERNAL, "A", 0, 100, rate=100),
        inv("b", "A", "B", 10, 30, "r", rate=100),
        inv("c", "A", "C", 50, 30, "r", rate=100),
    ]
    b = to_batch([ecg({"A": HTTP, "B": HTTP, "C": HTTP}, calls)])
    # A's sidecar carries all three calls (600 crossings/s: a one-hop at 300/s), B's and C's one each;
    # the external client has none (its side keeps the row's rate, nothing is priced there)
    caller, callee = sidecar_rates(b)
    assert (caller.tolist(), callee.tolist()) == ([100.0, 300.0, 300.0], [300.0, 100.0, 100.0])
    assert [x.tolist() for x in priced_rates(b, 1, 0.0)] == [caller.tolist(), callee.tolist()]
    assert [x.tolist() for x in priced_rates(b, 1, 1.0)] == [
        [500.0] * 3
    ] * 2  # the CPU's rate alone
    with pytest.raises(ValueError, match="alpha"):
        priced_rates(b, 1, 1.5)
    # the profile's measured exponent is what predict uses unless told otherwise
    calibrated = replace(prof, colocation={Mode.HTTP: Colocation(0.5, 0.4, 0.6, "http", 100.0)})

    def cost(r: float) -> float:
        return float(2.0 + 3.0 * np.log(1000 / r))

    # A: 6 crossings at √(300·500); B and C: 2 each at √(100·500)
    want = (6 * cost(np.sqrt(300 * 500)) + 4 * cost(np.sqrt(100 * 500))) * 100 * 1e-6
    assert predict_batch(b, single_profile(calibrated), pod_cpus=1).cpu_vcpu[0] == pytest.approx(
        want
    )
    assert predict_batch(b, single_profile(calibrated), pod_cpus=1, alpha=1.0).cpu_vcpu[
        0
    ] == pytest.approx(predict_batch(b, single_profile(prof), pod_cpus=1).cpu_vcpu[0])
    # CPUs of their own: no exponent applies
    assert predict_batch(b, single_profile(calibrated)).cpu_vcpu[0] == pytest.approx(
        predict_batch(b, single_profile(prof)).cpu_vcpu[0]
    )
    # per mode: a tcp-mode sidecar keeps α = 1 when only http was calibrated
    both = replace(
        calibrated,
        modes={**calibrated.modes, Mode.TCP: replace(calibrated.modes[Mode.HTTP], mode=Mode.TCP)},
    )
    mixed = to_batch([ecg({"A": HTTP, "B": SidecarConfig(Mode.TCP), "C": HTTP}, calls)])
    a_caller, a_callee = side_alphas(mixed, single_profile(both))
    assert (a_caller.tolist(), a_callee.tolist()) == (
        [1.0, 0.5, 0.5],
        [0.5, 1.0, 0.5],
    )  # external caller: no sidecar
    want_b = 2 * cost(500.0)  # B's two crossings at the CPU's rate
    want = (6 * cost(np.sqrt(300 * 500)) + want_b + 2 * cost(np.sqrt(100 * 500))) * 100 * 1e-6
    assert predict_batch(mixed, single_profile(both), pod_cpus=1).cpu_vcpu[0] == pytest.approx(want)


def _fanout() -> tuple[Profile, EcgBatch]:
    rated = ComponentModel(
        CostModel(1.0, rate_coef=0.5, rate_lo=10.0, rate_hi=1000.0),
        CostModel(2.0, rate_coef=3.0, rate_lo=10.0, rate_hi=1000.0),
    )
    prof = profile({Mode.HTTP: {OTHER: rated}})
    calls = [
        inv("r", EXTERNAL, "A", 0, 100, rate=100),
        inv("b", "A", "B", 10, 30, "r", rate=100),
        inv("c", "A", "C", 50, 30, "r", rate=100),
    ]
    return prof, to_batch([ecg({"A": HTTP, "B": HTTP, "C": HTTP}, calls)])


def test_crowding_interpolates_in_log_sharing_and_holds_beyond() -> None:
    c = Crowding(
        "http", 100.0, 100, (CrowdPoint(2.0, 0.8, 0.7, 0.9, 5), CrowdPoint(8.0, 0.5, 0.4, 0.6, 5))
    )
    got = c.factor(np.array([0.5, 1.0, 2.0, 4.0, 8.0, 100.0]))
    assert got.tolist() == pytest.approx([1.0, 1.0, 0.8, np.sqrt(0.8 * 0.5), 0.5, 0.5])
    assert Crowding.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="increasing"):
        Crowding("http", 100.0, 100, tuple(reversed(c.points)))
    with pytest.raises(ValueError, match="sharing must be > 1"):
        CrowdPoint(1.0, 0.8, 0.7, 0.9, 5)
    with pytest.raises(ValueError, match="positive ratio"):
        CrowdPoint(2.0, -0.1, 0.7, 0.9, 5)


def test_measured_crowding_prices_at_the_own_rate_times_the_crowding() -> None:
    prof, b = _fanout()
    crowd = Crowding("http", 100.0, 100, (CrowdPoint(5.0, 0.5, 0.45, 0.55, 6),))
    crowded = replace(prof, crowding={Mode.HTTP: crowd})
    # the CPU carries 10 crossings at 100/s (one-hop 500/s); A's sidecar 300/s, B's and C's 100/s
    # sharing: A 500/300 (interpolated between 1 and the measured 5), B and C 500/100 = 5
    f_a = float(np.exp(np.log(0.5) * np.log(500 / 300) / np.log(5.0)))

    def cpu(r: float) -> float:
        return float(2.0 + 3.0 * np.log(1000 / r))

    def lat(r: float) -> float:
        return float(1.0 + 0.5 * np.log(1000 / r))

    got = predict_batch(b, single_profile(crowded), pod_cpus=1)
    want = (6 * cpu(300) * f_a + 4 * cpu(100) * 0.5) * 100 * 1e-6
    assert got.cpu_vcpu[0] == pytest.approx(want)
    # latency: the per-row caller/callee split carries the same factors
    assert got.row_latency_callee_us.tolist() == pytest.approx(
        [2 * lat(300) * f_a, 2 * lat(100) * 0.5, 2 * lat(100) * 0.5]
    )
    # crowding beats a calibrated exponent; an explicit alpha beats both
    both = replace(crowded, colocation={Mode.HTTP: Colocation(0.0, 0.0, 0.1, "http", 100.0)})
    assert predict_batch(b, single_profile(both), pod_cpus=1).cpu_vcpu[0] == pytest.approx(want)
    forced = predict_batch(b, single_profile(both), pod_cpus=1, alpha=1.0)
    plain = predict_batch(b, single_profile(prof), pod_cpus=1)
    assert forced.cpu_vcpu[0] == pytest.approx(plain.cpu_vcpu[0])
    # CPUs of their own: no crowding
    alone = predict_batch(b, single_profile(crowded))
    assert alone.cpu_vcpu[0] == pytest.approx(predict_batch(b, single_profile(prof)).cpu_vcpu[0])
