"""The microarch part of a profile: metrics per source, round trips, old and future documents."""

from __future__ import annotations

import dataclasses

import pytest

from meshtax.model.components import OTHER
from meshtax.model.microarch import (
    MICROARCH_FORMAT,
    CacheGeometry,
    CacheLevel,
    CounterRow,
    KernelRow,
    Microarch,
    metric,
)
from meshtax.model.profile import Profile
from meshtax.model.profile_check import ProfileError
from meshtax.model.sidecar import Mode
from tests.helpers import flat, profile

GEOM = CacheGeometry(
    CacheLevel(32768, 8, 64), CacheLevel(32768, 8, 64), CacheLevel(32 << 20, 16, 64), "host"
)
ROW = CounterRow(
    "http",
    "base",
    100,
    100,
    500,
    100,
    {
        "Ir": 170e3,
        "I1mr": 6e3,
        "D1mr": 2.6e3,
        "D1mw": 700.0,
        "Bc": 27e3,
        "Bcm": 1.4e3,
        "Bi": 3e3,
        "Bim": 1.9e3,
    },
    {"Ir": 4e5},
    {"Ir": 9e5},
    (),
    {"parsing": {"Ir": 80e3}},
    {"Ir": 1.5e3},
    ({"Ir": 169e3, "D1mr": 2.5e3, "D1mw": 700.0}, {"Ir": 171e3, "D1mr": 2.7e3, "D1mw": 700.0}),
)
MICRO = Microarch(
    "valgrind",
    "valgrind-3.19.0 --tool=callgrind",
    (ROW, dataclasses.replace(ROW, variant="lua+wasm", members=("lua", "wasm"))),
    GEOM,
    "none: whole-process numbers",
    (KernelRow("tcp", 100, 2000, 3.0, 1.0, 1.0, 0.9, 12.5, 8.0),),
    "2026-11-23T06:00:00+00:00",
    ("a note",),
)


def test_metrics_per_source() -> None:
    assert metric(ROW.per_request, "valgrind", "instructions") == 170e3
    assert metric(ROW.per_request, "valgrind", "d1_misses") == 3.3e3
    assert metric(ROW.per_request, "valgrind", "branch_misses") == pytest.approx(3.3e3)
    assert metric(ROW.per_request, "valgrind", "ll_misses") is None  # events not counted
    assert metric(ROW.per_request, "valgrind", "cycles") is None  # not a valgrind metric
    pmu = {"instructions": 1e5, "cycles": 2e5, "branch-misses": 10.0}
    assert metric(pmu, "pmu", "cycles") == 2e5 and metric(pmu, "pmu", "branch_misses") == 10.0
    assert metric(pmu, "pmu", "cond_misses") is None


def test_round_trip_inside_a_profile() -> None:
    p = dataclasses.replace(profile({Mode.HTTP: {OTHER: flat(1, 2)}}), microarch=MICRO)
    d = p.to_dict()
    assert d["microarch"]["format"] == MICROARCH_FORMAT
    assert Profile.from_dict(d) == p
    assert Microarch.from_dict(MICRO.to_dict()) == MICRO
    again = dataclasses.replace(
        ROW,
        rounds=((100, 500), (100, 4100)),
        unresolved=("ll_misses",),
        earlier=(({"Ir": 1.0, "DLmw": 3.0}, {"Ir": 1.0, "DLmw": 0.0}),),
    )
    m = dataclasses.replace(MICRO, rows=(again,))
    assert Microarch.from_dict(m.to_dict()) == m
    assert Profile.from_dict(dataclasses.replace(p, microarch=m).to_dict()).microarch == m


def test_old_documents_load_and_newer_are_refused() -> None:
    p = profile({Mode.HTTP: {OTHER: flat(1, 2)}})
    d = p.to_dict()
    assert "microarch" not in d  # written only when measured
    assert Profile.from_dict(d).microarch is None
    newer = {**MICRO.to_dict(), "format": MICROARCH_FORMAT + 1}
    with pytest.raises(ValueError, match="newer"):
        Microarch.from_dict(newer)
    # a minimal row (first format's required fields) loads with empty extras
    r = CounterRow.from_dict(
        {"mode": "tcp", "variant": "base", "size": 1, "n1": 1, "n2": 2, "per_request": {"Ir": 3}}
    )
    assert r.fixed == {} and r.background == {} and r.members == ()
    # format ≤ 2: one round, its own windows; nothing earlier, nothing unresolved
    assert r.rounds == ((1, 2),) and r.earlier == () and r.unresolved == ()


