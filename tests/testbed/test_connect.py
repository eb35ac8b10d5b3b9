"""The new-connection loop and the HTTP/2 unary call, against small local servers and fortio."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshtax.model.sidecar import Mode
from meshtax.profile.backends import echo_server
from meshtax.testbed.connect import PING_PAYLOAD, connect_loop
from meshtax.testbed.h2client import ping_message
from meshtax.testbed.system import RealSystem, free_ports
from meshtax.testbed.tools import find_tool


def _serve(handler: Any) -> Iterator[int]:
    import socket
    import threading

    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def loop() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except TimeoutError:
                continue
            with c:
                handler(c)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join()
        srv.close()


def test_connect_loop_speaks_tcp_echo_and_http() -> None:
    def echo(c: Any) -> None:
        c.sendall(c.recv(4096))

    def http(c: Any) -> None:
        c.recv(4096)
        c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")

    def refuse(c: Any) -> None:
        c.recv(4096)
        c.sendall(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")

    for port in _serve(echo):
        assert connect_loop(port, 3, Mode.TCP) > 0
    for port in _serve(http):
        assert connect_loop(port, 3, Mode.HTTP) > 0
    for port in _serve(refuse):
        with pytest.raises(ConnectionError, match="403"):
            connect_loop(port, 1, Mode.HTTP)


def test_grpc_ping_message_is_fortios_ping() -> None:
    # gRPC prefix (uncompressed, 4-byte length) + PingMessage field 3 (payload, bytes)
    msg = ping_message(PING_PAYLOAD)
    assert msg[0] == 0 and int.from_bytes(msg[1:5], "big") == len(msg) - 5
    assert msg[5:] == b"\x1a" + bytes([len(PING_PAYLOAD)]) + PING_PAYLOAD


def _grpc_server(answer: str) -> Any:
    """A one-call HTTP/2 server (h2, server side) that answers the ping with ``answer``:
    "reset" (RST_STREAM), "trailers" (a trailers-only gRPC error, no DATA), "echo" (a PING,
    then headers, the request's message back and trailers)."""
    from h2.config import H2Configuration
    from h2.connection import H2Connection
    from h2.events import DataReceived, StreamEnded

    def handle(c: Any) -> None:
        conn = H2Connection(H2Configuration(client_side=False))
        conn.initiate_connection()
        c.sendall(conn.data_to_send())
        body, done = b"", False
        while not done:
            chunk = c.recv(65536)
            if not chunk:
                return
            for ev in conn.receive_data(chunk):
                if isinstance(ev, DataReceived):
                    body += ev.data
                elif isinstance(ev, StreamEnded):
                    done = True
            c.sendall(conn.data_to_send())
        assert body == ping_message(PING_PAYLOAD)
        if answer == "reset":
            conn.reset_stream(1, 7)
        elif answer == "trailers":
            conn.send_headers(
                1,
                [(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "12")],
                end_stream=True,
            )
        else:
            conn.ping(b"12345678")
            conn.send_headers(1, [(":status", "200"), ("content-type", "application/grpc")])
            conn.send_data(1, body)
            conn.send_headers(1, [("grpc-status", "0")], end_stream=True)
        c.sendall(conn.data_to_send())
        while c.recv(4096):  # until the client closes (after its GOAWAY)
            pass

    return handle


def test_grpc_ping_rejects_a_reset_and_a_missing_payload() -> None:
    for port in _serve(_grpc_server("reset")):
        with pytest.raises(ConnectionError, match="RST_STREAM"):
            connect_loop(port, 1, Mode.GRPC)
    for port in _serve(_grpc_server("trailers")):
        with pytest.raises(ConnectionError, match="without the echoed payload"):
            connect_loop(port, 1, Mode.GRPC)
    for port in _serve(_grpc_server("echo")):
        assert connect_loop(port, 2, Mode.GRPC) > 0


@pytest.mark.root
def test_grpc_connect_loop_against_fortio(tmp_path: Path) -> None:
    """The HTTP/2 call (h2) is one fortio's gRPC ping server answers (payload echoed)."""
    if find_tool("fortio") is None:
        pytest.skip("fortio missing (scripts/install.sh)")
    port = free_ports(1)[0]
    with echo_server(RealSystem(), tmp_path, Mode.GRPC, port):
        assert connect_loop(port, 3, Mode.GRPC) > 0
