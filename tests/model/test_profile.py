from __future__ import annotations

from dataclasses import replace

import pytest

from meshtax.model.components import IPC, OTHER
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


def test_speed_and_quality_round_trip() -> None:
    from dataclasses import replace

    from meshtax.model.speed import Speed

    p = profile({Mode.HTTP: {OTHER: flat(5, 2)}})
    assert "speed" not in p.to_dict() and p.quality()["speed"] is None
    closure = Closure(100.0, 95.0, 105.0, 130.0, 0.15)
    q = replace(
        p,
        modes={Mode.HTTP: replace(p.modes[Mode.HTTP], closure=closure)},
        speed=Speed(1000.0, 20000.0, 5.0, "t"),
        interference={"rejected": 2, "by_size": {"x": 1}},
    )
    assert Profile.from_dict(q.to_dict()) == q
    got = q.quality()
    assert got["status"] == "unclosed" and got["closure"]["http"]["error"] == pytest.approx(0.3)
    assert got["interference"] == {"rejected": 2}
    assert got["speed"]["cross_ns"] == 20000.0


def test_an_older_document_with_a_calibrated_exponent_still_loads() -> None:
    d = profile({Mode.HTTP: {OTHER: flat(5, 2)}}).to_dict()
    d["colocation"] = {"http": {"alpha": 0.8, "lo": 0.7, "hi": 0.9, "mode": "http", "rate": 100.0}}
    assert Profile.from_dict(d).to_dict().get("colocation") is None


def test_a_profile_keeps_its_transfer_through_its_document_and_shows_it() -> None:
    from meshtax.model.profile_check import ProfileError
    from meshtax.model.transfer import KeyTransfer, Transfer

    t = Transfer({"http": KeyTransfer(1.3, 1.2, 1.4, 5, 0.94)}, "suite s, calibration set")
    p = replace(_transfer_base(), transfer=t)
    doc = p.to_dict()
    assert doc["transfer"]["factors"]["http"]["factor"] == 1.3
    assert Profile.from_dict(doc).transfer == t
    assert p.quality()["transfer"] == t.to_dict()
    assert "transfer" not in _transfer_base().to_dict()
    doc["transfer"]["factors"]["http"]["factor"] = 0
    with pytest.raises(ProfileError, match="factor"):
        Profile.from_dict(doc)
    doc["transfer"]["factors"] = {"udp": {"factor": 1, "lo": 1, "hi": 1, "cases": 1}}
    with pytest.raises(ProfileError, match="udp"):
        Profile.from_dict(doc)


def test_a_profile_keeps_its_transfers_latency_factors_and_refuses_bad_ones() -> None:
    from meshtax.model.profile_check import ProfileError
    from meshtax.model.transfer import KeyTransfer, Transfer

    k = KeyTransfer(1.3, 1.2, 1.4, 5, 0.94)
    t = Transfer({"http": k}, "suite s", {"tcp+grpc": replace(k, factor=0.9)})
    doc = replace(_transfer_base(), transfer=t).to_dict()
    assert Profile.from_dict(doc).transfer == t
    doc["transfer"]["latency_factors"] = {"udp": {"factor": 1, "lo": 1, "hi": 1, "cases": 1}}
    with pytest.raises(ProfileError, match="udp"):
        Profile.from_dict(doc)


def test_a_profile_stored_with_the_first_transfer_format_one_factor_per_mode_loads() -> None:
    """`validate --suite` at 0a3f92e wrote the transfer per mode, under "modes" (suite run 6's
    `suite-6+cal`): a mode is a cost model's key, and its carried protocols fall back to it."""
    from meshtax.model.profile_check import ProfileError

    doc = _transfer_base().to_dict()
    k = {"factor": 0.94, "lo": 0.53, "hi": 0.98, "cases": 5, "coverage": 0.94}
    doc["transfer"] = {
        "source": "suite issue-14",
        "modes": {"tcp": k, "http": {**k, "factor": 1.35}},
    }
    t = Profile.from_dict(doc).transfer
    assert t is not None and t.factor("http") == 1.35 and t.factor("tcp+grpc") == 0.94
    doc["transfer"] = {"source": "suite issue-14", "modes": {"tcp+grpc": k}}
    with pytest.raises(ProfileError, match="tcp\\+grpc"):
        Profile.from_dict(doc)
    doc["transfer"] = {"source": "suite issue-14"}
    with pytest.raises(ProfileError, match="transfer"):
        Profile.from_dict(doc)


def _transfer_base() -> Profile:
    return profile({Mode.HTTP: {IPC: flat(5, 5)}})
