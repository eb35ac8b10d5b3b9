"""``--speed now``: a prediction scaled to the machine's speed measured now (the real
reference workload), refused for another machine's profile."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from meshtax.app import UsageError
from meshtax.app.data import write_examples
from meshtax.app.predict import PredictOptions, predict_files
from meshtax.model.components import IPC, NOTIFICATION, OTHER, PARSING
from meshtax.model.sidecar import Mode
from meshtax.model.speed import Speed
from meshtax.store.sqlite import ProfileStore
from meshtax.testbed.host import this_host
from tests.helpers import flat, profile


def _store(tmp_path: Path, speed: Speed | None, here: bool = True) -> ProfileStore:
    comps = {
        IPC: flat(10, 10),
        NOTIFICATION: flat(10, 10),
        PARSING: flat(20, 20),
        OTHER: flat(5, 5),
    }
    p = profile({Mode.HTTP: comps}, name="mine")
    if here:
        p = replace(p, platform=this_host())
    store = ProfileStore(str(tmp_path / "p.db"))
    store.save(replace(p, speed=speed))
    return store


def _opts(tmp_path: Path, speed: str) -> PredictOptions:
    write_examples(str(tmp_path / "ex"))
    return PredictOptions((str(tmp_path / "ex" / "bookinfo.yaml"),), profile="mine", speed=speed)


def _mean(doc: dict) -> float:  # type: ignore[type-arg]
    return float(doc["summary"]["latency_overhead_us"]["mean"])


def test_now_scales_by_the_measured_speed(tmp_path: Path) -> None:
    # profiled on an (impossibly) fast machine: every kind of work takes longer now
    fast = Speed(1.0, 1.0, 0.001, "2026-01-01T00:00:00+00:00")
    store = _store(tmp_path, fast)
    as_measured = predict_files(_opts(tmp_path, "profile"), store)
    now = predict_files(_opts(tmp_path, "now"), store)
    assert "speed" not in as_measured
    assert now["speed"]["profile"]["local_ns"] == 1.0
    assert now["speed"]["now"]["local_ns"] > 1.0  # the real speedref ran
    assert any("costs scaled to the machine's speed now" in w for w in now["warnings"])
    # each component scaled by its kind of work: kernel path, cross-CPU wake-up, user space
    before = as_measured["summary"]["latency_by_component_us_mean"]
    after = now["summary"]["latency_by_component_us_mean"]
    s = now["speed"]["now"]
    for comp, kind, then in (
        ("ipc", "local", 1.0),
        ("notification", "cross", 1.0),
        ("parsing", "user", 0.001),
    ):
        assert after[comp] / before[comp] == pytest.approx(s[f"{kind}_ns"] / then)
    assert _mean(now) > 10 * _mean(as_measured)


def test_now_without_a_recorded_speed_says_so(tmp_path: Path) -> None:
    store = _store(tmp_path, None)
    doc = predict_files(_opts(tmp_path, "now"), store)
    assert "speed" not in doc
    assert any("recorded no machine speed" in w for w in doc["warnings"])
    assert _mean(doc) == pytest.approx(_mean(predict_files(_opts(tmp_path, "profile"), store)))


def test_now_refuses_another_machines_profile(tmp_path: Path) -> None:
    store = _store(tmp_path, Speed(100.0, 1000.0, 1.0), here=False)
    with pytest.raises(UsageError, match="not this machine"):
        predict_files(_opts(tmp_path, "now"), store)
    with pytest.raises(UsageError, match="speed must be one of"):
        predict_files(_opts(tmp_path, "fastest"), store)
