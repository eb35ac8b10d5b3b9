"""profile_extras and its pieces against fakes, with exact expectations; one real mTLS run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from meshtax.model.components import OTHER, TLS, filter_component
from meshtax.model.costmodel import CostModel, extra_units
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode
from meshtax.model.stats import estimate
from meshtax.profile.backends import Backends
from meshtax.profile.extras import ExtrasOptions, profile_extras
from meshtax.profile.filters import FilterRunOptions
from meshtax.profile.large import add_large, fit_large
from meshtax.profile.tls import HandshakeResult, TlsResult, measure_handshake, tls_models
from meshtax.testbed.envoy.variants import BASE
from meshtax.testbed.pods import Testbed
from meshtax.testbed.runstate import FakeProcOps
from meshtax.testbed.system import FakeSystem, RealSystem
from tests.helpers import flat, profile
from tests.profile.fakes import FakeWorld, fake_backends


def _fake_run(tmp_path: Path) -> dict[str, Any]:
    """Run settings of a testbed on a fake system (state in ``tmp_path``)."""
    return {"state_dir": tmp_path, "procs": FakeProcOps(default=lambda p: p * 10)}


def _large_truth(s: float) -> float:
    # per crossing: 10 µs + 1 ns/B + 5 µs per extra 64 KiB unit
    return 10 + 0.001 * s + 5 * float(extra_units([s], 65536)[0])


SIZES = (100, 1024, 4096, 16384, 65536, 262144, 1048576)


def test_fit_large_finds_the_split_and_the_line_underestimates() -> None:
    per_request = {s: [2 * _large_truth(s)] * 3 for s in SIZES}
    f = fit_large(per_request, "cpu")
    assert f.line.intercept == pytest.approx(10.0)
    assert f.line.slope == pytest.approx(0.001)
    assert f.split.split_bytes == 65536
    assert f.split.per_unit == pytest.approx(5.0)
    rows = {int(r["size"]): r for r in f.rows()}
    assert set(rows) == {16384, 65536, 262144, 1048576}
    assert rows[1048576]["measured"] == pytest.approx(_large_truth(1048576))
    assert rows[1048576]["line_error"] == pytest.approx(-75 / _large_truth(1048576))
    assert rows[1048576]["split_error"] == pytest.approx(0.0, abs=1e-9)


def test_add_large_keeps_the_profiled_line_and_adds_units() -> None:
    per_request = {s: [2 * _large_truth(s)] * 3 for s in SIZES}
    f = fit_large(per_request, "cpu")
    p = profile({Mode.HTTP: {OTHER: flat(7.0, 3.0, 0.0, 0.002)}})
    mp = add_large(p.modes[Mode.HTTP], f, f)
    other = mp.components[OTHER]
    assert (other.cpu.intercept, other.cpu.slope) == (3.0, 0.002)
    assert other.cpu.split_bytes == 65536
    assert other.cpu.per_unit == pytest.approx(5.0)
    assert float(other.cpu.predict([1048576])[0]) == pytest.approx(3 + 0.002 * 1048576 + 75)
    # no split found: unchanged
    flat_f = fit_large({s: [2 * (10 + 0.001 * s)] * 3 for s in SIZES}, "cpu")
    assert flat_f.split.split_bytes is None
    assert (
        add_large(p.modes[Mode.HTTP], flat_f, flat_f).components[OTHER]
        == p.modes[Mode.HTTP].components[OTHER]
    )


def test_tls_and_handshake_models_are_per_crossing_and_per_sidecar() -> None:
    sizes = (100, 16384, 65536)
    cpu = {s: estimate([4 * (1 + 0.0001 * s)] * 3) for s in sizes}
    lat = {s: estimate([8.0] * 3) for s in sizes}
    m = tls_models(TlsResult(Mode.HTTP, "1.3", sizes, cpu, lat, {s: 50.0 for s in sizes}))
    assert float(m.cpu.predict([100])[0]) == pytest.approx(1.01)
    assert float(m.latency.predict([100])[0]) == pytest.approx(2.0)
    assert m.cpu.split_bytes == 16384
    hs = HandshakeResult("1.3", 100, estimate([400.0, 410.0, 420.0]), estimate([500.0] * 3)).model()
    assert hs.cpu.intercept == pytest.approx(205.0)
    assert hs.latency.intercept == pytest.approx(250.0)


class DictStore:
    def __init__(self, *profiles: Profile) -> None:
        self.saved: dict[str, Profile] = {p.name: p for p in profiles}

    def get(self, name: str) -> Profile:
        if name not in self.saved:
            raise KeyError(name)
        return self.saved[name]

    def save(self, profile: Profile, *, replace: bool = False) -> None:
        assert replace or profile.name not in self.saved
        self.saved[profile.name] = profile


def _world() -> FakeWorld:
    cpu = {
        BASE: 40.0,
        "header_mutation": 41.5,
        "plain_out": 80.0,
        "plain_in": 0.0,
        "mtls_out": 92.0,
        "mtls_in": 0.0,
    }
    lat = {
        BASE: 200.0,
        "header_mutation": 201.0,
        "plain_out": 400.0,
        "plain_in": 0.0,
        "mtls_out": 420.0,
        "mtls_in": 0.0,
    }
    instr = {k: 1000.0 * v for k, v in cpu.items()}
    return FakeWorld(cpu, lat, instr)


def test_profile_extras_adds_to_a_copy_and_merges_later_runs(tmp_path: Path) -> None:
    world = _world()
    conn_cpu = {"plain_out": 100.0, "mtls_out": 500.0}

    def connect(port: int, k: int, mode: Mode) -> float:
        world.cpu_ns += round(conn_cpu[world.port_names[port]] * 1000 * k)
        return {"plain_out": 100e-6, "mtls_out": 700e-6}[world.port_names[port]]

    class Mem:
        def __init__(self, mtls: bool) -> None:
            self.rss_models = {
                "server": CostModel.fit(
                    [1, 100, 400], [1e7 + n * (9e4 if mtls else 3e4) for n in (1, 100, 400)]
                )
            }

        def to_dict(self) -> dict[str, Any]:
            return {"fake": True}

    be = fake_backends(
        world,
        memory=lambda tb, be, spec: Mem(spec.mtls),
        connect=connect,
        **_fake_run(tmp_path),
    )
    base = profile(
        {Mode.HTTP: {OTHER: flat(7.0, 3.0)}, Mode.TCP: {OTHER: flat(5.0, 2.0)}}, name="box"
    )
    store = DictStore(base)
    out = profile_extras(
        ExtrasOptions(filters=("header_mutation",), quick=True, modes=(Mode.HTTP,)),
        FakeSystem(),
        store,
        "box",
        backends=be,
    )
    assert out.name == "box+extras" and store.saved["box"] == base  # the base is untouched
    hm = out.modes[Mode.HTTP].components[filter_component("header_mutation")]
    assert float(hm.cpu.predict([100])[0]) == pytest.approx(0.75)  # 1.5 µs per request, halved
    assert out.provenance.options["extras_base"] == "box"
    # a later run adds mTLS and memory to the same extended profile, keeping the filter
    out2 = profile_extras(
        ExtrasOptions(mtls=True, memory=True, quick=True, modes=(Mode.HTTP,)),
        FakeSystem(),
        store,
        "box",
        backends=be,
    )
    mp = out2.modes[Mode.HTTP]
    assert filter_component("header_mutation") in mp.components
    assert float(mp.components[TLS].cpu.predict([100])[0]) == pytest.approx(12 / 4)
    assert mp.tls_handshake is not None and mp.tls_handshake.cpu.intercept == pytest.approx(200.0)
    assert mp.tls_handshake.latency.intercept == pytest.approx(300.0)
    assert mp.memory is not None and mp.memory.slope == pytest.approx(3e4)
    assert mp.memory_mtls is not None and mp.memory_mtls.slope == pytest.approx(9e4)
    assert set(out2.provenance.options["extras"]) == {"filters", "mtls", "memory"}
    assert Mode.TCP in out2.modes and out2.modes[Mode.TCP] == base.modes[Mode.TCP]
    with pytest.raises(ValueError, match="no grpc mode"):
        profile_extras(
            ExtrasOptions(mtls=True, modes=(Mode.GRPC,)), FakeSystem(), store, "box", backends=be
        )


@pytest.mark.root
def test_real_handshake_costs_cpu() -> None:
    """Real Envoy pair: an mTLS connection costs more worker CPU than a plaintext one."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    with Testbed(RealSystem()) as tb:
        hs = measure_handshake(tb, Backends(), FilterRunOptions(rounds=3), "1.3", k=40)
    # an ECDHE handshake with two certificate verifications is tens of µs at the least
    assert hs.cpu_us.median > 20.0
    assert np.isfinite(hs.latency_us.median)


