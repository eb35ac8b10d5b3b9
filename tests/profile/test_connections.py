"""Per-connection costs (network RBAC) against fakes, and for real in each mode."""

from __future__ import annotations

import os

import pytest

from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends
from meshtax.profile.connections import measure_connections
from meshtax.testbed.envoy.variants import BASE
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import RealSystem
from tests.profile.fakes import fake_backends
from tests.profile.test_filters import world


def test_measure_connections_per_connection_difference(tb: Testbed) -> None:
    w = world()
    per_conn = {BASE: 100.0, "rbac_network_1": 101.0, "rbac_network_1000": 160.0}
    seen: list[tuple[str, int, Mode]] = []

    def connect(port: int, k: int, mode: Mode) -> float:
        name = w.port_names[port]
        seen.append((name, k, mode))
        w.cpu_ns += round(per_conn[name] * 1000 * k)
        return {BASE: 300e-6, "rbac_network_1": 300e-6, "rbac_network_1000": 350e-6}[name]

    be = fake_backends(w, False, connect=connect)
    got = measure_connections(tb, be, Mode.TCP, ["rbac_network_1", "rbac_network_1000"], 3, k=50)
    assert set(got) == {"rbac_network_1", "rbac_network_1000"}
    big = got["rbac_network_1000"]
    assert big.cpu_us.median == pytest.approx(60.0) and big.latency_us.median == pytest.approx(50.0)
    assert big.base_cpu_us == pytest.approx(100.0) and big.cpu_us.n == 3
    assert got["rbac_network_1"].cpu_us.median == pytest.approx(1.0)
    m = big.model()
    assert m.cpu.intercept == pytest.approx(60.0) and m.latency.intercept == pytest.approx(50.0)
    counted = [x for x in seen if x[1] == 50]
    assert len(counted) == 2 * 2 * 3 and {x[2] for x in seen} == {Mode.TCP}


@pytest.mark.root
@pytest.mark.parametrize("mode", [Mode.TCP, Mode.HTTP, Mode.GRPC])
def test_real_connections_network_rbac(mode: Mode) -> None:
    """A real Envoy: new connections through a 1000-rule network RBAC listener and through
    base are served (one message each), and the result has one sample per round."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    with Testbed(RealSystem()) as real:
        got = measure_connections(real, Backends(), mode, ["rbac_network_1000"], 2, k=20)
    m = got["rbac_network_1000"]
    assert m.cpu_us.n == 2 and m.base_cpu_us > 0 and m.base_latency_us > 0
