"""The one profile resolver: defaults, the cross-platform warning, and unclosed profiles
refused unless accepted (exact messages)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshtax.model.components import OTHER
from meshtax.model.profile import Closure, Platform, Profile
from meshtax.model.sidecar import Mode
from meshtax.store.resolve import NoProfile, UnclosedProfile, quality_lines, resolve_profile
from tests.helpers import PLATFORM, flat, profile

HERE = PLATFORM
ELSEWHERE = Platform("Other CPU", 64, "5.4", "envoy", "1.21", "x")


class Store:
    def __init__(self, *ps: Profile) -> None:
        self.ps = {p.name: p for p in ps}
        self.unusable: list[tuple[str, str]] = []

    def get(self, name: str) -> Profile:
        return self.ps[name]

    def for_host(self, host: Platform) -> Profile | None:
        return next((p for p in self.ps.values() if p.platform.same_host(host)), None)


def unclosed(p: Profile) -> Profile:
    mp = p.modes[Mode.HTTP]
    bad = replace(mp, closure=Closure(41.0, 38.0, 44.0, 20.0, 0.15))
    return replace(p, modes={Mode.HTTP: bad}, status="unclosed")


def test_newest_of_this_host_by_default_and_the_named_one_otherwise() -> None:
    p = profile({Mode.HTTP: {OTHER: flat(5, 2)}}, name="mine")
    got = resolve_profile(Store(p), None, HERE)
    assert got.profile is p and got.warnings == ()
    with pytest.raises(NoProfile, match="meshtax profile --quick"):
        resolve_profile(Store(), None, HERE)
    far = replace(p, name="far", platform=ELSEWHERE)
    got = resolve_profile(Store(p, far), "far", HERE)
    assert got.profile is far and "different platform" in got.warnings[0]


def test_an_unclosed_profile_is_refused_unless_accepted() -> None:
    p = unclosed(profile({Mode.HTTP: {OTHER: flat(5, 2)}}, name="loud"))
    assert p.unclosed and p.unclosed_modes == (Mode.HTTP,)
    line = (
        "profile 'loud', http mode: components 20.0 µs vs measured overhead 41.0 µs per "
        "message (-51%, beyond ±15%): unclosed"
    )
    assert quality_lines(p) == [line]
    for name in (None, "loud"):
        with pytest.raises(UnclosedProfile, match="--accept-unclosed") as e:
            resolve_profile(Store(p), name, HERE)
        assert line in str(e.value)
    got = resolve_profile(Store(p), None, HERE, accept_unclosed=True)
    assert got.profile is p and got.warnings == (line,)


def test_interference_is_said() -> None:
    p = replace(
        profile({Mode.HTTP: {OTHER: flat(5, 2)}}, name="busy"),
        interference={"rejected": 3, "windows": 24, "others_median_max": 0.07},
    )
    (w,) = resolve_profile(Store(p), None, HERE).warnings
    assert w == (
        "profile 'busy': 3 probe window pair(s) were disturbed by other work and measured "
        "again (others' CPU share up to 7%)"
    )


def test_a_busy_host_is_said_from_the_recorded_stall_rate() -> None:
    def warned(rate: float | None) -> tuple[str, ...]:
        i = {"windows": 24, "rejected": 0} | ({} if rate is None else {"stalls_median": rate})
        p = replace(profile({Mode.HTTP: {OTHER: flat(5, 2)}}, name="h"), interference=i)
        return resolve_profile(Store(p), None, HERE).warnings

    assert warned(None) == () and warned(29.0) == ()
    (w,) = warned(47.2)
    assert w.startswith(
        "profile 'h': measured on a busy host: its vCPUs' wake-ups stalled ≥ 130 µs 47"
    )
    assert "Notification" in w


def test_no_usable_profile_names_the_ones_that_failed_validation() -> None:
    s = Store()
    s.unusable.append(("old", "modes.http.components.ipc.latency.intercept: nan"))
    with pytest.raises(NoProfile, match="'old' failed validation"):
        resolve_profile(s, None, HERE)


def test_a_profile_with_a_transfer_says_so_wherever_it_is_used() -> None:
    from meshtax.model.transfer import KeyTransfer, Transfer

    t = Transfer({"http": KeyTransfer(1.25, 1.2, 1.3, 5, 0.94)}, "suite s")
    p = replace(profile({Mode.HTTP: {OTHER: flat(5, 2)}}, name="cal"), transfer=t)
    got = resolve_profile(Store(p), "cal", HERE)
    assert got.warnings == (
        "profile 'cal': per-message costs scaled by the transfer measured on suite s: "
        "http ×1.25 [1.20, 1.30] (5 cases)",
    )


def test_a_carried_model_that_does_not_close_is_said_but_does_not_refuse() -> None:
    # a quick profile on one CPU: the tcp-mode sidecar in front of gRPC summed 57.1 µs of
    # latency components for 25.5 µs of measured overhead, while every mode closed
    p = profile({Mode.TCP: {OTHER: flat(5, 2)}}, name="one-cpu")
    tcp = p.modes[Mode.TCP]
    grpc = replace(tcp, closure=Closure(25.5, 25.5, 25.5, 57.1, 0.15))
    ok = replace(tcp, closure=Closure(32.4, 30.0, 34.0, 29.3, 0.15), carried={"grpc": grpc})
    p = replace(p, modes={Mode.TCP: ok}, status="closed")
    assert not p.unclosed and p.quality()["status"] == "closed"
    assert p.quality()["closure"]["tcp+grpc"]["error"] == pytest.approx(57.1 / 25.5 - 1)
    line = (
        "profile 'one-cpu', tcp mode carrying grpc: latency components 57.1 µs vs measured "
        "overhead 25.5 µs per message (+124%, beyond ±15%); they price the latency of "
        "tcp-mode sidecars in front of grpc apps"
    )
    assert quality_lines(p) == [line]
    assert resolve_profile(Store(p), None, HERE).warnings == (line,)
    closing = replace(
        p,
        modes={
            Mode.TCP: replace(
                ok, carried={"grpc": replace(grpc, closure=Closure(50.0, 45.0, 55.0, 54.0, 0.15))}
            )
        },
    )
    assert quality_lines(closing) == [] and "tcp+grpc" in closing.quality()["closure"]
