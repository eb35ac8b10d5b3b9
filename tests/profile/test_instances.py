"""Probe windows spread over several sidecar instances: each group through a fresh sidecar,
warmed, with its share of the pairs; pooled so each instance weighs by its requests, every
record saying its instance (fakes, exact counts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from meshtax.model.sidecar import Mode
from meshtax.profile.instances import Sidecar, probe_instances
from meshtax.profile.onehop import WindowPolicy
from meshtax.profile.plan import quick_plan
from tests.profile.test_onehop import Bed as _Bed
from tests.profile.test_onehop import Probe as _Probe
from tests.profile.test_onehop import probe_components


@dataclass
class Bed(_Bed):
    """Cumulative counters that follow the loads; a meshed window's sidecar read costs
    ``level`` × 2 ms (``level`` set per sidecar instance)."""

    level: float = 1.0
    sidecar_pid: int = 0
    read_ns: int = 0
    warmed: list[int] = field(default_factory=list)

    def load(self, target: str, mode: Mode, size: int, qps: float = 0.0, **kw: Any) -> Any:
        if target == self.meshed_target and "n" not in kw:  # a probe window, not a warm-up
            self.read_ns += round(2_000_000 * self.level)
        return super().load(target, mode, size, qps, **kw)


class Probe(_Probe):
    """The snapshot probe of the bed's loads, its sidecar read the bed's counter and its threads
    carrying the current sidecar's PID."""

    bed: Bed

    def start(self, pids: Any, *, follow_netns: str | None = None) -> None:
        assert pids[0] == self.bed.sidecar_pid  # the instance running now is the one probed

    def sidecar_read_ns(self, meshed_windows: int) -> int:
        return self.bed.read_ns

    def sidecar_pid(self) -> int:
        return self.bed.sidecar_pid


class Proxy:
    def __init__(self, pid: int, log: list[str]) -> None:
        self.pid, self.log = pid, log

    def stop(self) -> None:
        self.log.append(f"stop {self.pid}")


def run(levels: list[float], policy: WindowPolicy) -> tuple[Bed, Any, list[str]]:
    """Probe windows over ``len(levels)`` instances, the i-th costing ``levels[i]``."""
    bed, log = Bed(), []
    pids = iter(range(100, 100 + len(levels)))

    def start() -> Proxy:
        bed.sidecar_pid = next(pids)
        bed.level = levels[bed.sidecar_pid - 100]
        log.append(f"start {bed.sidecar_pid}")
        return Proxy(bed.sidecar_pid, log)

    sidecar = Sidecar(start)  # type: ignore[arg-type]
    fake = Probe(bed)
    r = probe_instances(
        bed,  # type: ignore[arg-type]
        Mode.TCP,
        100,
        sidecar,
        instances=len(levels),
        windows=policy,
        warm=lambda: bed.warmed.append(sidecar.pid),
        probe=lambda s: fake,
    )
    sidecar.stop()
    return bed, r, log


def test_each_group_of_windows_runs_through_a_fresh_warmed_sidecar() -> None:
    bed, r, log = run([1.0, 2.0, 3.0], WindowPolicy(0.1, 6, 6))
    assert log == ["start 100", "stop 100", "start 101", "stop 101", "start 102", "stop 102"]
    assert bed.warmed == [101, 102]  # each new instance warmed before its windows
    # its share: 2 pairs each, every record says which instance
    assert [w["instance"] for w in r.windows] == [0] * 4 + [1] * 4 + [2] * 4
    assert len(r.per_pair) == 6


def test_pooled_components_average_the_instances_and_their_spread_is_the_interval() -> None:
    _, same, _ = run([2.0, 2.0, 2.0], WindowPolicy(0.1, 6, 6))
    _, apart, _ = run([1.0, 2.0, 3.0], WindowPolicy(0.1, 6, 6))
    assert same.latency.read > 0
    assert apart.latency.read == pytest.approx(same.latency.read)  # equal requests: the mean
    reads = sorted(b.read for b in apart.per_pair)
    assert reads[0] == pytest.approx(reads[1]) and reads[-1] == pytest.approx(2 * 1.5 * reads[0])
    assert len({round(b.read, 6) for b in same.per_pair}) == 1


def test_one_instance_is_exactly_the_one_sidecar_probe() -> None:
    bed, r, log = run([1.0], WindowPolicy(0.1, 3, 3))
    assert log == ["start 100", "stop 100"] and bed.warmed == []
    bed2 = Bed(sidecar_pid=100)
    fake = Probe(bed2)
    ref = probe_components(
        bed2,
        Mode.TCP,
        100,
        100,
        windows=WindowPolicy(0.1, 3, 3),
        probe=lambda s: fake,
    )
    assert r.to_dict() == ref.to_dict()
    assert all("instance" not in w for w in r.windows)


def test_a_groups_share_of_pairs_and_budget() -> None:
    p = WindowPolicy(0.5, 4, 1000, budget_s=50.0)
    assert p.share(1) is p
    s = p.share(4)
    assert (s.min_pairs, s.max_pairs, s.budget_s) == (2, 250, 12.5)
    one = WindowPolicy.fixed(0.5, 1).share(3)  # a single pair stays one a group
    assert (one.min_pairs, one.max_pairs) == (1, 1)
    with pytest.raises(ValueError):
        p.share(0)


def test_the_plan_records_its_instances_and_expects_their_restarts() -> None:
    one, four = quick_plan(), quick_plan(probe_instances=4)
    assert four.to_dict()["probe_instances"] == 4
    assert four.expected_s() > one.expected_s()
    with pytest.raises(ValueError, match="probe_instances"):
        quick_plan(probe_instances=0)


def test_the_plan_takes_early_rounds_of_every_mode_before_the_modes_measurements() -> None:
    one, three = quick_plan(), quick_plan(probe_rounds=3)
    assert three.to_dict()["probe_rounds"] == 3
    steps = three.steps()
    rounds = [(s.mode, s.size) for s in steps if s.kind == "round"]
    # two early rounds, every mode's sizes in each, all before the first latency step
    assert rounds == [(m, z) for _ in range(2) for m in three.modes for z in three.sizes]
    first_latency = next(i for i, s in enumerate(steps) if s.kind == "latency")
    assert max(i for i, s in enumerate(steps) if s.kind == "round") < first_latency
    # the windows are split, not added: the rounds cost their sidecars' start and warm-up
    probe = sum(s.expected_s for s in steps if s.kind in ("probe", "round"))
    assert probe == pytest.approx(
        sum(s.expected_s for s in one.steps() if s.kind == "probe"), rel=0.2
    )
    assert three.expected_s() > one.expected_s()
    for bad in (0, 9):
        with pytest.raises(ValueError, match="probe_rounds"):
            quick_plan(probe_rounds=bad)
