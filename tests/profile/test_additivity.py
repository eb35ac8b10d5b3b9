"""Additivity of filter costs: rounds and paired blocks against fakes, exact expectations."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from meshtax.model.sidecar import Mode
from meshtax.profile.additivity import (
    Block,
    additivity,
    block_additivity,
    profile_blocks,
    total_errors_by_round,
)
from meshtax.profile.backends import Backends
from meshtax.profile.filters import FilterRunOptions, ModeRun, VariantSamples
from meshtax.testbed.envoy.filters import COMBINATIONS
from meshtax.testbed.envoy.variants import BASE
from meshtax.testbed.fortio import LoadResult
from meshtax.testbed.pods import Testbed
from tests.profile.fakes import FakeEnvoy, FakeWorld, fake_backends
from tests.profile.test_filters import world


def test_total_errors_by_round_use_each_rounds_adjacent_base() -> None:
    def vs(cpu: list[float], base: list[float]) -> VariantSamples:
        return VariantSamples(
            cpu_us=cpu, latency_us=[1.0, 1.0], base_cpu_us=base, base_latency_us=[1.0, 1.0]
        )

    by = {
        BASE: vs([40.0, 50.0], []),
        "a": vs([42.0, 51.0], [40.0, 50.0]),
        "b": vs([45.0, 56.0], [40.0, 51.0]),
        "a+b": vs([50.0, 55.0], [41.0, 49.0]),
    }
    # round 0: 41 + 2 + 5 = 48 vs 50; round 1: 49 + 1 + 5 = 55 vs 55
    assert total_errors_by_round(by, "a+b", ["a", "b"]) == pytest.approx([48 / 50 - 1, 0.0])
    run = ModeRun(Mode.HTTP, {100: by})
    (row,) = additivity(run, {"a+b": ("a", "b")})
    assert row.base_cpu_us == pytest.approx(45.0)
    assert row.predicted_cpu_us == pytest.approx(1.5 + 5.0)


@dataclass
class _Clocked:
    """A FakeWorld whose every load takes 1 s and adds ``step`` µs to every later request."""

    world: FakeWorld
    step: float = 0.0
    now: float = 0.0

    def load(self, target: str, mode: Mode, size: int, n: int) -> LoadResult:
        self.now += 1.0
        self.world.drift += self.step
        return self.world.load(target, mode, size, n)


def _block_backends(c: _Clocked) -> Backends:
    be = fake_backends(c.world, callgrind=False)
    be.load = c.load
    be.clock = lambda: c.now
    return be


def test_paired_blocks_cancel_linear_drift(tb: Testbed) -> None:
    c = _Clocked(
        world(), step=3.0
    )  # 3 µs more per request after every run: large against 1 µs filters
    combos = {"cpp": COMBINATIONS["cpp"]}
    opts = FilterRunOptions(rounds=4, n=12, warmup_n=2, callgrind=False)
    blocks = profile_blocks(tb, _block_backends(c), Mode.HTTP, combos, opts)
    assert [b.round for b in blocks] == [0, 1, 2, 3]
    # each variant twice per block, mirrored: its mean run sits at the block's centre
    b1 = blocks[1]
    assert list(b1.cpu_us) == ["fault_injection", "rate_limit", "tap", "cpp", BASE]
    assert all(len(v) == 2 for v in b1.cpu_us.values())
    assert b1.chain_us - b1.base_us == pytest.approx(23.0)
    assert b1.predicted_us == pytest.approx(b1.chain_us)
    (row,) = block_additivity(blocks)
    assert row.blocks == 4 and row.error.median == pytest.approx(0.0, abs=1e-12)
    assert row.increment_predicted_us == pytest.approx(
        23.0
    ) and row.increment_measured_us == pytest.approx(23.0)
    # the loads of one block, in order: base f r t cpp cpp t r f base (round 0)
    counted = [n for n, s, k in c.world.loads if k == opts.n]
    assert counted[:10] == [
        BASE,
        "fault_injection",
        "rate_limit",
        "tap",
        "cpp",
        "cpp",
        "tap",
        "rate_limit",
        "fault_injection",
        BASE,
    ]


def test_paired_blocks_error_budget_and_rounds_continue(tb: Testbed) -> None:
    c = _Clocked(world())
    c.world.cpu = {**c.world.cpu, "cpp": 70.0}  # increment 30 instead of 23: not additive
    combos = {"cpp": COMBINATIONS["cpp"]}
    opts = FilterRunOptions(rounds=10, n=12, warmup_n=2, callgrind=False)
    # 5 warm-up loads, then 10 loads (10 s) per block: blocks end at 15, 25, 35; a 4th would end at 45
    blocks = profile_blocks(
        tb, _block_backends(c), Mode.HTTP, combos, opts, budget_s=35.0, first_round=4
    )
    assert [b.round for b in blocks] == [4, 5, 6]
    assert list(blocks[0].cpu_us) == [
        "cpp",
        BASE,
        "fault_injection",
        "rate_limit",
        "tap",
    ]  # rotated by 4
    (row,) = block_additivity(blocks)
    assert row.error.median == pytest.approx(63 / 70 - 1)
    assert row.predicted_us.median == pytest.approx(63.0) and row.chain_us.median == pytest.approx(
        70.0
    )
    assert row.base_us.median == pytest.approx(40.0)
    again = [Block.from_dict(b.to_dict()) for b in blocks]
    assert again == blocks


def test_block_error_by_hand() -> None:
    b = Block(
        "a+b",
        ("a", "b"),
        0,
        {BASE: (40.0, 50.0), "a": (46.0, 48.0), "b": (50.0, 52.0), "a+b": (60.0, 64.0)},
    )
    # base 45, a +2, b +6 → 53 vs 62
    assert b.predicted_us == pytest.approx(53.0) and b.error == pytest.approx(53 / 62 - 1)


def test_paired_blocks_pin_envoy_and_app_to_cpu_1(tb: Testbed) -> None:
    c = _Clocked(world())
    be = _block_backends(c)
    seen: dict[str, Any] = {}

    def envoy(
        system: Any,
        boot: Mapping[str, Any],
        workdir: Path,
        place: Any = None,
        callgrind: bool = False,
    ) -> FakeEnvoy:
        seen["envoy"] = place
        return FakeEnvoy(c.world, boot, place, callgrind)

    @contextmanager
    def echo(*a: Any) -> Iterator[None]:
        seen["echo"] = a[4:]
        yield

    be.envoy, be.echo = envoy, echo  # type: ignore[assignment]
    opts = FilterRunOptions(rounds=1, n=12, warmup_n=2, callgrind=False, pin=True)
    profile_blocks(tb, be, Mode.HTTP, {"cpp": COMBINATIONS["cpp"]}, opts)
    assert seen["envoy"].cpus == (1,) and seen["echo"][0].cpus == (1,)


def test_bench_additivity_merges_chunks_and_reports_every_row() -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_additivity.py"
    spec = importlib.util.spec_from_file_location("bench_additivity", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def chunk(start: str, chain: float, rounds: range) -> dict[str, Any]:
        blocks = [
            Block(
                "a+b",
                ("a", "b"),
                r,
                {BASE: (40.0, 40.0), "a": (42.0, 42.0), "b": (45.0, 45.0), "a+b": (chain, chain)},
            )
            for r in rounds
        ]
        c = {
            "utc_start": start,
            "utc_end": start,
            "load_average_start": [1.0, 1.0, 1.0],
            "load_average_end": [2.0, 2.0, 2.0],
        }
        return {
            "kind": "paired-blocks",
            "modes": {"http": {"chunks": [c], "blocks": [b.to_dict() for b in blocks]}},
        }

    merged = bench.merge([chunk("T1", 47.0, range(3)), chunk("T2", 50.0, range(3, 6))])
    assert (
        len(merged["modes"]["http"]["blocks"]) == 6 and len(merged["modes"]["http"]["chunks"]) == 2
    )
    text = bench.report(merged)
    assert "6 blocks in 2 chunks; T1–T1 load 1.00→2.00; T2–T2" in text
    # errors per block: 47/47 − 1 = 0 (×3) and 47/50 − 1 = −6 % (×3); median of 6 = −3 %
    row = next(ln for ln in text.splitlines() if ln.startswith("| a+b |"))
    assert "| 6 | 40 | 47 [47, 47] |" in row and "**-3.0 %** [-6.0, +0.0]" in row
    with pytest.raises(SystemExit):
        bench.merge([{"modes": {}}])
