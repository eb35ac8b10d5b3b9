"""A known syscall load for the probe tests and the overhead benchmark (run as a child).

Prints ``ready``; then per stdin line: ``sock N`` sends N 100-byte messages over loopback TCP
from a thread while the main thread waits in epoll and receives; ``unix N`` the same over a
Unix stream socket pair; ``zerocopy N`` sends N 4 KB ``MSG_ZEROCOPY`` messages over loopback TCP
and reaps their completions from the error queue (answers how many ``recvmsg(MSG_ERRQUEUE)``
calls returned one); ``pipe N`` does N write+read pairs of 1 byte on a pipe and prints the
median ns per syscall over batches of 100 pairs; ``spin S`` burns user CPU for S seconds. Each
command answers ``done [value]``.
"""

from __future__ import annotations

import os
import select
import socket
import sys
import threading
import time

SO_ZEROCOPY = 60  # linux/socket.h (Python's socket module lacks both)
MSG_ZEROCOPY = 0x4000000


def main() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    srv.close()
    # one send, one skb: makes the IPC count predictable
    a.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    r, w = os.pipe()
    ua, ub = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ep = select.epoll()
    ep.register(b.fileno(), select.EPOLLIN)
    uep = select.epoll()
    uep.register(ub.fileno(), select.EPOLLIN)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, arg = line.split()
        if cmd in ("sock", "unix"):
            n = int(arg)
            tx, rx, poll = (a, b, ep) if cmd == "sock" else (ua, ub, uep)

            def writer(n: int = n, tx: socket.socket = tx) -> None:
                for _ in range(n):
                    tx.send(b"x" * 100)
                    time.sleep(0.0002)  # let the reader fall asleep in epoll_wait

            t = threading.Thread(target=writer)
            t.start()
            got = 0
            while got < n * 100:
                if poll.poll(2.0):
                    got += len(rx.recv(65536))
            t.join()
            print("done", flush=True)
        elif cmd == "zerocopy":
            a.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
            reaped = 0
            for _ in range(int(arg)):
                a.sendmsg([b"z" * 4096], [], MSG_ZEROCOPY)
                got = 0
                while got < 4096:
                    got += len(b.recv(65536))
                time.sleep(0.0005)  # the completion is posted when the skb is freed
                try:
                    a.recvmsg(0, 256, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
                    reaped += 1
                except BlockingIOError:
                    pass
            print("done", reaped, flush=True)
        elif cmd == "pipe":
            per: list[float] = []
            for _ in range(max(1, int(arg) // 100)):
                t0 = time.perf_counter_ns()
                for _ in range(100):
                    os.write(w, b"y")
                    os.read(r, 1)
                per.append((time.perf_counter_ns() - t0) / 200)
            per.sort()
            print("done", per[len(per) // 2], flush=True)
        elif cmd == "spin":
            end = time.monotonic() + float(arg)
            x = 0
            while time.monotonic() < end:
                x += 1
            print("done", x, flush=True)
        else:
            print("error unknown command", flush=True)


if __name__ == "__main__":
    main()
