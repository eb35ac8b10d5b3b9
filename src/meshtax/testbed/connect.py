"""New connections one after another, one message each: what a per-connection cost (a TLS
handshake, a network RBAC check) is measured with."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from meshtax.model.sidecar import Mode
from meshtax.testbed.h2client import PING_PATH, ping_message, unary_call

__all__ = ["ConnectFn", "LINE", "PING_PAYLOAD", "connect_loop", "exchange"]

ConnectFn = Callable[[int, int, Mode], float]  # (port, k connections, mode) → s per connection

LINE = b"meshtax-connect\n"
PING_PAYLOAD = b"meshtax-connect"
_GET = b"GET /echo HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n"


def exchange(s: socket.socket, mode: Mode, port: int) -> None:
    """One message on a fresh connection: TCP, a line echoed back; HTTP, one ``Connection:
    close`` GET read to EOF; gRPC, one unary ``fgrpc.PingServer/Ping`` whose payload must
    come back (then GOAWAY)."""
    if mode is Mode.GRPC:
        try:
            data = unary_call(s, PING_PATH, ping_message(PING_PAYLOAD))
        except ConnectionError as e:
            raise ConnectionError(f"{port}: {e}") from None
        if PING_PAYLOAD not in data:
            raise ConnectionError(f"{port}: gRPC call ended without the echoed payload")
        return
    if mode is Mode.TCP:
        s.sendall(LINE)
        got = b""
        while len(got) < len(LINE):
            chunk = s.recv(4096)
            if not chunk:
                raise ConnectionError(f"connection to {port} closed after {len(got)} bytes")
            got += chunk
        return
    s.sendall(_GET)
    got = b""
    while chunk := s.recv(65536):
        got += chunk
    if not got.startswith(b"HTTP/1.1 200"):
        raise ConnectionError(f"{port}: {got[:40]!r}")


def connect_loop(port: int, k: int, mode: Mode = Mode.TCP, host: str = "127.0.0.1") -> float:
    """Open ``k`` connections to ``host:port`` one after another, one :func:`exchange` each;
    returns the mean seconds per connection."""
    t0 = time.perf_counter()
    for _ in range(k):
        with socket.create_connection((host, port), timeout=5) as s:
            exchange(s, mode, port)
    return (time.perf_counter() - t0) / k
