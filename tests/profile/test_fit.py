"""fit: split detection, models over sizes and rates, closure — exact expectations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from meshtax.model.components import BASE_COMPONENTS, IPC, OTHER, PARSING, READ, Component
from meshtax.model.costmodel import extra_units
from meshtax.model.sidecar import Mode
from meshtax.profile.fit import SizePoint, choose_split, closure, fit_carried, fit_mode, fit_model

SIZES = [100.0, 1024.0, 4096.0, 16384.0, 32768.0, 65536.0]


def piecewise(a: float, b: float, u: float, split: int) -> list[float]:
    return [a + b * s + u * float(extra_units([s], split)[0]) for s in SIZES]


def test_choose_split_finds_the_unit_size() -> None:
    assert choose_split(SIZES, piecewise(10.0, 0.001, 5.0, 16384), (16384, 65536)) == 16384


def test_choose_split_keeps_a_straight_line() -> None:
    line = [10.0 + 0.001 * s + (0.3 if i % 2 else -0.3) for i, s in enumerate(SIZES)]
    assert choose_split(SIZES, line, (16384, 65536)) is None
    exact = [10.0 + 0.001 * s for s in SIZES]
    assert choose_split(SIZES, exact, (16384,)) is None  # nothing left to explain


def test_choose_split_needs_sizes_beyond_the_split() -> None:
    small = [100.0, 1024.0, 4096.0]
    assert choose_split(small, [1.0, 2.0, 9.0], (16384,)) is None


def test_fit_model_recovers_parameters() -> None:
    m = fit_model(SIZES, piecewise(10.0, 0.001, 5.0, 16384), candidates=(16384, 65536), note="x")
    assert m.split_bytes == 16384
    assert m.intercept == pytest.approx(10.0)
    assert m.slope == pytest.approx(0.001)
    assert m.per_unit == pytest.approx(5.0)
    assert m.note == "x"
    plain = fit_model([100.0, 1100.0], [2.0, 3.0], rates=[10.0, 20.0])
    assert plain.split_bytes is None
    assert [plain.intercept, plain.slope] == pytest.approx([1.9, 0.001])
    assert plain.samples is not None and plain.samples.rates == (10.0, 20.0)


def point(
    size: int,
    ipc: float,
    other: float,
    overhead: float,
    lo: float,
    hi: float,
    cpu: tuple[tuple[float, Mapping[Component, float]], ...] = (),
) -> SizePoint:
    return SizePoint(size, {IPC: ipc, OTHER: other}, overhead, lo, hi, cpu)


def test_closure_averages_over_sizes() -> None:
    pts = [point(100, 1.0, 9.0, 10.0, 8.0, 12.0), point(1000, 2.0, 12.0, 20.0, 18.0, 24.0)]
    c = closure(pts, 0.15)
    assert (c.measured_us, c.measured_lo_us, c.measured_hi_us, c.components_us) == (
        15.0,
        13.0,
        18.0,
        12.0,
    )
    assert c.error == pytest.approx(-0.2)
    assert not c.closes
    assert closure(pts[:1], 0.15).closes
    with pytest.raises(ValueError):
        closure([], 0.15)


def test_fit_mode_latency_cpu_and_missing_components() -> None:
    cpu1 = ((100.0, {IPC: 2.0, OTHER: 4.0}), (200.0, {IPC: 2.0, OTHER: 4.0}))
    cpu2 = ((100.0, {IPC: 3.0, OTHER: 4.0}), (200.0, {IPC: 3.0, OTHER: 4.0}))
    pts = [
        point(100, 1.0, 10.0, 11.0, 10.0, 12.0, cpu1),
        point(1100, 2.0, 10.0, 12.0, 11.0, 13.0, cpu2),
    ]
    mp = fit_mode(Mode.TCP, pts, candidates=(16384,), tolerance=0.15)
    assert set(mp.components) == set(BASE_COMPONENTS)
    ipc = mp.components[IPC]
    assert [ipc.latency.intercept, ipc.latency.slope] == pytest.approx([0.9, 0.001])
    assert [ipc.cpu.intercept, ipc.cpu.slope] == pytest.approx([1.9, 0.001])
    assert ipc.cpu.samples is not None and ipc.cpu.samples.rates == (100.0, 200.0, 100.0, 200.0)
    # components not measured are fitted as zero, not dropped
    assert mp.components[PARSING].latency.intercept == 0.0
    assert mp.components[READ].cpu.predict([500.0])[0] == 0.0
    assert mp.closure is not None and mp.closure.closes  # 11.5 vs 11.5


def test_fit_mode_without_cpu_and_without_points() -> None:
    mp = fit_mode(Mode.HTTP, [point(100, 1.0, 2.0, 3.0, 2.0, 4.0)])
    assert mp.components[IPC].cpu.note == "CPU not measured"
    assert mp.components[IPC].latency.intercept == 1.0
    with pytest.raises(ValueError, match="no measurements"):
        fit_mode(Mode.HTTP, [])


def test_fit_carried_fits_each_protocol_like_the_mode() -> None:
    base_pts = [point(100, 1.0, 10.0, 11.0, 10.0, 12.0, ((4000.0, {OTHER: 2.0}),))]
    base = fit_mode(Mode.TCP, base_pts)
    # gRPC through the tcp sidecar: Other CPU 6 µs at 4000/s and 20 µs at 100/s at both sizes;
    # IPC latency 2 µs + 0.001 µs/B
    cpu = ((4000.0, {OTHER: 6.0}), (100.0, {OTHER: 20.0}))
    g = [
        point(100, 2.1, 12.0, 15.0, 14.0, 16.0, cpu),
        point(4100, 6.1, 12.0, 19.0, 18.0, 20.0, cpu),
    ]
    mp = fit_carried(base, {"grpc": g, "http": []}, tolerance=0.15)
    assert set(mp.carried) == {"grpc"}  # a protocol without points is left out
    assert mp.components == base.components and mp.closure == base.closure
    c = mp.carried["grpc"]
    assert c.mode is Mode.TCP and set(c.components) == set(base.components) == set(BASE_COMPONENTS)
    ipc = c.components[IPC].latency
    assert [ipc.intercept, ipc.slope] == pytest.approx([2.0, 0.001])
    other = c.components[OTHER].cpu
    assert other.samples is not None and other.samples.rates == (4000.0, 100.0, 4000.0, 100.0)
    # the rates reach CostModel.fit: 6 µs at the highest rate, 20 at the lowest
    assert other.predict([100.0], [4000.0])[0] == pytest.approx(6.0)
    assert other.predict([4100.0], [100.0])[0] == pytest.approx(20.0)
    # closure: components (14.1 + 18.1) / 2 = 16.1 vs measured 17 → −5.3 %
    assert c.closure is not None and c.closure.components_us == pytest.approx(16.1)
    assert c.closure.measured_us == pytest.approx(17.0) and c.closure.closes
    # models already carried for another protocol are kept; a refit replaces its own
    again = fit_carried(replace(mp, carried={"http": base, **mp.carried}), {"grpc": g[:1]})
    assert set(again.carried) == {"grpc", "http"} and again.carried["http"] is base
    assert again.carried["grpc"].components[IPC].latency.slope == 0.0
