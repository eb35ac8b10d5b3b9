"""Filter profiling against fakes (exact expectations), and one real short run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from meshtax.model.sidecar import Mode
from meshtax.profile.additivity import additivity
from meshtax.profile.backends import Backends
from meshtax.profile.filters import (
    FilterRunOptions,
    additivity_components,
    combos_for,
    differences,
    filter_models,
    profile_filters,
    resolve_filters,
    run_length,
    steady_per_request,
)
from meshtax.testbed.envoy.filters import COMBINATIONS, MIXES, catalogue, component_name
from meshtax.testbed.envoy.variants import BASE
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import RealSystem
from tests.profile.fakes import FakeWorld, fake_backends

OPTS = FilterRunOptions(sizes=(100,), rounds=3, n=12, warmup_n=2, cg_warmup=3, cg_n1=10, cg_n2=50)


def world() -> FakeWorld:
    # the slug of a combination name: cpp, lua_wasm …; single filters keep their names
    cpu = {BASE: 40.0, "fault_injection": 41.0, "rate_limit": 42.0, "tap": 60.0, "cpp": 63.0}
    lat = {BASE: 200.0, "fault_injection": 201.0, "rate_limit": 203.0, "tap": 230.0, "cpp": 234.0}
    instr = {
        BASE: 100_000.0,
        "fault_injection": 102_000.0,
        "rate_limit": 103_000.0,
        "tap": 150_000.0,
        "cpp": 155_000.0,
    }
    return FakeWorld(cpu, lat, instr)


def test_fake_run_differences_models_and_additivity(tb: Testbed) -> None:
    w = world()
    comps = ["fault_injection", "rate_limit", "tap"]
    combos = combos_for(Mode.HTTP, comps)
    assert combos == {"cpp": COMBINATIONS["cpp"]}
    run = profile_filters(tb, fake_backends(w), Mode.HTTP, comps, OPTS, combos=combos)
    d = differences(run)[100]
    assert d["fault_injection"].cpu_us.median == pytest.approx(1.0)
    assert d["tap"].cpu_us.median == pytest.approx(20.0)
    assert d["tap"].latency_us.median == pytest.approx(30.0)
    assert d["tap"].cpu_pct == pytest.approx(50.0)
    # fixed per-window instructions cancel in the two-window difference
    assert d["tap"].instructions == pytest.approx(50_000.0)
    assert d["tap"].instructions_pct == pytest.approx(50.0)
    assert d["rate_limit"].cpu_from_instructions_us == pytest.approx(3000 * 40 / 100_000)
    (row,) = additivity(run, combos)
    assert row.predicted_cpu_us == pytest.approx(1 + 2 + 20)
    assert row.measured_cpu_us.median == pytest.approx(23.0)
    assert row.cpu_error == pytest.approx(0.0)
    assert row.predicted_instructions == pytest.approx(55_000.0)
    assert row.instructions_error == pytest.approx(0.0)
    models = filter_models(run)
    assert set(models) == {
        "fault_injection",
        "rate_limit",
        "tap",
    }  # combinations are not components
    # per crossing: instructions × base µs per instruction, halved
    assert float(models["tap"].cpu.predict([100])[0]) == pytest.approx(50_000 * 40 / 100_000 / 2)
    assert float(models["tap"].latency.predict([100])[0]) == pytest.approx(15.0)
    assert "callgrind" in models["tap"].cpu.note
    # every variant sits right next to a base run, in alternating order
    cpu_loads = [n for n, s, k in w.loads if k == OPTS.n]
    assert len(cpu_loads) == 2 * 4 * OPTS.rounds
    assert cpu_loads[:2] == [BASE, "fault_injection"] and cpu_loads[8:10] == ["rate_limit", BASE]


def test_additivity_total_cpu_against_the_chain(tb: Testbed) -> None:
    """Total = base + Σ increments vs the chain's own CPU; the increment error is far larger
    for the same absolute miss (the reason the done-criterion is on the total)."""
    w = world()
    w.cpu = {**w.cpu, "cpp": 73.0}  # increment 33 instead of 1 + 2 + 20
    comps = ["fault_injection", "rate_limit", "tap"]
    combos = combos_for(Mode.HTTP, comps)
    run = profile_filters(tb, fake_backends(w, False), Mode.HTTP, comps, OPTS, combos=combos)
    (row,) = additivity(run, combos)
    assert row.base_cpu_us == pytest.approx(40.0)
    assert row.predicted_total_cpu_us == pytest.approx(63.0)
    assert (
        row.measured_total_cpu_us is not None
        and row.measured_total_cpu_us.median == pytest.approx(73.0)
    )
    assert row.total_error == pytest.approx(63 / 73 - 1)
    assert row.increment_error == pytest.approx(23 / 33 - 1)
    assert row.total_error_rounds is not None and row.total_error_rounds.n == OPTS.rounds
    assert row.total_error_rounds.median == pytest.approx(63 / 73 - 1)
    d = row.to_dict()
    assert d["total_error"] == pytest.approx(63 / 73 - 1) and d["increment_error"] == d["cpu_error"]


def test_run_length_equal_time() -> None:
    eq = FilterRunOptions(n=1000, min_n=100, equal_time=True)
    assert run_length(eq, 200.0, 200.0) == 1000
    assert run_length(eq, 200.0, 150.0) == 1000  # never longer than n
    assert run_length(eq, 200.0, 800.0) == 250
    assert run_length(eq, 200.0, 20_000.0) == 100  # at least min_n
    assert run_length(FilterRunOptions(n=1000), 200.0, 800.0) == 1000  # off by default


def test_equal_time_runs_in_a_fake_run(tb: Testbed) -> None:
    w = world()
    opts = FilterRunOptions(
        sizes=(100,), rounds=2, n=40, warmup_n=2, callgrind=False, equal_time=True, min_n=5
    )
    run = profile_filters(tb, fake_backends(w, False), Mode.HTTP, ["tap"], opts)
    # tap's mean latency is 230 µs vs base 200: 40 × 200/230 → 35 requests per run
    assert sorted({k for n, s, k in w.loads if n == "tap" and k != 2}) == [35]
    assert differences(run)[100]["tap"].cpu_us.median == pytest.approx(20.0)


def test_additivity_components_are_the_combinations_members() -> None:
    comps = additivity_components()
    assert set(comps) == {c for v in (*COMBINATIONS.values(), *MIXES.values()) for c in v}
    assert len(comps) == len(set(comps)) and "rbac_network_1000" in comps


def test_fake_run_without_callgrind_uses_schedstat(tb: Testbed) -> None:
    w = world()
    run = profile_filters(tb, fake_backends(w, callgrind=False), Mode.GRPC, ["tap"], OPTS)
    assert run.samples[100]["tap"].instructions is None
    m = filter_models(run)["tap"]
    assert float(m.cpu.predict([100])[0]) == pytest.approx(10.0)
    assert "schedstat" in m.cpu.note
    assert all(k != OPTS.cg_n2 for _, _, k in w.loads)


def test_steady_per_request() -> None:
    assert steady_per_request(1_200_000, 100, 5_200_000, 500) == 10_000
    with pytest.raises(ValueError):
        steady_per_request(1, 10, 2, 10)


def test_resolve_filters() -> None:
    every = [component_name(f, p) for f, p in catalogue()]
    got = resolve_filters("all", [Mode.HTTP, Mode.TCP])
    assert got[Mode.HTTP] == every
    assert got[Mode.TCP] == [
        "rbac_network_1",
        "rbac_network_100",
        "rbac_network_1000",
        "rbac_network_10000",
    ]
    assert resolve_filters(["ip_tagging", "lua", "rbac_http_100"], [Mode.GRPC])[Mode.GRPC] == [
        "ip_tagging_1",
        "ip_tagging_5",
        "ip_tagging_10",
        "lua",
        "rbac_http_100",
    ]
    assert resolve_filters(None, [Mode.HTTP]) == {Mode.HTTP: []}
    # a preset: its stand-ins, HTTP modes only
    got = resolve_filters(["istio-default"], [Mode.HTTP, Mode.TCP])
    assert got == {Mode.HTTP: ["istio_metadata_exchange", "istio_stats"], Mode.TCP: []}
    with pytest.raises(ValueError, match="unknown filter 'nope'"):
        resolve_filters(["nope"], [Mode.HTTP])


def test_combos_cover_the_paper_and_the_mixes() -> None:
    every = [component_name(f, p) for f, p in catalogue()]
    assert combos_for(Mode.HTTP, every) == {**COMBINATIONS, **MIXES}
    assert combos_for(Mode.TCP, every) == {}


@pytest.mark.root
def test_real_short_run(tmp_path: Path) -> None:
    """One real run, small: header mutation and tap in HTTP mode against base, with callgrind.
    Instructions are deterministic enough to assert on: tap (a file per request) costs more
    than a header mutation, and both cost something."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind missing")
    opts = FilterRunOptions(rounds=2, n=100, warmup_n=50, cg_warmup=30, cg_n1=30, cg_n2=130)
    with Testbed(RealSystem()) as real:
        run = profile_filters(real, Backends(), Mode.HTTP, ["header_mutation", "tap"], opts)
        out = next(p for p in real.scratch_dirs() if "filters-http" in p.name) / "out" / "tap"
        assert list(out.iterdir()), "tap wrote no files"
    d = differences(run)[100]
    hm, tap = d["header_mutation"].instructions, d["tap"].instructions
    assert hm is not None and tap is not None
    assert 0 < hm < tap
    assert all(len(s.cpu_us) == 2 for n, s in run.samples[100].items() if n != BASE)