def test_extras_measure_both_tls_versions_and_per_connection_rbac(tmp_path: Path) -> None:
    """mTLS: the primary version fills tls/tls_handshake, every version lands in
    tls_by_version; network RBAC gets a per-connection model in the modes the loop speaks."""
    world = _world()
    world.cpu = {**world.cpu, "rbac_network_1": 40.0}
    world.lat = {**world.lat, "rbac_network_1": 200.0}
    world.instr = {**world.instr, "rbac_network_1": 40_000.0}
    conn_cpu = {"plain_out": 100.0, "mtls_out": 500.0, BASE: 90.0, "rbac_network_1": 93.0}

    def connect(port: int, k: int, mode: Mode) -> float:
        world.cpu_ns += round(conn_cpu[world.port_names[port]] * 1000 * k)
        return 1e-4

    be = fake_backends(world, callgrind=False, connect=connect, **_fake_run(tmp_path))
    base = profile(
        {Mode.HTTP: {OTHER: flat(7.0, 3.0)}, Mode.TCP: {OTHER: flat(5.0, 2.0)}}, name="box"
    )
    store = DictStore(base)
    out = profile_extras(
        ExtrasOptions(
            filters=("rbac_network_1",), mtls=True, quick=True, modes=(Mode.TCP, Mode.HTTP)
        ),
        FakeSystem(),
        store,
        "box",
        backends=be,
    )
    for mode in (Mode.TCP, Mode.HTTP):
        mp = out.modes[mode]
        assert mp.tls_version == "1.3" and set(mp.tls_by_version) == {"1.3", "1.2"}
        t12 = mp.tls_by_version["1.2"]
        assert t12.version == "1.2" and t12.handshake is not None and t12.per_message is not None
        assert t12.handshake.cpu.intercept == pytest.approx(200.0)
        assert mp.tls_handshake == mp.tls_by_version["1.3"].handshake
        assert mp.components[TLS] == mp.tls_by_version["1.3"].per_message
        pc = mp.per_connection[filter_component("rbac_network_1")]
        assert pc.cpu.intercept == pytest.approx(3.0)
    rec = out.provenance.options["extras"]
    assert set(rec["mtls"]["by_version"]) == {"1.3", "1.2"} and "handshake" in rec["mtls"]
    assert "per_connection" in rec["filters"]["tcp"]
    # the new fields round-trip; a document without them (older writer) still loads
    back = Profile.from_dict(out.to_dict())
    assert back == out
    old = out.to_dict()
    for mp_doc in old["modes"].values():
        for k in ("tls_version", "tls_by_version", "per_connection"):
            del mp_doc[k]
    older = Profile.from_dict(old)
    assert older.modes[Mode.TCP].tls_version is None and not older.modes[Mode.TCP].per_connection
    # unset fields are not written: documents of profiles without them keep their shape
    assert (
        "per_connection" not in base.modes[Mode.TCP].to_dict()
        and "tls_version" not in base.modes[Mode.TCP].to_dict()
    )


