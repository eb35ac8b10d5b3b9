"""Simulated waiting times against exact queueing results (M/M/1, M/D/1, M/M/c, D/D/1)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meshtax.predict.queueing import (
    SaturatedError,
    ServiceMix,
    Shape,
    Station,
    erlang_c,
    md1_cdf,
    mm1_tail,
    waiting_times,
)

JOBS = 400_000


def exponential() -> Shape:
    """Exp(1) as a fine quantile sketch (its far tail capped: mean and SCV within 0.3 %)."""
    p = np.concatenate([np.linspace(0.0, 0.999, 4000), 1.0 - np.logspace(-3.1, -9, 80), [1.0]])
    v = -np.log1p(-np.minimum(p, 1.0 - 1e-12))
    return Shape.from_quantiles(p, v)


def test_exponential_sketch_is_exponential() -> None:
    s = exponential()
    assert s.mean() == pytest.approx(1.0)
    assert s.scv() == pytest.approx(1.0, abs=0.01)
    assert Shape.constant().scv() == pytest.approx(0.0)


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_mm1_waiting_time_tail(rho: float) -> None:
    mean_s = 50.0
    rate = rho / mean_s * 1e6
    w = waiting_times(Station(rate, 1, ServiceMix((mean_s,), (1.0,), (exponential(),))), JOBS)
    for t in (0.0, 50.0, 200.0, 500.0):
        exact = float(mm1_tail(t, rate, mean_s))
        assert float((w > t).mean()) == pytest.approx(exact, rel=0.06, abs=0.004), t
    # the mean: ρ/(μ − λ)
    assert w.mean() == pytest.approx(rho * mean_s / (1 - rho), rel=0.06)


def test_md1_waiting_time_distribution_and_mean() -> None:
    d, rho = 40.0, 0.8
    rate = rho / d * 1e6
    w = waiting_times(Station(rate, 1, ServiceMix((d,), (1.0,))), JOBS)
    assert w.mean() == pytest.approx(rho * d / (2 * (1 - rho)), rel=0.05)  # Pollaczek–Khinchine
    for t in (0.0, 20.0, 40.0, 100.0, 200.0):
        assert float((w <= t).mean()) == pytest.approx(md1_cdf(t, rate, d), abs=0.01), t
    assert md1_cdf(0.0, rate, d) == pytest.approx(1 - rho)


def test_mmc_probability_of_waiting_is_erlang_c() -> None:
    mean_s, c = 100.0, 3
    rate = 0.75 * c / mean_s * 1e6
    w = waiting_times(Station(rate, c, ServiceMix((mean_s,), (1.0,), (exponential(),))), JOBS)
    pw = erlang_c(c, rate, mean_s)
    assert float((w > 0).mean()) == pytest.approx(pw, abs=0.01)
    # conditional on waiting, the wait is exponential with rate cμ − λ
    theta = c / mean_s - rate * 1e-6
    assert float(w[w > 0].mean()) == pytest.approx(1 / theta, rel=0.06)


def test_evenly_spaced_arrivals_and_constant_service_never_wait() -> None:
    w = waiting_times(Station(10_000.0, 1, ServiceMix((90.0,), (1.0,)), ca2=0.0), 10_000)
    assert float(w.max()) == 0.0


def test_saturated_station_is_refused_and_idle_one_never_waits() -> None:
    with pytest.raises(SaturatedError):
        waiting_times(Station(20_000.0, 1, ServiceMix((50.0,), (1.0,))))
    assert float(waiting_times(Station(0.0, 1, ServiceMix((50.0,), (1.0,))), 100).max()) == 0.0


def test_service_mix_moments_and_classes() -> None:
    mix = ServiceMix((10.0, 30.0), (3.0, 1.0), (Shape.constant(), exponential()), (0, 1))
    assert mix.mean() == pytest.approx(0.75 * 10 + 0.25 * 30)
    assert mix.second_moment() == pytest.approx(0.75 * 100 + 0.25 * 900 * 2, rel=0.01)
    x = mix.sample(200_000, np.random.default_rng(1))
    assert float(x.mean()) == pytest.approx(mix.mean(), rel=0.01)
    assert float((x == 10.0).mean()) == pytest.approx(0.75, abs=0.01)


def test_shape_from_differences_is_made_monotone_and_normalised() -> None:
    s = Shape.from_quantiles((0.0, 0.5, 1.0), (2.0, 1.0, 4.0))  # dips: running maximum
    assert s.values[0] == s.values[1] and s.mean() == pytest.approx(1.0)
    assert Shape.from_quantiles((0.0, 1.0), (0.0, 0.0)) == Shape.constant()
    with pytest.raises(ValueError):
        Shape((0.0, 0.5), (1.0, 1.0))


def test_md1_formula_matches_its_known_values() -> None:
    # t = D: the terms k = 0 (e^{ρ}) and k = 1 (0), so P(W ≤ D) = (1 − ρ)·e^{ρ}
    assert md1_cdf(1.0, 0.5e6, 1.0) == pytest.approx(0.5 * math.exp(0.5))


def test_clients_bound_the_queue() -> None:
    d = 10.0
    const = ServiceMix((d,), (1.0,))
    # one client per server: nobody ever waits for a server
    for servers in (1, 2):
        st = Station(0.9 * servers / d * 1e6, servers, const, 1.0, clients=servers)
        assert waiting_times(st, 20_000).max() == pytest.approx(0.0)
    # overloaded twice over with 4 clients: the station stays full, each job finds 3 ahead
    st = Station(2.0 / d * 1e6, 1, const, 1.0, clients=4)
    assert st.utilisation == pytest.approx(2.0)
    w = waiting_times(st, 20_000)
    assert np.median(w) == pytest.approx(3 * d) and w.max() <= 3 * d + 1e-6
    # many clients at ρ = 0.5: as open as without them (M/M/1's mean wait ρ/(μ − λ))
    mm1 = ServiceMix((50.0,), (1.0,), (exponential(),))
    w = waiting_times(Station(1e4, 1, mm1, 1.0, clients=10_000), JOBS)
    assert w.mean() == pytest.approx(50.0, rel=0.06)
    with pytest.raises(ValueError, match="clients"):
        Station(1.0, 1, const, clients=0)


def test_gamma_shape_has_its_scv() -> None:
    for scv in (0.5, 1.0, 3.0):
        g = Shape.gamma(scv)
        assert g.mean() == pytest.approx(1.0) and g.scv() == pytest.approx(scv, rel=0.03)
    assert Shape.gamma(0.0) == Shape.constant()


def test_a_paced_schedule_waits_only_as_far_as_its_sends_are_late() -> None:
    # issue #20: fortio -uniform at a fixed rate sends on an even schedule. D/D/1 at ρ = 0.5
    # never waits; each send late by an exponential lag of mean ≫ the spacing (200 µs), the
    # arrivals are locally Poisson and the waits those of M/D/1 (mean ρ·D / (2(1 − ρ)) = 50)
    mix = ServiceMix((100.0,), (1.0,))
    assert waiting_times(Station(5000, 1, mix, jitter_us=0.0), 50_000).max() == 0
    small = waiting_times(Station(5000, 1, mix, jitter_us=20.0), 100_000, seed=1)
    large = waiting_times(Station(5000, 1, mix, jitter_us=10_000.0), 200_000, seed=1)
    assert small.mean() < 1.0
    assert large.mean() == pytest.approx(50.0, rel=0.12)
    with pytest.raises(ValueError):
        Station(5000, 1, mix, jitter_us=-1.0)


def test_a_client_that_sleeps_in_whole_milliseconds_sends_in_bunches() -> None:
    # issue #20, set 8: fortio on one CPU is one Go scheduler, which waits for its next timer
    # in whole milliseconds. Evenly due every 250 µs, 100 µs of work each: on time nobody
    # waits; a client that wakes only on a response or 1 ms after its last wake-up sends what
    # fell due meanwhile at once, and the last of a bunch waits for those ahead of it
    mix = ServiceMix((100.0,), (1.0,))
    assert waiting_times(Station(4000, 1, mix, 0.0, clients=32), 20_000).max() == 0
    bunched = waiting_times(Station(4000, 1, mix, 0.0, clients=32, wakeup_us=1000.0), 20_000)
    assert np.quantile(bunched, 0.9) >= 200 and bunched.mean() > 100
    # responses in flight keep it awake: it sends at each one, bunches shrink
    awake = Station(4000, 1, mix, 0.0, clients=32, wakeup_us=1000.0, response_us=600.0)
    assert waiting_times(awake, 20_000).mean() < bunched.mean() / 2
    with pytest.raises(ValueError, match="wakeup_us"):
        Station(4000, 1, mix, wakeup_us=1000.0)  # only a closed loop's client wakes
    with pytest.raises(ValueError, match="response_us"):
        Station(4000, 1, mix, clients=32, wakeup_us=1000.0, response_us=-1.0)
