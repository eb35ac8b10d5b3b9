"""The microarchitectural profile against a fake world with known counts per request, per
window and per first use; profile_extras stores it; kernel rows from a recorded profile; one
real run (root, slow): two Envoys agree on instructions per request."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from meshtax.model.microarch import Microarch, metric
from meshtax.model.profile import Provenance
from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends
from meshtax.profile.extras import ExtrasOptions, profile_extras
from meshtax.profile.filters import ModeRun, VariantSamples
from meshtax.profile.microarch import (
    DEFAULT_FILTERS,
    Attribution,
    MicroarchOptions,
    classify,
    combos_for,
    count_mode,
    fill_instructions,
    kernel_rows,
)
from meshtax.testbed.callgrind import SymbolMap
from meshtax.testbed.counters import FakeCounterSource
from meshtax.testbed.envoy.filters import COMBINATIONS, SAHU_MIXES
from meshtax.testbed.envoy.variants import QUIET_ARGS, QUIET_TIMERS
from meshtax.testbed.pods import Testbed
from meshtax.testbed.runstate import FakeProcOps
from meshtax.testbed.system import FakeSystem, Placement, RealSystem
from tests.helpers import profile
from tests.profile.fakes import FakeWorld, fake_backends, no_echo

#: per request, per variant: instructions (Ir), I1 misses, conditional branches
EVENTS = {
    "base": {"Ir": 170_000.0, "I1mr": 6000.0, "Bc": 27_000.0, "Bcm": 1400.0},
    "tap": {"Ir": 500_000.0, "I1mr": 9000.0, "Bc": 60_000.0, "Bcm": 2000.0},
    "lua": {"Ir": 184_000.0, "I1mr": 6500.0, "Bc": 29_000.0, "Bcm": 1500.0},
    "rbac_http_10000": {"Ir": 3_600_000.0, "I1mr": 6100.0, "Bc": 900_000.0, "Bcm": 1500.0},
}
FIXED = {"Ir": 400_000.0, "I1mr": 3000.0, "Bc": 60_000.0, "Bcm": 5000.0}  # per window
FIRST = {"Ir": 900_000.0, "I1mr": 16_000.0, "Bc": 50_000.0, "Bcm": 10_000.0}  # first use


def world_source(world: FakeWorld, events: Mapping[str, Mapping[str, float]]) -> FakeCounterSource:
    """Cumulative counts of the fake Envoy: every load so far, its windows and first uses."""

    def total() -> dict[str, float]:
        acc: dict[str, float] = {}
        seen: set[str] = set()
        for name, _size, n in world.loads:
            per = events[name]
            for e in per:
                acc[e] = (
                    acc.get(e, 0.0) + per[e] * n + FIXED[e] + (FIRST[e] if name not in seen else 0)
                )
            seen.add(name)
        return acc

    return FakeCounterSource(total)


@pytest.mark.parametrize(
    ("quick", "per_request", "windows"),
    [
        (False, None, (100, 500)),  # no estimate: the default windows
        (False, 170_000, (100, 880)),  # 1.5e8 / 170k = 882 → two digits
        (False, 21_000, (100, 7100)),  # cheap: more requests, so a few misses are resolved
        (False, 3.6e6, (10, 42)),  # costly: fewer requests, n1 scaled alike
        (False, 1e9, (10, 40)),  # at least min_n2
        (False, 100.0, (100, 10_000)),  # at most max_n2
        (True, 100_000, (50, 600)),
        (True, 21_000, (50, 2900)),
        (True, 1e6, (12, 60)),
    ],
)
def test_windows_spend_the_budget(
    quick: bool, per_request: float | None, windows: tuple[int, int]
) -> None:
    o = MicroarchOptions.quick() if quick else MicroarchOptions()
    assert o.windows(per_request) == windows


def test_count_mode_separates_steady_fixed_and_warmup(tb: Testbed) -> None:
    comps = ["tap", "lua", "rbac_http_10000"]
    world = FakeWorld({v: 1.0 for v in EVENTS}, {v: 1.0 for v in EVENTS}, {v: 0.0 for v in EVENTS})
    src = world_source(world, EVENTS)
    mc = count_mode(tb, fake_backends(world), Mode.HTTP, comps, src, MicroarchOptions())
    assert [r.variant for r in mc.rows] == ["base", *comps]
    for r in mc.rows:
        assert r.per_request == pytest.approx(EVENTS[r.variant])
        assert len(r.pairs) == 3 and all(p == pytest.approx(EVENTS[r.variant]) for p in r.pairs)
        assert r.spread("valgrind", "instructions") == 0.0
        assert r.fixed == pytest.approx(FIXED)
        assert r.warmup == pytest.approx(FIRST)
        assert r.mode == "http" and r.size == 100 and r.warmup_n == 100
        assert r.background == {}  # one thread: nothing counted apart
    rbac = next(r for r in mc.rows if r.variant == "rbac_http_10000")
    assert (rbac.n1, rbac.n2) == (10, 42)
    assert ("rbac_http_10000", 100, 42) in world.loads
    assert mc.named_share is None and src.opened == [4242]


def test_each_variant_is_warmed_settled_then_counted_in_alternating_pairs(tb: Testbed) -> None:
    world = FakeWorld({"base": 1.0}, {"base": 1.0}, {"base": 0.0})
    src = world_source(world, {"base": EVENTS["base"]})
    opts = MicroarchOptions(pairs=3, settle=2, settle_n=5)
    (row,) = count_mode(tb, fake_backends(world), Mode.TCP, [], src, opts).rows
    n1, n2 = row.n1, row.n2
    assert [n for _v, _s, n in world.loads] == [100, 5, 5, n1, n2, n2, n1, n1, n2]
    # the counting Envoy runs without its wall-clock timers (stats flush, watchdogs)
    (boot,) = world.boots
    assert boot["stats_flush_on_admin"] is True
    assert boot["watchdogs"] == QUIET_TIMERS["watchdogs"]
    # … and file access logs flush by size, not on their 10 s timer (a command-line option)
    assert world.args == [QUIET_ARGS] and "--file-flush-interval-msec" in QUIET_ARGS
    assert row.rounds == ((n1, n2),) and row.unresolved == ()  # resolved by its pairs


def test_a_costly_connection_does_not_shrink_the_windows(tb: Testbed) -> None:
    """Network RBAC with 10 000 rules: 2.5 M instructions once per connection, 21 k per
    request. The warm-up less the last settling window cancels the connection's cost, so
    the windows are those of 21 k per request (the warm-up alone says 46 k)."""
    world = FakeWorld({"base": 1.0}, {"base": 1.0}, {"base": 0.0})

    def total() -> dict[str, float]:
        return {"Ir": sum(21_000.0 * n + 2.5e6 for _v, _s, n in world.loads)}

    src = FakeCounterSource(total)
    (row,) = count_mode(tb, fake_backends(world), Mode.TCP, [], src, MicroarchOptions()).rows
    assert (row.n1, row.n2) == MicroarchOptions().windows(21_000) == (100, 7100)
    assert row.per_request == pytest.approx({"Ir": 21_000.0})
    assert row.fixed == pytest.approx({"Ir": 2.5e6})
    no_settling = MicroarchOptions(settle=0)
    (row,) = count_mode(tb, fake_backends(world), Mode.TCP, [], src, no_settling).rows
    assert (row.n1, row.n2) == no_settling.windows(46_000) == (100, 3300)


def test_threads_that_serve_no_request_are_counted_apart(tb: Testbed) -> None:
    """A worker whose work grows with requests; a main thread and a watchdog whose work
    follows each window's wall time (here: a constant per window plus a trickle per request,
    as a longer window runs longer): per request is the worker's alone."""
    world = FakeWorld({"base": 1.0}, {"base": 1.0}, {"base": 0.0})
    worker = {"Ir": 21_000.0, "D1mr": 2.0, "D1mw": 0.2}

    def threads() -> dict[int, dict[str, float]]:
        windows = len(world.loads)
        n = sum(k for _v, _s, k in world.loads)
        return {
            1: {"Ir": 5000.0 * windows + 0.5 * n, "D1mr": 90.0 * windows},
            4: {"Ir": 3000.0 * windows + 2.0 * n, "D1mr": 50.0 * windows + 0.01 * n},
            6: {e: v * n + 1e6 * windows for e, v in worker.items()},
        }

    src = FakeCounterSource(lambda: {}, threads=threads)
    (row,) = count_mode(tb, fake_backends(world), Mode.TCP, [], src, MicroarchOptions()).rows
    assert row.per_request == pytest.approx(worker)
    assert row.background == pytest.approx({"Ir": 2.5, "D1mr": 0.01})
    assert row.fixed == pytest.approx({e: 1e6 for e in worker})


