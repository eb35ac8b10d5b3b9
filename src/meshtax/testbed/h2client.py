"""One unary gRPC call over HTTP/2 with prior knowledge, sans I/O (the ``h2`` library), so the
same call runs on a blocking socket (new-connection costs) and on asyncio streams (thousands of
held connections).
"""

from __future__ import annotations

import asyncio
import socket

from h2 import events as h2events
from h2.config import H2Configuration
from h2.connection import H2Connection

__all__ = [
    "HEALTH_PATH",
    "PING_PATH",
    "UnaryCall",
    "grpc_message",
    "ping_message",
    "unary_call",
    "unary_call_async",
]

#: fortio's ping service (echoes its payload) and the standard health check
PING_PATH = "/fgrpc.PingServer/Ping"
HEALTH_PATH = "/grpc.health.v1.Health/Check"


def grpc_message(body: bytes) -> bytes:
    """One gRPC length-prefixed, uncompressed message."""
    return b"\x00" + len(body).to_bytes(4, "big") + body


def ping_message(payload: bytes) -> bytes:
    """fortio's ``PingMessage{payload}`` (field 3, bytes) as a gRPC message."""
    if len(payload) > 127:
        raise ValueError("payload longer than one varint byte")
    return grpc_message(b"\x1a" + bytes([len(payload)]) + payload)


class UnaryCall:
    """Stream 1 of a fresh client connection: the request is queued at construction;
    :meth:`receive` feeds bytes read from the peer and says when the call has ended.
    Raises :class:`ConnectionError` on RST_STREAM or GOAWAY before the end."""

    def __init__(self, path: str, message: bytes, authority: str = "app") -> None:
        self.conn = H2Connection(H2Configuration(client_side=True))
        self.conn.initiate_connection()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        self.conn.send_headers(1, headers)
        self.conn.send_data(1, message, end_stream=True)
        self.data = b""
        self.ended = False

    def to_send(self) -> bytes:
        """What must go to the peer now (request, SETTINGS/PING acks, window updates)."""
        return self.conn.data_to_send()

    def receive(self, chunk: bytes) -> bool:
        for ev in self.conn.receive_data(chunk):
            if isinstance(ev, h2events.DataReceived):
                self.data += ev.data
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2events.StreamReset):
                raise ConnectionError("HTTP/2 RST_STREAM before the response ended")
            elif isinstance(ev, h2events.ConnectionTerminated):
                raise ConnectionError("HTTP/2 GOAWAY before the response ended")
            elif isinstance(ev, h2events.StreamEnded) and ev.stream_id == 1:
                self.ended = True
        return self.ended

    def goaway(self) -> bytes:
        """GOAWAY, to close the connection politely."""
        self.conn.close_connection()
        return self.conn.data_to_send()


def unary_call(s: socket.socket, path: str, message: bytes) -> bytes:
    """The call on a connected blocking socket; returns the response's DATA bytes and sends
    GOAWAY."""
    call = UnaryCall(path, message)
    s.sendall(call.to_send())
    while True:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("HTTP/2 connection closed before the response ended")
        done = call.receive(chunk)
        s.sendall(call.to_send())
        if done:
            break
    s.sendall(call.goaway())
    return call.data


async def unary_call_async(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, message: bytes
) -> bytes:
    """The call on asyncio streams; the connection stays open afterwards."""
    call = UnaryCall(path, message)
    while True:
        writer.write(call.to_send())
        await writer.drain()
        chunk = await reader.read(65536)
        if not chunk:
            raise ConnectionError("HTTP/2 connection closed before the response ended")
        if call.receive(chunk):
            writer.write(call.to_send())
            await writer.drain()
            return call.data
