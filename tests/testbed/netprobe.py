"""Test helper (stdlib only): a TCP listener that reports what it saw, and its client.

netprobe.py listen PORT [PORT ...]
    accept on 0.0.0.0:PORT...; each connection gets one line
    "port=<listening port> orig=<SO_ORIGINAL_DST or -> uid=<euid>" and is closed.
    Prints "ready" once all ports are bound.
netprobe.py connect IP PORT
    connect, print the line received, exit 0 (exit 1 on connection failure).
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import sys

SO_ORIGINAL_DST = 80


def original_dst(conn: socket.socket) -> str:
    try:
        raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    except OSError:
        return "-"
    port = struct.unpack("!H", raw[2:4])[0]
    return f"{socket.inet_ntoa(raw[4:8])}:{port}"


def listen(ports: list[int]) -> None:
    sel = selectors.DefaultSelector()
    for port in ports:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.listen(16)
        sel.register(s, selectors.EVENT_READ, port)
    print("ready", flush=True)

    while True:
        for key, _ in sel.select():
            conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
            with conn:
                line = f"port={key.data} orig={original_dst(conn)} uid={os.geteuid()}\n"
                conn.sendall(line.encode())


def connect(ip: str, port: int) -> None:
    try:
        with socket.create_connection((ip, port), timeout=5) as s:
            data = b""
            while chunk := s.recv(256):
                data += chunk
    except OSError as e:
        print(f"error {e}")
        sys.exit(1)
    print(data.decode().strip())


if __name__ == "__main__":
    if sys.argv[1] == "listen":
        listen([int(p) for p in sys.argv[2:]])
    else:
        connect(sys.argv[2], int(sys.argv[3]))