def test_extras_per_connection_rbac_in_grpc_mode(tmp_path: Path) -> None:
    """The connection loop speaks gRPC too: a gRPC-mode profile gets network RBAC's
    per-connection model, measured with gRPC connections."""
    world = _world()
    world.cpu = {**world.cpu, "rbac_network_1": 40.0}
    world.lat = {**world.lat, "rbac_network_1": 200.0}
    world.instr = {**world.instr, "rbac_network_1": 40_000.0}
    conn_cpu = {BASE: 120.0, "rbac_network_1": 125.0}
    modes: set[Mode] = set()

    def connect_mode(port: int, k: int, mode: Mode) -> float:
        modes.add(mode)
        world.cpu_ns += round(conn_cpu[world.port_names[port]] * 1000 * k)
        return 1e-4

    be = fake_backends(world, callgrind=False, connect=connect_mode, **_fake_run(tmp_path))
    store = DictStore(profile({Mode.GRPC: {OTHER: flat(9.0, 4.0)}}, name="box"))
    out = profile_extras(
        ExtrasOptions(filters=("rbac_network_1",), quick=True, modes=(Mode.GRPC,)),
        FakeSystem(),
        store,
        "box",
        backends=be,
    )
    pc = out.modes[Mode.GRPC].per_connection[filter_component("rbac_network_1")]
    assert pc.cpu.intercept == pytest.approx(5.0)
    assert modes == {Mode.GRPC}
    assert "per_connection" in out.provenance.options["extras"]["filters"]["grpc"]
