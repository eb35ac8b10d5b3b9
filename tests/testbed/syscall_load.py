"""A known syscall load for the probe tests and the overhead benchmark (run as a child).

Prints ``ready``; then per stdin line: ``sock N`` sends N 100-byte messages over loopback TCP
from a thread while the main thread waits in epoll and receives; ``pipe N`` does N
write+read pairs of 1 byte on a pipe and prints the median ns per syscall over batches of 100
pairs; ``spin S`` burns user CPU for S seconds. Each command answers ``done [value]``.
"""

from __future__ import annotations

import os
import select
import socket
import sys
import threading
import time


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
    ep = select.epoll()
    ep.register(b.fileno(), select.EPOLLIN)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, arg = line.split()
        if cmd == "sock":
            n = int(arg)

            def writer(n: int = n) -> None:
                for _ in range(n):
                    a.send(b"x" * 100)
                    time.sleep(0.0002)  # let the reader fall asleep in epoll_wait

            t = threading.Thread(target=writer)
            t.start()
            got = 0
            while got < n * 100:
                if ep.poll(2.0):
                    got += len(b.recv(65536))
            t.join()
            print("done", flush=True)
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
