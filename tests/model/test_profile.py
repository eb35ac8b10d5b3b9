from __future__ import annotations

import pytest

from meshtax.model.components import OTHER
from meshtax.model.profile import PROFILE_FORMAT, Closure, Profile
from meshtax.model.sidecar import Mode
from meshtax.store.reference import reference_profile
from tests.helpers import flat, profile


def test_round_trip() -> None:
    p = profile({Mode.HTTP: {OTHER: flat(5, 2)}})
    assert Profile.from_dict(p.to_dict()) == p
    r = reference_profile()
    assert Profile.from_dict(r.to_dict()) == r


def test_newer_format_is_refused() -> None:
    d = reference_profile().to_dict()
    d["format"] = PROFILE_FORMAT + 1
    with pytest.raises(ValueError, match="newer"):
        Profile.from_dict(d)


def test_missing_mode_names_what_exists() -> None:
    with pytest.raises(KeyError, match="has no grpc mode.*http"):
        profile({Mode.HTTP: {OTHER: flat(5, 2)}}).mode(Mode.GRPC)


@pytest.mark.parametrize(
    ("components", "closes"), [(110.0, True), (116.0, False), (86.0, True), (84.0, False)]
)
def test_closure_tolerance(components: float, closes: bool) -> None:
    c = Closure(
        measured_us=100.0,
        measured_lo_us=95.0,
        measured_hi_us=105.0,
        components_us=components,
        tolerance=0.15,
    )
    assert c.closes is closes


def test_reference_profile_is_labelled_as_published() -> None:
    r = reference_profile()
    assert r.provenance.source == "published"
    assert r.platform.cpu_model.endswith("Xeon Gold 6142") and r.platform.proxy_version == "1.21"
    assert any("not a measurement of this machine" in n for n in r.provenance.notes)
    for mp in r.modes.values():
        for m in mp.components.values():
            assert m.latency.slope == 0 and "slope not published" in m.latency.note


def test_colocation_round_trips_and_is_optional() -> None:
    from dataclasses import replace

    from meshtax.model.profile import Colocation, ColocationPoint

    p = profile({Mode.HTTP: {OTHER: flat(5, 2)}, Mode.TCP: {OTHER: flat(1, 1)}})
    assert (
        "colocation" not in p.to_dict() and p.alpha(Mode.HTTP) == 1.0
    )  # older documents: the CPU's rate alone
    col = Colocation(
        0.8,
        0.7,
        0.9,
        "http",
        100.0,
        (
            ColocationPoint(1, 300.0, 280.0, 330.0, 290.0),
            ColocationPoint(8, 5000.0, 4600.0, 5400.0, 5100.0),
        ),
        "n",
    )
    q = replace(p, colocation={Mode.HTTP: col})
    assert Profile.from_dict(q.to_dict()) == q and q.to_dict()["colocation"]["http"]["alpha"] == 0.8
    assert (q.alpha(Mode.HTTP), q.alpha(Mode.TCP)) == (
        0.8,
        1.0,
    )  # per mode; an uncalibrated mode keeps 1
    with pytest.raises(ValueError, match=r"within \[0, 1\]"):
        Colocation(1.2, 1.0, 1.3, "http", 100.0)


def test_crowding_speed_and_quality_round_trip() -> None:
    from dataclasses import replace

    from meshtax.model.crowding import Crowding, CrowdPoint
    from meshtax.model.speed import Speed

    p = profile({Mode.HTTP: {OTHER: flat(5, 2)}})
    assert "crowding" not in p.to_dict() and p.quality()["crowding"] == {}
    crowd = Crowding("http", 100.0, 100, (CrowdPoint(4.0, 0.7, 0.6, 0.8, 6),), "note")
    closure = Closure(100.0, 95.0, 105.0, 130.0, 0.15)
    q = replace(
        p,
        modes={Mode.HTTP: replace(p.modes[Mode.HTTP], closure=closure)},
        crowding={Mode.HTTP: crowd},
        speed=Speed(1000.0, 20000.0, 5.0, "t"),
        interference={"rejected": 2, "by_size": {"x": 1}},
    )
    assert Profile.from_dict(q.to_dict()) == q
    got = q.quality()
    assert got["status"] == "unclosed" and got["closure"]["http"]["error"] == pytest.approx(0.3)
    assert got["crowding"] == {"http": {"4": 0.7}} and got["interference"] == {"rejected": 2}
    assert got["speed"]["cross_ns"] == 20000.0
