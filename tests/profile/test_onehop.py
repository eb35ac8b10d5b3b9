"""Probe windows: pairs another process disturbed are taken again, the interference is kept
with the result, and windows stop once the components are tight (fakes, exact counts)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from meshtax.model.sidecar import Mode
from meshtax.profile.decompose import Breakdown
from meshtax.profile.onehop import WindowPolicy, components_narrow, probe_pairs
from meshtax.profile.probed import ProbeResult, pool
from meshtax.testbed.fortio import LoadSpec
from meshtax.testbed.interference import Snapshot, Thresholds
from meshtax.testbed.probe_reading import Histogram
from meshtax.testbed.procfs import CpuTimes
from meshtax.testbed.system import FakeSystem
from tests.profile.fakes import fake_load_result
from tests.profile.test_decompose import make_reading, thread

SIDECAR, APP = 7, 8


@dataclass
class Bed:
    """The part of an EchoBed probe windows use."""

    loads: list[str] = field(default_factory=list)
    system: FakeSystem = field(default_factory=FakeSystem)
    cpus: tuple[int, ...] = (0, 1)
    app_pid: int = APP
    meshed_app_pid: int = APP
    meshed_target: str = "server:8080"
    client_netns_path: str = "/run/netns/client"
    path_pids: tuple[int, ...] = ()
    cpu_chain: bool = False

    def direct_target(self, mode: Mode) -> str:
        return "server:9080"

    def load(self, target: str, mode: Mode, size: int, qps: float = 0.0, **kw: Any) -> Any:
        self.loads.append(target)
        meshed = target == self.meshed_target
        return fake_load_result(
            LoadSpec(target, mode, size, n=1000), 1000, 140.0 if meshed else 118.0
        )


class Probe:
    """A snapshot probe whose cumulative readings follow the bed's loads: a meshed window adds
    sidecar work and the app's loopback write, a direct one the app's write to the client."""

    def __init__(self, bed: Bed) -> None:
        self.bed = bed

    def start(self, pids: Any, *, follow_netns: str | None = None) -> None:
        pass

    def snapshot(self) -> Any:
        m = sum(t == self.bed.meshed_target for t in self.bed.loads)
        d = len(self.bed.loads) - m
        w = thread(1, read=self.sidecar_read_ns(m), write=6_000_000 * m, epoll=10**8 * m,
                   notify=4_000_000 * m, user=10_000_000 * m, tgid=self.sidecar_pid())  # fmt: skip
        a = thread(2, write=1_000_000 * m + 3_000_000 * d, epoll=10**8 * (m + d), tgid=APP)
        return make_reading([w, a], ipc_ns=2_000_000 * m, ipc_count=4 * m)

    def sidecar_read_ns(self, meshed_windows: int) -> int:
        return 2_000_000 * meshed_windows

    def sidecar_pid(self) -> int:
        return SIDECAR

    def stop(self) -> Any:
        return self.snapshot()

    def close(self) -> None:
        pass


class Meter:
    """Each snapshot a second later; ``busy`` of the next windows' others' CPU share."""

    def __init__(self, busy: list[float]) -> None:
        self.busy = busy
        self.t = 0
        self.task = 0

    def snapshot(self) -> Snapshot:
        self.t += 10**9
        if self.t % (2 * 10**9) == 0:  # the end of a window: others ran busy × 2 CPUs × 1 s
            self.task += round((self.busy.pop(0) if self.busy else 0.0) * 2e9)
        cpus = {c: CpuTimes(self.task // 2, 0, 0, 0) for c in (0, 1)}
        return Snapshot(self.t, cpus, 0, 0)


def probe_components(bed: Bed, *args: Any, **kw: Any) -> ProbeResult:
    """The windows of one sidecar, pooled (what the profiler does with one instance)."""
    part = probe_pairs(bed, *args, **kw)  # type: ignore[arg-type]
    return pool([part], cpu_chain=bed.cpu_chain, probe_app=True, what="test")


def probe(bed: Bed, meter: Meter | None, **policy: Any) -> Any:
    fake = Probe(bed)
    return probe_components(
        bed,
        Mode.TCP,
        100,
        SIDECAR,
        windows=WindowPolicy(0.1, **policy),
        probe=lambda s: fake,
        meter=None if meter is None else (lambda cpus, pids: meter),
    )


def test_a_disturbed_pair_is_taken_again_and_recorded() -> None:
    bed = Bed()
    # window 2 (the direct one of the first pair) had another process on half the CPUs
    m = Meter([0.0, 0.5, 0.0, 0.0, 0.0, 0.0])
    r = probe(bed, m, min_pairs=2, max_pairs=2, thresholds=Thresholds(others=0.1))
    assert len(bed.loads) == 6  # 2 kept pairs + 1 refused
    assert r.interference["rejected"] == 1 and r.interference["windows"] == 4
    assert r.interference["others_max"] == pytest.approx(0.0)
    kept = [w["kept"] for w in r.windows]
    assert kept == [True, True, True, True, False, False]
    refused = [w["interference"]["others"] for w in r.windows if not w["kept"]]
    assert max(refused) == pytest.approx(0.5)
    assert r.overhead.median == pytest.approx(22.0)


def test_every_pair_disturbed_keeps_the_least_disturbed_and_says_so() -> None:
    # a machine busy throughout: 3 pairs, all beyond the threshold, the second the least
    m = Meter([0.9, 0.9, 0.3, 0.2, 0.8, 0.9])
    r = probe(Bed(), m, min_pairs=1, max_pairs=1, max_rejects=2, thresholds=Thresholds(others=0.1))
    assert r.interference["forced"] == 1 and r.interference["rejected"] == 2
    assert r.interference["others_max"] == pytest.approx(0.3)
    kept = [w["kept"] for w in r.windows]
    assert kept.count(True) == 2 and kept.count(False) == 4
    assert r.overhead.median == pytest.approx(22.0)


class StallingProbe(Probe):
    """The same readings, a second of window each, the sidecar's wake-ups in window i
    stalling ``stalls[i]`` times (≥ 130 µs: bin 127 of 1024 ns)."""

    def __init__(self, bed: Bed, stalls: list[int]) -> None:
        super().__init__(bed)
        self.stalls = stalls

    def snapshot(self) -> Any:
        r = super().snapshot()
        n = len(self.bed.loads)
        k = sum(self.stalls[:n])
        h = Histogram(((127, k, 2_000_000 * k),) if k else (), 10)
        threads = (replace(r.threads[0], notify_hist=h), *r.threads[1:])
        return replace(r, duration_ns=(n + 1) * 10**9, threads=threads)


def test_host_stalls_are_recorded_per_window_and_refused_only_above_a_set_threshold() -> None:
    def run(thresholds: Thresholds) -> Any:
        bed = Bed()
        fake = StallingProbe(bed, [0, 40, 0, 0, 0, 0])
        return bed, probe_components(
            bed,
            Mode.TCP,
            100,
            SIDECAR,
            windows=WindowPolicy(0.1, 2, 2, thresholds=thresholds),
            probe=lambda s: fake,
            meter=lambda cpus, pids: Meter([]),
        )

    bed, r = run(Thresholds())  # recorded, not judged: the stalled pair is kept
    assert len(bed.loads) == 4 and r.interference["rejected"] == 0
    assert [w["interference"]["stalls"] for w in r.windows] == pytest.approx([0, 40, 0, 0])
    assert r.interference["stalls_max"] == pytest.approx(40.0)
    bed, r = run(Thresholds(stalls=30.0))
    assert len(bed.loads) == 6 and r.interference["rejected"] == 1
    assert r.interference["stalls_max"] == pytest.approx(0.0)
    assert [w["interference"]["stalls"] for w in r.windows if not w["kept"]] == pytest.approx(
        [0, 40]
    )


def test_windows_stop_once_the_components_are_tight() -> None:
    bed = Bed()
    # identical pairs: tight as soon as the order statistics reach 95 % (6 pairs)
    r = probe(bed, None, min_pairs=3, max_pairs=10)
    assert len(bed.loads) == 12 and r.overhead.stop == "narrow"
    assert not r.interference  # nothing measured, nothing claimed


def test_client_cpu_change_per_crossing_from_kept_windows() -> None:
    from meshtax.profile.probed import client_cpu_us

    def w(meshed: bool, kept: bool, requests: int, read: int, write: int, user: int) -> Any:
        client = {"read_ns": read, "write_ns": write, "user_ns": user}
        return {"meshed": meshed, "kept": kept, "requests": requests, "client": client}

    windows = [
        # 1000 requests each way: 2000 crossings; meshed costs the client 6/2/20 ms more
        w(True, True, 1000, 10_000_000, 6_000_000, 40_000_000),
        w(False, True, 1000, 4_000_000, 4_000_000, 20_000_000),
        w(True, False, 1000, 10**12, 10**12, 10**12),  # refused: not counted
    ]
    got = client_cpu_us(windows)
    assert got == pytest.approx({"read": 3.0, "write": 1.0, "user": 10.0})
    assert client_cpu_us([w(True, True, 0, 0, 0, 0)]) == {"read": 0.0, "write": 0.0, "user": 0.0}


def test_cpu_models_carry_the_clients_cpu_change() -> None:
    from dataclasses import replace

    from meshtax.profile.build import CpuRun, SizeResult
    from meshtax.profile.decompose import Breakdown

    r = probe(Bed(), None, min_pairs=1, max_pairs=1)
    client = {"meshed": {"read_ns": 3_000_000, "write_ns": 5_000_000, "user_ns": 9_000_000}}
    windows = [
        {**w, "client": client["meshed"] if w["meshed"] else {}} for w in r.windows
    ]  # the meshed window: 1000 requests, 2000 crossings → +1.5 / +2.5 / +4.5 µs
    sr = SizeResult(100, None, replace(r, windows=windows))
    run = CpuRun("max", 1000.0, Breakdown(read=1.0, write=2.0, user=3.0), 1.0)
    got = sr.cpu_bd(run)
    assert (got.read, got.write) == pytest.approx((2.5, 4.5))
    assert got.user == pytest.approx(3.0 + sr.app_user_us + 4.5)


def test_components_narrow_asks_what_the_policy_says() -> None:
    # Notification 3 µs ± 0.3 µs over 8 pairs, Write 20 µs ± 0.2 µs
    per = [Breakdown(notification=3.0 + d, write=20.0 + d / 1.5) for d in (-0.3, 0.3) * 4]
    assert components_narrow(per, 0.15, 5.0)  # Notification below the floor, Write tight
    assert components_narrow(per, 0.15, 2.5)  # ±0.3 µs is within the 1 µs asked by default
    assert not components_narrow(per, 0.05, 2.5, 0.125)  # --resolve: ±5 % of 3 µs = 0.15 µs
    tight = [Breakdown(notification=3.0 + d / 10, write=20.0) for d in (-0.3, 0.3) * 4]
    assert components_narrow(tight, 0.05, 2.5, 0.125)
