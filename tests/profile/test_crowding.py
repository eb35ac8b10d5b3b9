"""Crowding windows: alone and crowded alternate in pairs, each point is the median ratio of
its pairs, the sidecars are stopped, and a window without CPU is an error (fakes, exact)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from meshtax.model.sidecar import Mode
from meshtax.profile.crowding import CrowdError, CrowdPolicy, measure_crowding
from meshtax.profile.plan import quick_plan
from meshtax.profile.run import ProfileOptions
from meshtax.testbed.fortio import LoadSpec
from meshtax.testbed.system import Placement
from tests.profile.fakes import fake_load_result

PROBED = "10.0.0.2:8080"
PID = 4242


@dataclass
class Sidecar:
    pid: int = PID
    stopped: bool = False

    def stop(self) -> None:
        self.stopped = True


@dataclass
class Pod:
    ip: str

    def place(self, cpus: Any = None) -> Placement:
        return Placement(cpus=cpus)


@dataclass
class Pinning:
    client: tuple[int, ...] = (0,)
    sidecars: tuple[int, ...] = (1,)


@dataclass
class Bed:
    client: Pod = field(default_factory=lambda: Pod("10.0.0.1"))
    pinning: Pinning = field(default_factory=Pinning)
    meshed_target: str = PROBED
    sidecars: list[Sidecar] = field(default_factory=list)

    def start_sidecar(self, mode: Mode, name: str = "") -> Sidecar:
        self.sidecars.append(Sidecar())
        return self.sidecars[-1]


@dataclass
class Crowd:
    """Neighbour pods; ``started`` the sidecars their ``start`` made."""

    pods: list[Pod] = field(default_factory=list)
    started: list[Sidecar] = field(default_factory=list)

    def start(self, mode: Mode, k: int) -> list[Sidecar]:
        self.pods = [Pod(f"10.0.1.{i}") for i in range(k)]
        self.started = [Sidecar(100 + i) for i in range(k)]
        return self.started


class World:
    """Loads and CPU: the probed sidecar costs ``base`` CPU-ns per request alone and
    ``base · ratio(k)`` with ``k`` neighbours loaded in the same window; reading the CPU settles
    the window since the last reading."""

    def __init__(self, ratio: Any, base: int = 50_000, zero_cpu: bool = False) -> None:
        self.ratio = ratio
        self.base = base
        self.zero_cpu = zero_cpu
        self.cpu = 0
        self.calls: list[str] = []
        self.windows: list[int] = []

    def load(self, target: str, mode: Mode, size: int, qps: float, seconds: float) -> Any:
        self.calls.append(target)
        n = int(qps * seconds)
        return fake_load_result(LoadSpec(target, mode, size, n=n), n, 200.0)

    def cpu_of(self, pids: Any) -> dict[int, int]:
        assert list(pids) == [PID]
        if PROBED in self.calls and not self.zero_cpu:
            k = sum(t != PROBED for t in self.calls)
            requests = 200  # 100/s × 2 s
            self.cpu += round(requests * self.base * self.ratio(k))
            self.windows.append(k)
        self.calls = []
        return {PID: self.cpu}


def test_each_point_is_the_ratio_crowded_over_alone() -> None:
    bed, crowd = Bed(), Crowd()
    w = World(lambda k: 1.0 - 0.05 * k)
    policy = CrowdPolicy(neighbours=(1, 3), run_s=2.0, min_pairs=3, max_pairs=3)
    got, paired = measure_crowding(
        bed,  # type: ignore[arg-type]
        crowd,  # type: ignore[arg-type]
        Mode.HTTP,
        policy,
        cpu_of=w.cpu_of,
        load=w.load,
    )
    assert [(p.sharing, p.pairs) for p in got.points] == [(2.0, 3), (4.0, 3)]
    assert [p.ratio for p in got.points] == pytest.approx([0.95, 0.85])
    assert got.mode == "http" and got.rate == 100.0 and got.size == 100
    # the warm-up (every sidecar once), then 3 rounds × 2 groups × (alone + crowded), alone
    # first in even rounds and last in odd ones
    assert w.windows[:5] == [3, 0, 1, 0, 3] and w.windows[5:9] == [3, 0, 1, 0]
    assert len(w.windows) == 13
    assert paired.stop == "max_rounds"
    assert bed.sidecars[0].stopped and all(s.stopped for s in crowd.started)


def test_a_window_without_sidecar_cpu_is_an_error_and_stops_the_sidecars() -> None:
    bed, crowd = Bed(), Crowd()
    w = World(lambda k: 1.0, zero_cpu=True)
    with pytest.raises(CrowdError, match="ns of sidecar CPU"):
        measure_crowding(
            bed,  # type: ignore[arg-type]
            crowd,  # type: ignore[arg-type]
            Mode.TCP,
            CrowdPolicy(neighbours=(1,)),
            cpu_of=w.cpu_of,
            load=w.load,
        )
    assert bed.sidecars[0].stopped and all(s.stopped for s in crowd.started)


def test_policy_and_options() -> None:
    with pytest.raises(ValueError, match="increasing"):
        CrowdPolicy(neighbours=(3, 1))
    with pytest.raises(ValueError, match="increasing"):
        CrowdPolicy(neighbours=(0,))
    assert quick_plan().crowding is None
    plan = ProfileOptions(quick=True, crowding=(1, 3, 7)).resolve_plan()
    assert plan.crowding is not None and plan.crowding.neighbours == (1, 3, 7)
    assert [s.kind for s in plan.steps()].count("crowding") == len(plan.modes)
    assert plan.to_dict()["crowding"]["neighbours"] == [1, 3, 7]
    assert ProfileOptions(quick=True, crowding=()).resolve_plan().crowding is None