def test_a_disturbed_window_moves_the_spread_not_the_count(tb: Testbed) -> None:
    """One window of the five pairs takes 1 500 more D1 misses (another thread evicted the
    worker's lines): the median of the pairs stays the steady count, the spread shows it."""
    world = FakeWorld({"base": 1.0}, {"base": 1.0}, {"base": 0.0})
    per = {"Ir": 21_000.0, "D1mr": 2.0, "D1mw": 0.0}
    burst = 1 + 4 + 4  # the load of the fourth counted window, after warm-up and settling

    def total() -> dict[str, float]:
        n = sum(k for _v, _s, k in world.loads)
        extra = 1500.0 if len(world.loads) >= burst else 0.0
        return {"Ir": per["Ir"] * n, "D1mr": per["D1mr"] * n + extra, "D1mw": 0.0}

    opts = MicroarchOptions(pairs=5, settle=4, resolve_s=0.0)  # no second round
    src = FakeCounterSource(total)
    (row,) = count_mode(tb, fake_backends(world), Mode.TCP, [], src, opts).rows
    assert row.per_request == pytest.approx(per)
    assert row.rounds == ((row.n1, row.n2),) and row.unresolved == ("d1_misses",)
    d1 = [p["D1mr"] for p in row.pairs]
    # the fourth window is the second pair's n1 (n1, n2, then n2, n1)
    assert d1 == pytest.approx([2.0, 2.0 - 1500 / (row.n2 - row.n1), 2.0, 2.0, 2.0])
    assert row.spread("valgrind", "d1_misses") == pytest.approx(1500 / (row.n2 - row.n1) / 4)
    assert row.spread("valgrind", "instructions") == 0.0