def test_a_first_format_row_is_one_pair_and_its_main_thread_the_background() -> None:
    d = {**ROW.to_dict(), "main": {"Ir": 7.0}}
    del d["background"], d["pairs"]
    r = CounterRow.from_dict(d)
    assert r.background == {"Ir": 7.0} and r.pairs == (ROW.per_request,)
    assert r.spread("valgrind", "instructions") is None  # one pair: how sure is not known


@pytest.mark.parametrize(
    ("pairs", "name", "spread"),
    [
        (({"Ir": 100.0}, {"Ir": 110.0}, {"Ir": 104.0}), "instructions", 0.05 / 1.04),
        (({"Ir": 100.0}, {"Ir": 100.0}), "instructions", 0.0),
        (({"D1mr": 2.0, "D1mw": 0.5}, {"D1mr": 1.5, "D1mw": 0.5}), "d1_misses", 0.25 / 2.25),
        (({"D1mr": 2.0, "D1mw": 0.5}, {"D1mr": 1.5}), "d1_misses", None),  # a pair lacks it
        (({"Ir": 1.0}, {"Ir": -1.0}), "instructions", None),  # a median of 0
        (({"Ir": 100.0},), "instructions", None),
    ],
)
def test_spread_is_half_the_pairs_range_over_their_median(
    pairs: tuple[dict[str, float], ...], name: str, spread: float | None
) -> None:
    r = dataclasses.replace(ROW, pairs=pairs)
    got = r.spread("valgrind", name)
    assert got == (None if spread is None else pytest.approx(spread))


@pytest.mark.parametrize(
    ("micro", "says"),
    [
        ([], "microarch"),
        ({"source": "valgrind"}, "rows"),
        ({"source": "valgrind", "rows": [{"mode": "tcp"}]}, "variant"),
        ({"source": "valgrind", "rows": [{**ROW.to_dict(), "per_request": {"Ir": "x"}}]}, "Ir"),
        ({"source": "valgrind", "rows": [{**ROW.to_dict(), "mode": "udp"}]}, "mode"),
        ({"source": "valgrind", "rows": [], "kernel": [{"mode": "tcp"}]}, "size"),
        ({**MICRO.to_dict(), "geometry": {"i1": {"size": 3}}}, "assoc"),
    ],
)
def test_a_broken_microarch_part_is_a_profile_error(micro: object, says: str) -> None:
    d = {**profile({Mode.HTTP: {OTHER: flat(1, 2)}}).to_dict(), "microarch": micro}
    with pytest.raises(ProfileError, match=says):
        Profile.from_dict(d, "p.json")


def test_merged_replaces_recounted_rows() -> None:
    newer = Microarch("valgrind", "t2", (dataclasses.replace(ROW, per_request={"Ir": 1.0}),))
    m = MICRO.merged(newer)
    assert [(r.variant, r.per_request.get("Ir")) for r in m.rows] == [
        ("lua+wasm", 170e3),
        ("base", 1.0),
    ]
    assert m.tool == "t2" and m.kernel == MICRO.kernel
    other = Microarch("pmu", "perf", ())
    assert MICRO.merged(other) is other  # sources are never mixed


def test_cache_level_checks_and_describes() -> None:
    assert CacheLevel(32768, 8, 64).sets == 64
    assert CacheLevel(1 << 20, 1, 64).describe() == "1024 KiB direct-mapped, 64 B lines"
    with pytest.raises(ValueError):
        CacheLevel(1000, 8, 64)
    assert "LL 32768 KiB 16-way" in GEOM.describe()


_LL = {"ILmr": 0.0, "DLmr": 0.0}


@pytest.mark.parametrize(
    ("ll", "ir", "unresolved"),
    [
        ((0.11, 0.11, 0.02), (2e5, 2e5, 2e5), []),  # below half of one a request: not compared
        ((0.965, 0.644, 0.965), (2e5, 2e5, 2e5), ["ll_misses"]),  # median ≥ 0.5, ±16.6 %
        ((0.04, 0.03, 1.2), (2e5, 2e5, 2e5), ["ll_misses"]),  # a pair reaches one a request
        ((2.0, 2.05, 2.02), (2e5, 2e5, 2e5), []),  # ±1.2 %: within 5 %
        ((0.0, 0.0, 0.0), (2e5, 2.06e5, 2.12e5), ["instructions"]),  # ±2.9 % > 2 %
        ((1.0, -1.0, 0.0), (2e5, 2e5, 2e5), ["ll_misses"]),  # a median of 0: cannot tell
    ],
)
def test_unresolved_by_pairs(
    ll: tuple[float, ...], ir: tuple[float, ...], unresolved: list[str]
) -> None:
    pairs = tuple({"Ir": i, **_LL, "DLmw": x} for i, x in zip(ir, ll))
    assert dataclasses.replace(ROW, pairs=pairs).unresolved_by_pairs("valgrind") == unresolved
