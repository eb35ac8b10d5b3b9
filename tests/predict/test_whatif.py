"""Measured speedups: two profiles compared component by component, written as a speedup file."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import yaml

from meshtax.model.components import IPC, OTHER, PARSING, WRITE, filter_component
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.profile import Platform
from meshtax.model.sidecar import Mode
from meshtax.predict.whatif import (
    Z95,
    Derivation,
    Factor,
    SpeedupError,
    apply_speedup,
    derive_speedup,
    speedup_from_dict,
)
from meshtax.store.reference import reference_profile
from tests.helpers import flat, profile

LUA = filter_component("lua")
# base: write has a per-byte slope, so its ratio depends on the message size
BASE = profile(
    {
        Mode.TCP: {
            IPC: flat(10, 4),
            WRITE: flat(2, 2, 0.001),
            PARSING: flat(0, 0),
            OTHER: flat(8, 6),
        },
        Mode.HTTP: {IPC: flat(12, 5), PARSING: flat(40, 30), LUA: flat(9, 20)},
    },
    name="base",
)
VARIANT = profile(
    {
        Mode.TCP: {
            IPC: flat(5, 3),
            WRITE: flat(1, 2, 0.001),
            PARSING: flat(0, 0),
            OTHER: flat(8, 6),
        },
        Mode.HTTP: {IPC: flat(3, 2.5), PARSING: flat(40, 30)},
        Mode.GRPC: {IPC: flat(1, 1)},
    },
    name="variant",
)


def _ratios(d: Derivation, metric: str) -> dict[tuple[Mode, str, float], float | None]:
    return {(r.mode, r.component.key, r.size): r.ratio for r in d.ratios if r.metric == metric}


def test_ratios_per_mode_component_and_size_are_exact() -> None:
    d = derive_speedup(BASE, VARIANT, sizes=(100, 4096))
    assert d.modes() == (Mode.TCP, Mode.HTTP)  # grpc: only the variant has it
    lat, cpu = _ratios(d, "latency"), _ratios(d, "cpu")
    for size in (100.0, 4096.0):
        assert lat[(Mode.TCP, "ipc", size)] == 0.5 and cpu[(Mode.TCP, "ipc", size)] == 0.75
        assert lat[(Mode.HTTP, "ipc", size)] == 0.25 and cpu[(Mode.HTTP, "ipc", size)] == 0.5
        assert lat[(Mode.TCP, "other", size)] == 1.0
        assert lat[(Mode.TCP, "parsing", size)] is None  # the base costs nothing: no ratio
    assert lat[(Mode.TCP, "write", 100.0)] == pytest.approx(1.1 / 2.1, rel=1e-12)
    assert lat[(Mode.TCP, "write", 4096.0)] == pytest.approx(5.096 / 6.096, rel=1e-12)
    assert cpu[(Mode.TCP, "write", 100.0)] == 1.0
    assert any("http filter:lua: only in 'base'" in n for n in d.notes)
    assert any("tcp parsing latency at 100 B: base 0" in n for n in d.notes)
    # flat models without samples carry no interval
    assert all(r.lo is None and r.hi is None for r in d.ratios)


def test_document_is_a_speedup_file_that_turns_base_into_variant_at_its_size() -> None:
    d = derive_speedup(BASE, VARIANT, sizes=(4096, 100))
    doc = yaml.safe_load(yaml.safe_dump(d.document(name="uds")))  # as written to disk
    assert doc["name"] == "uds" and doc["derived"]["size_bytes"] == 4096
    assert doc["modes"]["http"]["ipc"] == {"latency": "-75%", "cpu": "-50%"}
    assert "parsing" not in doc["modes"]["tcp"]  # no ratio in either metric
    after, warnings = apply_speedup(BASE, speedup_from_dict(doc, "uds.yaml"))
    assert warnings == ()
    for mode in (Mode.TCP, Mode.HTTP):
        for c, m in after.mode(mode).components.items():
            if c not in VARIANT.mode(mode).components:
                assert m == BASE.mode(mode).components[c]  # the base's lua stays
                continue
            v = VARIANT.mode(mode).components[c]
            for metric in ("latency", "cpu"):
                got = getattr(m, metric).predict(np.array([4096.0]))
                want = getattr(v, metric).predict(np.array([4096.0]))
                assert got == pytest.approx(want, rel=1e-6), (mode, c, metric)


def test_every_mode_puts_a_one_mode_comparison_under_scale() -> None:
    tcp_only = profile({Mode.TCP: BASE.mode(Mode.TCP).components}, name="b")
    d = derive_speedup(tcp_only, VARIANT, sizes=(100,))
    doc = d.document(every_mode=True)
    assert "modes" not in doc and doc["scale"]["ipc"] == {"latency": "-50%", "cpu": "-25%"}
    after, _ = apply_speedup(BASE, speedup_from_dict(doc))
    assert after.mode(Mode.HTTP).components[IPC].latency.intercept == 6  # 12 × 0.5
    with pytest.raises(SpeedupError, match="one-mode comparison"):
        derive_speedup(BASE, VARIANT).document(every_mode=True)
    with pytest.raises(SpeedupError, match="no ratios at 4096 B"):
        d.document(size=4096)


def _fitted(values: list[float]) -> CostModel:
    return CostModel.fit([100, 100, 4096, 4096], values)


def test_interval_from_both_models_fit_covariance() -> None:
    b = ComponentModel(_fitted([10, 12, 20, 22]), _fitted([4, 4, 8, 8]))
    v = ComponentModel(_fitted([5, 7, 10, 12]), _fitted([4, 4, 8, 8]))
    d = derive_speedup(
        profile({Mode.TCP: {IPC: b}}, "b"), profile({Mode.TCP: {IPC: v}}, "v"), sizes=(100,)
    )
    lat = next(r for r in d.ratios if r.metric == "latency")
    assert (lat.base, lat.variant) == pytest.approx((11.0, 6.0))
    s = np.array([100.0])
    se_b, se_v = float(b.latency.stderr_at(s)[0]), float(v.latency.stderr_at(s)[0])
    se = math.sqrt(se_v**2 + (6 / 11) ** 2 * se_b**2) / 11
    assert lat.ratio == pytest.approx(6 / 11)
    assert (lat.lo, lat.hi) == pytest.approx((6 / 11 - Z95 * se, 6 / 11 + Z95 * se))
    assert lat.significant
    cpu = next(r for r in d.ratios if r.metric == "cpu")  # identical exact fits: no scatter
    assert (cpu.ratio, cpu.lo, cpu.hi) == pytest.approx((1.0, 1.0, 1.0))


def test_negative_variant_is_clipped_to_a_free_component() -> None:
    d = derive_speedup(
        profile({Mode.TCP: {IPC: flat(4, 2)}}, "b"),
        profile({Mode.TCP: {IPC: flat(-1, 1)}}, "v"),
        sizes=(100,),
    )
    assert _ratios(d, "latency")[(Mode.TCP, "ipc", 100.0)] == 0.0
    assert any("variant -1 < 0; ratio clipped to 0" in n for n in d.notes)
    assert d.document()["modes"]["tcp"]["ipc"]["latency"] == "-100%"


def test_different_hosts_and_no_shared_mode_are_refused() -> None:
    with pytest.raises(SpeedupError, match="different hosts"):
        derive_speedup(reference_profile(), BASE)
    other = replace(VARIANT, platform=Platform("Test CPU", 2, "6.0", "refsidecar", "0.1"))
    assert derive_speedup(BASE, other).modes()  # another proxy on the same host is fine
    with pytest.raises(SpeedupError, match="share no protocol mode"):
        derive_speedup(profile({Mode.GRPC: {IPC: flat(1, 1)}}), BASE)
    with pytest.raises(SpeedupError, match="no message sizes"):
        derive_speedup(BASE, VARIANT, sizes=())


@pytest.mark.parametrize(
    ("doc", "factor"),
    [
        ({"scale": {"ipc": "-30%"}}, Factor(0.7, 0.7)),
        ({"scale": {"ipc": {"latency": "-40%", "cpu": "-20%"}}}, Factor(0.6, 0.8)),
        ({"scale": {"ipc": {"cpu": "+10%"}}}, Factor(1.0, 1.1)),
        ({"scale": {"ipc": "-30%"}, "modes": {"http": {"ipc": "-50%"}}}, Factor(0.5, 0.5)),
    ],
)
def test_factor_forms(doc: dict[str, object], factor: Factor) -> None:
    assert speedup_from_dict(doc).for_mode(Mode.HTTP)["ipc"] == factor


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"scale": {"ipc": {"latncy": "-4%"}}},
            r"scale.ipc: .*expected a percent change like -30% or \{latency",
        ),
        ({"modes": {"udp": {"ipc": "-4%"}}}, "modes: unknown field.*udp.*expected grpc, http, tcp"),
        ({"modes": {"tcp": {}}}, "nothing to change"),
        ({"scale": ["ipc"]}, "expected a mapping"),
    ],
)
def test_bad_factor_forms_are_clear_errors(doc: dict[str, object], message: str) -> None:
    with pytest.raises(SpeedupError, match=message):
        speedup_from_dict(doc, "sp.yaml")


def test_mode_entries_for_a_mode_the_profile_lacks_warn() -> None:
    sp = speedup_from_dict({"modes": {"grpc": {"ipc": "-10%"}}})
    _, warnings = apply_speedup(BASE, sp)
    assert len(warnings) == 1 and "no grpc mode" in warnings[0]
