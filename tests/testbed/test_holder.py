"""The connection holder (a child process): its spec, and for real against an echo server."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from meshtax.model.sidecar import Mode
from meshtax.testbed.fortio import FortioServer
from meshtax.testbed.holder import HolderSpec, HolderTls, holder_argv, raise_nofile, wait_status
from meshtax.testbed.system import RealSystem
from meshtax.testbed.tools import find_tool

need_fortio = pytest.mark.skipif(find_tool("fortio") is None, reason="fortio not installed")


def test_holder_spec_round_trips_and_argv(tmp_path: Path) -> None:
    tls = HolderTls("c.crt", "c.key", "ca.crt", "1.2")
    spec = HolderSpec("127.0.0.1", 9, "grpc", 400, str(tmp_path / "s.json"), 16, tls)
    assert HolderSpec.from_json(spec.to_json()) == spec
    plain = HolderSpec("127.0.0.1", 9, "tcp", 1, "s.json")
    assert HolderSpec.from_json(plain.to_json()) == plain
    argv = holder_argv(tmp_path / "spec.json")
    assert argv[1:] == ["-m", "meshtax.testbed.holder", str(tmp_path / "spec.json")]


def test_raise_nofile() -> None:
    import resource

    soft = raise_nofile(1024)
    assert soft >= 1024 and resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft


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
        spec = tmp_path / "spec.json"
        spec.write_text(HolderSpec("127.0.0.1", port, mode.value, 50, str(status)).to_json())
        proc = system.spawn(holder_argv(spec))
        try:
            doc = wait_status(status, proc, 20)
            assert (doc["open"], doc["failed"]) == (50, 0)
            assert _established_to(port) == 50  # held open, after the echo round trip
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            assert proc.wait(5) == 0  # SIGTERM is its normal end