def _bursts(world: FakeWorld, period: int, burst: float) -> FakeCounterSource:
    """A worker of 200 k instructions a request whose LL write misses come ``burst`` at a
    time, once every ``period`` requests (an access log's buffer taking fresh memory): about
    ``burst / period`` a request, in whichever window the burst falls."""

    def total() -> dict[str, float]:
        n = sum(k for _v, _s, k in world.loads)
        return {"Ir": 200_000.0 * n, "ILmr": 0.0, "DLmr": 0.0, "DLmw": burst * (n // period)}

    return FakeCounterSource(total)


def _clock(world: FakeWorld, per_request_s: float = 0.01) -> Any:
    return lambda: per_request_s * sum(k for _v, _s, k in world.loads)


def test_a_bursty_count_is_counted_again_with_more_requests_until_resolved(tb: Testbed) -> None:
    """LL misses in bursts of 256 every 256 requests: the quick windows (50/300) put a burst
    in one window of a pair or the other (pairs of 0 or 2 a request); the row is counted
    again, n2 − n1 grown by the spread over the bound, until the pairs agree within 5 %."""
    world = FakeWorld({"base": 1.0}, {"base": 1.0}, {"base": 0.0})
    opts = dataclasses.replace(MicroarchOptions.quick(), resolve_s=10_000.0)
    src = _bursts(world, 256, 256.0)
    (row,) = count_mode(
        tb, fake_backends(world), Mode.GRPC, [], src, opts, clock=_clock(world)
    ).rows
    assert row.rounds[0] == (50, 300) and len(row.rounds) > 1
    assert all(n1 == 50 and n2 > 300 for n1, n2 in row.rounds[1:])
    assert (row.n1, row.n2) == row.rounds[-1]
    assert row.unresolved == ()
    # the first round's pairs are kept: they did not resolve the LL misses
    assert len(row.earlier) == len(row.rounds) - 1
    first = dataclasses.replace(row, pairs=row.earlier[0])
    assert first.unresolved_by_pairs("valgrind") == ["ll_misses"]
    spread = row.spread("valgrind", "ll_misses")
    assert spread is not None and spread <= 0.05
    assert metric(row.per_request, "valgrind", "ll_misses") == pytest.approx(1.0, rel=0.05)
    assert row.per_request["Ir"] == pytest.approx(200_000.0)
    # the rounds' windows were loaded: warm-up, settling, then every round's pairs
    loads = [n for _v, _s, n in world.loads]
    for _n1, n2 in row.rounds:
        assert loads.count(n2) >= opts.pairs


def test_a_row_the_budget_cannot_resolve_says_so(tb: Testbed) -> None:
    """The same bursts with 10 s to spare at 10 ms a request: a round of at least twice the
    difference does not fit; the row keeps its one round and names the unresolved count.
    Without bursts nothing is counted again."""
    world = FakeWorld({"base": 1.0}, {"base": 1.0}, {"base": 0.0})
    opts = dataclasses.replace(MicroarchOptions.quick(), resolve_s=10.0)
    be = fake_backends(world)
    (row,) = count_mode(
        tb, be, Mode.GRPC, [], _bursts(world, 256, 256.0), opts, clock=_clock(world)
    ).rows
    assert row.rounds == ((50, 300),) and row.unresolved == ("ll_misses",)
    world.loads.clear()
    (row,) = count_mode(
        tb, be, Mode.GRPC, [], _bursts(world, 1, 1.0), opts, clock=_clock(world)
    ).rows
    assert row.rounds == ((50, 300),) and row.unresolved == ()


@pytest.mark.parametrize(
    ("spread", "left", "n2"),
    [
        (0.2, 1e9, 50 + 1000),  # 4× the bound: the difference (250) grown 4×
        (0.06, 1e9, 50 + 500),  # at least 2×
        (5.0, 1e9, 50 + 8000),  # at most 32×
        (5.0, 3 * (50 + 1050) * 0.01, 50 + 1000),  # cut to what the budget pays for
        (5.0, 3 * (50 + 500) * 0.01 - 0.1, None),  # not even 2×: stop
    ],
)
def test_next_n2_grows_the_difference_by_the_spread_within_the_budget(
    spread: float, left: float, n2: int | None
) -> None:
    from meshtax.model.microarch import CounterRow
    from meshtax.profile.microarch import next_n2

    # LL misses per request of three pairs: median 1, half range = spread
    ll = {"ILmr": 0.0, "DLmr": 0.0}
    pairs = tuple({"Ir": 2e5, **ll, "DLmw": x} for x in (1.0 - spread, 1.0, 1.0 + spread))
    row = CounterRow("grpc", "access_log", 100, 50, 300, 50, {"Ir": 2e5}, pairs=pairs)
    assert row.unresolved_by_pairs("valgrind") == ["ll_misses"]
    # the last round: 3 pairs of 350 requests in 10.5 s (10 ms a request)
    opts = MicroarchOptions.quick()
    assert next_n2(row, "valgrind", 3 * 350 * 0.01, left, opts) == n2


def test_count_mode_counts_combinations_with_their_members(tb: Testbed) -> None:
    # the fake Envoy names a listener by its slug: lua+wasm → lua_wasm
    names = ["base", "lua", "wasm", "lua_wasm"]
    events = {v: {"Ir": 1000.0 * (i + 1)} for i, v in enumerate(names)}
    world = FakeWorld({v: 1.0 for v in events}, {v: 1.0 for v in events}, {v: 0.0 for v in events})

    def total() -> dict[str, float]:
        return {"Ir": sum(events[n]["Ir"] * k for n, _s, k in world.loads)}

    combos = combos_for(Mode.HTTP, ["lua", "wasm"])
    assert combos == {"lua+wasm": ("lua", "wasm")}
    mc = count_mode(
        tb,
        fake_backends(world),
        Mode.HTTP,
        ["lua", "wasm"],
        FakeCounterSource(total),
        MicroarchOptions.quick(),
        combos=combos,
    )
    row = mc.rows[-1]
    assert row.variant == "lua+wasm" and row.members == ("lua", "wasm")
    assert row.per_request == pytest.approx({"Ir": 4000.0})


def test_count_mode_pins_envoy_alone_on_cpu_1(tb: Testbed, monkeypatch: pytest.MonkeyPatch) -> None:
    """With two CPUs the counting Envoy runs alone on CPU 1 and the echo app with the client
    on CPU 0 (gRPC counts moved with the machine's load when they shared CPUs); with one CPU,
    or ``pin=False``, nothing is pinned."""
    import meshtax.profile.microarch as ma

    world = FakeWorld({"base": 1.0}, {"base": 1.0}, {"base": 0.0})
    src = world_source(world, {"base": EVENTS["base"]})
    be = fake_backends(world)
    places: dict[str, Placement] = {}

    def echo(system: Any, workdir: Path, mode: Mode, port: int, place: Placement) -> Any:
        places["echo"] = place
        return no_echo()

    def envoy(*a: Any, **kw: Any) -> Any:
        e = be.envoy(*a, **kw)
        places["envoy"] = e.place
        return e

    be2 = dataclasses.replace(be, echo=echo, envoy=envoy)
    monkeypatch.setattr(ma, "available_cpus", lambda: (0, 1))
    assert ma.pinned(MicroarchOptions()) and not ma.pinned(MicroarchOptions(pin=False))
    assert not ma.pinned(MicroarchOptions(), cpus=(1,))
    count_mode(tb, be2, Mode.GRPC, [], src, MicroarchOptions.quick())
    assert places["envoy"].cpus == (1,) and places["echo"].cpus == (0,)
    monkeypatch.setattr(ma, "available_cpus", lambda: (0,))
    count_mode(tb, be2, Mode.GRPC, [], src, MicroarchOptions.quick())
    assert places["envoy"].cpus is None and places["echo"].cpus is None
    monkeypatch.setattr(ma, "available_cpus", lambda: (0, 1))
    count_mode(tb, be2, Mode.GRPC, [], src, MicroarchOptions(pin=False))
    assert places["envoy"].cpus is None and places["echo"].cpus is None


def test_default_filters_cover_the_done_criteria() -> None:
    for chain in (*COMBINATIONS.values(), *SAHU_MIXES.values()):
        assert set(chain) <= set(DEFAULT_FILTERS)
    for f in ("ip_tagging_1", "ip_tagging_5", "ip_tagging_10", "rbac_http_100", "rbac_http_10000"):
        assert f in DEFAULT_FILTERS
    assert combos_for(Mode.HTTP, DEFAULT_FILTERS) == {**COMBINATIONS, **SAHU_MIXES}
    assert combos_for(Mode.TCP, DEFAULT_FILTERS) == {}


@pytest.mark.parametrize(
    ("name", "part"),
    [
        ("Envoy::Http::Http1::ConnectionImpl::dispatch(Envoy::Buffer::Instance&)", "parsing"),
        ("nghttp2_session_mem_recv", "parsing"),
        ("Envoy::Extensions::Filters::Http::Lua::Filter::decodeHeaders(bool)", "filters"),
        (
            "Envoy::Extensions::Filters::Common::RBAC::RoleBasedAccessControlEngineImpl::handleAction",
            "filters",
        ),
        ("Envoy::Extensions::Filters::Http::Router::Filter::decodeHeaders(bool)", "other"),
        ("Envoy::Extensions::Filters::Network::HttpConnectionManager::Config::Config", "other"),
        ("v8::internal::Heap::Scavenge()", "filters"),
        ("__memcpy_avx_unaligned_erms", "other"),
    ],
)
def test_classify(name: str, part: str) -> None:
    assert classify(name) == part


def test_attribution_names_a_stripped_binary_from_a_symbol_map() -> None:
    symbols = SymbolMap((0x1000, 0x2000), ("Envoy::Http::Http1::Parser::run", "lua_pcall"))
    a = Attribution("/opt/envoy", 0x5550000, symbols)
    fns = {
        ("/opt/envoy", hex(0x5550000 + 0x1010)): {"Ir": 60.0},
        ("/opt/envoy", hex(0x5550000 + 0x2004)): {"Ir": 30.0},
        ("/lib/libc.so.6", "memcpy"): {"Ir": 10.0},
    }
    parts, share = a.split(fns)
    assert parts == {"parsing": {"Ir": 60.0}, "filters": {"Ir": 30.0}, "other": {"Ir": 10.0}}
    assert share == 1.0
    # without a map, the proxy's addresses name nothing: "other", and the share says so
    parts, share = Attribution("/opt/envoy").split(fns)
    assert parts["other"] == {"Ir": 100.0} and share == pytest.approx(0.1)


def test_kernel_rows_pool_the_meshed_windows() -> None:
    side = {"syscalls": 300, "read_n": 100, "write_n": 100, "epoll_n": 90}
    rec = {
        "tcp": [
            {
                "size": 100,
                "probe": {
                    "windows": [
                        {
                            "meshed": True,
                            "requests": 100,
                            "sidecar": {**side, "sys_cpu_ns": 2e6, "user_ns": 1e6},
                        },
                        {"meshed": False, "requests": 100, "sidecar": {"syscalls": 9999}},
                        {
                            "meshed": True,
                            "requests": 100,
                            "sidecar": {**side, "sys_cpu_ns": 4e6, "user_ns": 3e6},
                        },
                    ]
                },
                "cpu": [
                    {"run": "f0.5", "rate": 5000, "breakdown_us": {"user": 1.0, "read": 9.0}},
                    {
                        "run": "max",
                        "rate": 9000,
                        "breakdown_us": {"user": 4.0, "write": 2.5, "ipc": 1.0},
                    },
                ],
            },
            {"size": 1024, "probe": {"windows": []}},
        ]
    }
    (k,) = kernel_rows(rec)
    assert (k.mode, k.size, k.requests) == ("tcp", 100, 200)
    assert (k.syscalls, k.reads, k.writes, k.epoll_waits) == (3.0, 1.0, 1.0, 0.9)
    assert (k.kernel_cpu_us, k.user_cpu_us) == (30.0, 20.0)
    # perf: the closed-loop run, per crossing in the record → per request
    assert (k.perf_kernel_cpu_us, k.perf_user_cpu_us, k.perf_run) == (7.0, 8.0, "max")
    assert kernel_rows({}) == []


def test_fill_instructions() -> None:
    run = ModeRun(Mode.HTTP, {100: {"base": VariantSamples(), "lua": VariantSamples()}})
    m = Microarch.from_dict(
        {
            "source": "valgrind",
            "rows": [
                {
                    "mode": "http",
                    "variant": "lua",
                    "size": 100,
                    "n1": 1,
                    "n2": 2,
                    "per_request": {"Ir": 7.0},
                }
            ],
        }
    )
    fill_instructions(run, m)
    assert run.samples[100]["lua"].instructions == 7.0
    assert run.samples[100]["base"].instructions is None


def _lua_world(tmp_path: Path) -> Backends:
    """Backends of a fake world where base and lua count 170k and 184k instructions."""
    events = {v: {"Ir": x, "I1mr": x / 30} for v, x in (("base", 170e3), ("lua", 184e3))}
    world = FakeWorld(
        {"base": 10.0, "lua": 11.0}, {"base": 50.0, "lua": 52.0}, {"base": 0, "lua": 0}
    )

    def total() -> dict[str, float]:
        acc: dict[str, float] = {}
        for n, _s, k in world.loads:
            for e, v in events[n].items():
                acc[e] = acc.get(e, 0.0) + v * k
        return acc

    src = FakeCounterSource(total)
    be = fake_backends(
        world,
        callgrind=False,
        counters=lambda s: (src, "fake"),
        state_dir=tmp_path,
        procs=FakeProcOps(default=lambda p: p * 10),
    )
    return be


def test_profile_extras_stores_the_microarch_and_feeds_the_filters(tmp_path: Path) -> None:
    """``--microarch --filters lua``: one counted pass; the filter profile takes its
    instructions from it (no callgrind Envoy of its own); kernel rows come from the base."""
    from meshtax.store.sqlite import ProfileStore

    be = _lua_world(tmp_path)
    store = ProfileStore(tmp_path / "p.db")
    base = profile({Mode.HTTP: {}}, name="b")
    meas = {
        "http": [
            {
                "size": 100,
                "probe": {
                    "windows": [{"meshed": True, "requests": 10, "sidecar": {"syscalls": 40}}]
                },
            }
        ]
    }
    prov = Provenance("measured", "test", "2026-11-23", options={"measurements": meas})
    store.save(dataclasses.replace(base, provenance=prov))
    opts = ExtrasOptions(("lua",), quick=True, modes=(Mode.HTTP,), microarch=True)
    got = profile_extras(opts, FakeSystem(), store, "b", backends=be)
    m = got.microarch
    assert m is not None and m.source == "valgrind" and m.tool == "fake valgrind counters"
    assert [r.variant for r in m.rows] == ["base", "lua"]
    lua = m.row("http", "lua", 100)
    assert lua is not None and metric(lua.per_request, "valgrind", "instructions") == pytest.approx(
        184e3
    )
    assert [(k.mode, k.syscalls) for k in m.kernel] == [("http", 4.0)]
    assert m.attribution.startswith("none")
    rec = got.provenance.options["extras"]["filters"]["http"]["filters"]["100"]["lua"]
    assert rec["instructions_per_request"] == pytest.approx(14e3)
    assert store.get("b+extras").microarch == m
    # a later run replaces the rows it counts again (and keeps the others)
    again = profile_extras(
        ExtrasOptions(("lua",), quick=True, modes=(Mode.HTTP,), microarch=True),
        FakeSystem(),
        store,
        "b",
        backends=be,
    )
    assert again.microarch is not None and len(again.microarch.rows) == 2


def test_microarch_on_the_bundled_reference_has_no_kernel_rows(tmp_path: Path) -> None:
    """``--base reference`` (benchmarks/bench_microarch.py on a machine without a usable base):
    the same counts, stored under a new name, and no kernel work (no probe windows here)."""
    from meshtax.store.sqlite import ProfileStore

    store = ProfileStore(tmp_path / "p.db")
    opts = ExtrasOptions(("lua",), quick=True, modes=(Mode.HTTP,), microarch=True, name="r+m")
    got = profile_extras(opts, FakeSystem(), store, "reference", backends=_lua_world(tmp_path))
    m = store.get("r+m").microarch
    assert m is not None and m == got.microarch and m.kernel == ()
    lua = m.row("http", "lua", 100)
    assert lua is not None and lua.per_request["Ir"] == pytest.approx(184e3)


def test_counter_source_choice(tmp_path: Path) -> None:
    fake = FakeCounterSource(lambda: {}, name="pmu")
    be = Backends(counters=lambda s: (fake, "fake pmu"), callgrind_available=lambda: False)
    assert be.counter_source(FakeSystem()) is fake
    assert be.counter_source(FakeSystem(), "pmu") is fake
    with pytest.raises(ValueError, match="valgrind is not installed"):
        be.counter_source(FakeSystem(), "valgrind")
    with pytest.raises(ValueError, match="unknown counter source"):
        be.counter_source(FakeSystem(), "papi")
    none = Backends(counters=lambda s: (None, "nothing here"))
    with pytest.raises(ValueError, match="nothing here"):
        none.counter_source(FakeSystem())
    vg = FakeCounterSource(lambda: {}, name="valgrind")
    with pytest.raises(ValueError, match="no hardware counters"):
        Backends(counters=lambda s: (vg, "simulated")).counter_source(FakeSystem(), "pmu")


@pytest.mark.root
@pytest.mark.slow
def test_real_counts_agree_between_two_envoys(tmp_path: Path) -> None:
    """Two Envoys under callgrind, one after the other: base and header mutation in HTTP
    mode agree on instructions per request within 2 %, the filter costs something, and the
    simulated geometry is recorded."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind missing")
    be = Backends(lock_timeout=900.0)
    opts = MicroarchOptions(warmup_n=30, n1=30, n2=130)
    with Testbed(RealSystem(), lock_timeout=900.0) as real:
        src = be.counter_source(real.system, "valgrind")
        a, b = (count_mode(real, be, Mode.HTTP, ["header_mutation"], src, opts) for _ in range(2))
    ir = {
        (r.variant, k): metric(r.per_request, "valgrind", "instructions")
        for k, m in (("a", a), ("b", b))
        for r in m.rows
    }
    for v in ("base", "header_mutation"):
        x, y = ir[(v, "a")], ir[(v, "b")]
        assert x is not None and y is not None and abs(y / x - 1) < 0.02, (v, x, y)
    hm, base = ir[("header_mutation", "a")], ir[("base", "a")]
    assert hm is not None and base is not None and hm > base
    assert a.geometry is not None and a.rows[0].background  # the main thread counted apart
