"""When a window counts as disturbed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from meshtax.testbed.interference import Interference, Thresholds, host_stalls, summarize
from meshtax.testbed.probe_reading import EMPTY_THREAD, Histogram, parse_reading

READING = (Path(__file__).parent / "fixtures" / "sidecar_reading.json").read_text()


def test_self_contention_is_recorded_not_refused_others_and_steal_are() -> None:
    # a closed-loop window on a quiet machine: sidecar and app wait for each other, no one else
    quiet = Interference(0.5, others=0.0, steal=0.0, wait=0.71)
    assert not quiet.contaminated(Thresholds())
    assert quiet.excess(Thresholds()) == 0.0
    assert quiet.contaminated(Thresholds(wait=0.2))  # the old default refused it
    assert Interference(0.5, others=0.3, steal=0.0, wait=0.0).excess(Thresholds()) == pytest.approx(
        3.0
    )
    assert Interference(0.5, others=0.0, steal=0.06, wait=0.0).contaminated(Thresholds())
    assert Thresholds().to_dict() == {"others": 0.1, "steal": 0.05, "wait": None, "stalls": None}


def test_host_stalls_are_the_probed_threads_wake_ups_of_130_us_or_more_a_second() -> None:
    # bins of 1024 ns: bin 127 (130 048 ns on) is a stall, bin 126 (129 024 ns) is not
    sidecar = Histogram(((3, 900, 2_700_000), (126, 5, 650_000), (127, 3, 6_000_000)), 10)
    client = Histogram(((5, 400, 2_000_000), (127, 1, 2_000_000)), 10)
    threads = (
        replace(EMPTY_THREAD, notify_hist=sidecar),
        replace(EMPTY_THREAD, notify_hist=client),
    )
    reading = replace(parse_reading(READING), duration_ns=500_000_000, threads=threads)
    assert host_stalls(reading) == pytest.approx(8.0)  # 4 in half a second
    assert host_stalls(replace(reading, duration_ns=0)) == 0.0
    assert host_stalls(replace(reading, threads=(EMPTY_THREAD,))) == 0.0  # no histogram


def test_stalls_are_recorded_and_judged_only_when_asked() -> None:
    busy = Interference(0.5, others=0.0, steal=0.0, wait=0.7, stalls=45.0)
    assert not busy.contaminated(Thresholds())
    assert busy.contaminated(Thresholds(stalls=30.0))
    assert busy.excess(Thresholds(stalls=30.0)) == pytest.approx(1.5)
    assert not replace(busy, stalls=12.0).contaminated(Thresholds(stalls=30.0))
    assert busy.worst(replace(busy, stalls=60.0)).stalls == 60.0
    quiet = replace(busy, stalls=10.0)
    s = summarize([busy, quiet, replace(busy, stalls=20.0)], rejected=0)
    assert (s["stalls_median"], s["stalls_max"]) == (20.0, 45.0)
