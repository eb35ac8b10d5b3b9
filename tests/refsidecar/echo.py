"""Test helper (stdlib only): an echo server and a checking client, over TCP or a Unix socket.

echo.py serve ADDR
    echo every connection until its EOF; print "ready" once listening and one line
    "peer=<address>" per connection (so a test sees who connected: the proxy or the client).
echo.py send ADDR SIZE [SIZE ...]
    one connection per size: send SIZE pseudo-random bytes, half-close, read to EOF; print
    "ok SIZE" when the same bytes came back, "bad SIZE ..." otherwise (exit 1).

ADDR is IPV4:PORT or a socket path (anything with a '/').
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import threading
from collections.abc import Callable


def _family_addr(addr: str) -> tuple[int, str | tuple[str, int]]:
    if "/" in addr:
        return socket.AF_UNIX, addr
    host, port = addr.rsplit(":", 1)
    return socket.AF_INET, (host, int(port))


def payload(size: int) -> bytes:
    """Deterministic bytes of every value (a zero byte or a repeated pattern would hide shifts)."""
    out = bytearray()
    block = size.to_bytes(8, "little")
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:size])


def _echo(conn: socket.socket) -> None:
    with conn:
        try:
            while data := conn.recv(65536):
                conn.sendall(data)
        except (ConnectionResetError, BrokenPipeError):
            pass  # the peer went away (a test resets connections on purpose)


def serve(addr: str, on_peer: Callable[[str], None] = print) -> socket.socket:
    """Listen on ``addr`` and echo in threads; returns the listening socket (close to stop)."""
    family, sa = _family_addr(addr)
    srv = socket.socket(family, socket.SOCK_STREAM)
    if family == socket.AF_INET:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(sa)
    if family == socket.AF_UNIX:
        os.chmod(str(sa), 0o666)  # a proxy of another uid connects to it
    srv.listen(128)

    def loop() -> None:
        while True:
            try:
                conn, peer = srv.accept()
            except OSError:
                return  # closed
            on_peer(f"peer={peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "peer=unix")
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return srv


def roundtrip(addr: str, size: int, timeout: float = 30.0) -> bytes:
    """Send ``payload(size)``, half-close, and return everything read back until EOF."""
    family, sa = _family_addr(addr)
    data = payload(size)
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sa)

        def send() -> None:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)

        t = threading.Thread(target=send, daemon=True)
        t.start()
        got = bytearray()
        while chunk := s.recv(1 << 20):
            got += chunk
        t.join(timeout)
    return bytes(got)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "serve":
        serve(argv[1], lambda line: print(line, flush=True))
        print("ready", flush=True)
        threading.Event().wait()
    if len(argv) >= 3 and argv[0] == "send":
        bad = 0
        for size in map(int, argv[2:]):
            got = roundtrip(argv[1], size)
            ok = got == payload(size)
            bad += not ok
            print(f"ok {size}" if ok else f"bad {size} got {len(got)} bytes", flush=True)
        return 1 if bad else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
