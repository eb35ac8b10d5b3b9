"""decompose: probe/perf readings → per-crossing components, exact hand-computed values."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshtax.model.components import IPC, NOTIFICATION, OTHER, PARSING, READ, WRITE
from meshtax.model.sidecar import Mode
from meshtax.profile.decompose import (
    Breakdown,
    Window,
    assemble,
    chain_breakdown,
    cpu_breakdown,
    latency_breakdown,
    mesh_breakdown,
    per_crossing,
    traffic_threads,
)
from meshtax.testbed.probe_reading import EMPTY_THREAD, IpcStat, OpStat, ProbeReading, ThreadReading


def thread(
    tid: int,
    *,
    read: int = 0,
    write: int = 0,
    epoll: int = 0,
    notify: int = 0,
    rest: int = 0,
    user: int = 0,
    calls: int = 2,
    tgid: int = 100,
) -> ThreadReading:
    """A thread whose syscall wall time is read+write+epoll+rest ns."""
    n = calls if (read or write) else 0
    return ThreadReading(
        tid=tid,
        tgid=tgid,
        comm=f"t{tid}",
        read=OpStat(n, read, 100 * n, 0),
        write=OpStat(n, write, 100 * n, 0),
        epoll=OpStat(calls, epoll, 0, 0),
        notify=OpStat(calls, notify, 0, 0),
        syscalls=3 * calls,
        sys_ns=read + write + epoll + rest,
        oncpu_ns=user + 1000,
        user_ns=user,
        sys_cpu_ns=1000,
        unknown_cpu_ns=0,
        switches_in=calls,
    )


def make_reading(threads: list[ThreadReading], ipc_ns: int, ipc_count: int = 4) -> ProbeReading:
    total = EMPTY_THREAD
    for t in threads:
        total = total + t
    return ProbeReading(
        pids=(100,),
        netns=1,
        duration_ns=10**9,
        threads=tuple(threads),
        total=total,
        ipc=IpcStat("lo", ipc_count, ipc_ns, 100 * ipc_count, ipc_ns),
        counters={},
        programs=(),
        stats_enabled=False,
    )


WORKER = thread(101, read=4000, write=10000, epoll=50000, notify=6000, rest=2000, user=8000)
# the main thread sleeps in futex the whole window: 1 ms of syscall time on nobody's path
MAIN = thread(100, epoll=0, rest=1_000_000, user=500)


def test_per_crossing_halves_a_request() -> None:
    assert per_crossing(90.0) == 45.0


def test_latency_breakdown_per_crossing_write_minus_ipc_workers_only() -> None:
    bd = latency_breakdown(make_reading([MAIN, WORKER], ipc_ns=2000), requests=1)
    # 1 request = 2 crossings: ns / 2 / 1000 = µs per crossing
    assert bd == Breakdown(
        read=2.0, write=4.0, ipc=1.0, notification=3.0, user=4.0, kernel_other=1.0
    )
    assert bd.total() == 15.0
    assert bd.sidecar_work == 5.0


def test_traffic_threads_falls_back_to_total_when_nobody_did_io() -> None:
    idle = make_reading([MAIN], ipc_ns=0)
    assert traffic_threads(idle) == idle.total
    two = make_reading([MAIN, WORKER, thread(102, read=1000, user=2000)], ipc_ns=0)
    got = traffic_threads(two)
    assert (got.read.ns, got.user_ns) == (5000, 10000)


def test_latency_breakdown_clamps_write_below_ipc_and_rejects_zero_requests() -> None:
    bd = latency_breakdown(make_reading([WORKER], ipc_ns=20000), requests=2)
    assert bd.write == 0.0 and bd.ipc == 5.0
    with pytest.raises(ValueError, match="positive request count"):
        latency_breakdown(make_reading([WORKER], ipc_ns=0), requests=0)


def test_cpu_breakdown_ignores_probe_bucket() -> None:
    buckets = {
        "user": 4000,
        "read": 2000,
        "write": 1000,
        "ipc": 3000,
        "notification": 500,
        "kernel_other": 100,
        "probe": 99999,
    }
    assert cpu_breakdown(buckets, requests=2) == Breakdown(
        read=0.5, write=0.25, ipc=0.75, notification=0.125, user=1.0, kernel_other=0.025
    )


@pytest.mark.parametrize(
    ("mode", "baseline", "other", "parsing"),
    [
        (Mode.TCP, None, 5.0, 0.0),
        (Mode.TCP, Breakdown(user=1.0), 5.0, 0.0),  # TCP never subtracts
        (Mode.HTTP, Breakdown(user=2.0, kernel_other=0.5), 2.5, 2.5),
        (Mode.GRPC, Breakdown(user=7.0), 7.0, -2.0),  # negative parsing is noise, kept visible
        (Mode.HTTP, None, 5.0, 0.0),  # no baseline: everything is Other
    ],
)
def test_assemble(mode: Mode, baseline: Breakdown | None, other: float, parsing: float) -> None:
    bd = Breakdown(read=1.0, write=2.0, ipc=3.0, notification=4.0, user=4.0, kernel_other=1.0)
    got = assemble(mode, bd, baseline)
    assert got == {
        IPC: 3.0,
        READ: 1.0,
        WRITE: 2.0,
        NOTIFICATION: 4.0,
        OTHER: other,
        PARSING: parsing,
    }


# ---- sidecar + app, meshed and direct windows -------------------------------------------------

# the app (tgid 200): a Go-like runtime with an I/O thread and a thread that sleeps in futex
APP_IO_M = thread(
    201, read=3000, write=4000, epoll=90000, notify=1000, rest=5000, user=9000, tgid=200
)
APP_IO_D = thread(
    201, read=3500, write=9000, epoll=90000, notify=5000, rest=5000, user=8000, tgid=200
)
APP_SLEEPER = thread(202, rest=10**9, user=1000, tgid=200)


def test_window_splits_sidecar_and_app_and_adds_up() -> None:
    w = Window.of(
        make_reading([MAIN, WORKER, APP_IO_M, APP_SLEEPER], ipc_ns=2000),
        1,
        sidecar_tgid=100,
        app_tgid=200,
    )
    # sidecar: only its threads that did I/O; app: every thread of the app
    assert (w.sidecar.read.ns, w.sidecar.user_ns) == (4000, 8000)
    assert (w.app.read.ns, w.app.user_ns, w.app.sys_ns) == (3000, 10000, 102000 + 10**9)
    assert (w.ipc_ns, w.ipc_packets, w.ipc_bytes, w.requests) == (2000, 4, 400, 1)
    assert (
        Window.of(make_reading([WORKER, APP_IO_M], ipc_ns=0), 1, sidecar_tgid=100).app.read.ns == 0
    )
    two = w + w
    assert (two.requests, two.sidecar.write.ns, two.app.write.ns, two.ipc_ns) == (
        2,
        20000,
        8000,
        4000,
    )


def test_mesh_breakdown_adds_the_change_of_the_apps_path() -> None:
    meshed = Window.of(
        make_reading([WORKER, APP_IO_M, APP_SLEEPER], ipc_ns=3000),
        1,
        sidecar_tgid=100,
        app_tgid=200,
    )
    # direct: 2 requests; the app writes toward the client (veth: dearer) and is woken from
    # the other CPU; no loopback traffic
    direct = Window.of(
        make_reading([APP_IO_D, APP_SLEEPER], ipc_ns=0, ipc_count=0),
        2,
        sidecar_tgid=100,
        app_tgid=200,
    )
    bd = mesh_breakdown(meshed, direct)
    # per crossing, meshed: /2 crossings /1000; direct: /4 crossings /1000
    # read 4000/2e3 + (3000/2e3 − 3500/4e3) = 2 + 0.625; write 10000/2e3 + (4000/2e3 − 9000/4e3)
    # − ipc 1.5 = 5 − 0.25 − 1.5; notify 3 + (0.5 − 1.25); user 4 + (5 − 2.25); futex sleeps unused
    assert bd.read == pytest.approx(2.625)
    assert bd.write == pytest.approx(3.25)
    assert bd.ipc == pytest.approx(1.5)
    assert bd.notification == pytest.approx(2.25)
    assert bd.user == pytest.approx(6.75)
    assert bd.kernel_other == pytest.approx(1.0)  # the sidecar's other syscalls only
    # without the direct windows: the sidecar alone, Write = its writes − all IPC (signed)
    alone = mesh_breakdown(meshed, None)
    assert alone == Breakdown(
        read=2.0, write=3.5, ipc=1.5, notification=3.0, user=4.0, kernel_other=1.0
    )
    with pytest.raises(ValueError, match="positive request count"):
        mesh_breakdown(Window(0), None)


def test_unix_socket_delivery_is_ipc_and_zero_copy_completions_are_write() -> None:
    # Unix-socket legs: no lo traffic; the sidecar's sends spent 1200 ns delivering to the app
    # (sk_data_ready → end of send), the meshed app's (another process, tgid 300) 800 ns; the
    # sidecar reaped zero-copy completions for 600 ns (recvmsg(MSG_ERRQUEUE), not in read)
    side = replace(
        WORKER,
        sock_ipc=OpStat(2, 1200, 200, 0),
        errqueue=OpStat(1, 600, 0, 0),
        sys_ns=WORKER.sys_ns + 600,
    )
    app_m = replace(APP_IO_M, tgid=300, sock_ipc=OpStat(2, 800, 200, 0))
    meshed = Window.of(make_reading([side, app_m], ipc_ns=0), 1, sidecar_tgid=100, app_tgid=300)
    direct = Window.of(
        make_reading([APP_IO_D], ipc_ns=0, ipc_count=0), 2, sidecar_tgid=100, app_tgid=200
    )
    bd = mesh_breakdown(meshed, direct)
    # IPC = (1200 + 800) / 2e3 = 1.0; Write = (10000 + 600) / 2e3 + (4000/2e3 − 9000/4e3) − 1.0
    assert bd.ipc == pytest.approx(1.0)
    assert bd.write == pytest.approx(5.3 - 0.25 - 1.0)
    assert bd.read == pytest.approx(2.625)  # the error queue is not Read
    assert bd.kernel_other == pytest.approx(1.0)  # nor other kernel work
    # the sidecar alone: its own Unix delivery and completions
    alone = mesh_breakdown(meshed, None)
    assert (alone.ipc, alone.write) == pytest.approx((0.6, 5.3 - 0.6))
    lone = latency_breakdown(make_reading([side], ipc_ns=0), requests=1)
    assert (lone.ipc, lone.write, lone.read) == pytest.approx((0.6, 4.7, 2.0))


# ---- the client (followed threads of the load generator's pod) -------------------------------


def followed(t: ThreadReading) -> ThreadReading:
    return replace(t, followed=True)


# the client (tgid 300). Meshed: 1 request, 2 calls of each kind (1 per crossing, as a gRPC
# client that is woken twice per response); direct: 2 requests, 2 calls (0.5 per crossing).
# Per call, meshed: read 2000, write 6000 (the interception's NAT), notify 4000 ns;
# direct: 1500, 4000, 3000 ns.
CLIENT_M = followed(
    thread(301, read=4000, write=12000, epoll=90000, notify=8000, user=7000, tgid=300)
)
CLIENT_D = followed(
    thread(301, read=3000, write=8000, epoll=90000, notify=6000, user=9000, tgid=300)
)


def test_window_puts_followed_threads_in_client_only() -> None:
    w = Window.of(
        make_reading([WORKER, APP_IO_M, CLIENT_M], ipc_ns=0), 1, sidecar_tgid=100, app_tgid=200
    )
    assert (w.client.write.ns, w.client.read.ns, w.client.user_ns) == (12000, 4000, 7000)
    assert (w.sidecar.write.ns, w.app.write.ns) == (10000, 4000)
    # without a sidecar tgid the busy threads are the sidecar's: still not the client's
    assert (
        Window.of(make_reading([WORKER, CLIENT_M], ipc_ns=0), 1, sidecar_tgid=None).sidecar.write.ns
        == 10000
    )
    assert (w + w).client.write.ns == 24000


def test_mesh_breakdown_adds_the_clients_change() -> None:
    meshed = Window.of(
        make_reading([WORKER, APP_IO_M, CLIENT_M], ipc_ns=3000), 1, sidecar_tgid=100, app_tgid=200
    )
    direct = Window.of(
        make_reading([APP_IO_D, CLIENT_D], ipc_ns=0, ipc_count=0), 2, sidecar_tgid=100, app_tgid=200
    )
    bd = mesh_breakdown(meshed, direct)
    # client Δ per call × direct calls per crossing (2 calls / 4 crossings = 0.5), µs:
    # write (6 − 4) × 0.5 = 1 → IPC (the interception's delivery), read (2 − 1.5) × 0.5 = 0.25
    # → Read, notify (4 − 3) × 0.5 = 0.5 → Notification. The meshed window's extra calls do
    # not count (a total-time Δ would give write 12/2 − 8/4 = 4). Its user time is not used.
    # The loopback IPC (1.5) alone is subtracted from Write: the client's writes are not
    # inside the sidecar's or the app's.
    assert bd.ipc == pytest.approx(1.5 + 1.0)
    assert bd.write == pytest.approx(3.25)  # as without a client
    assert bd.read == pytest.approx(2.625 + 0.25)
    assert bd.notification == pytest.approx(2.25 + 0.5)
    assert bd.user == pytest.approx(4 + 4.5 - 2)  # sidecar + Δapp (no sleeper here)
    assert bd.kernel_other == pytest.approx(1.0)
    # the client does not enter the sidecar-only definition
    assert mesh_breakdown(meshed, None) == Breakdown(
        read=2.0, write=3.5, ipc=1.5, notification=3.0, user=4.0, kernel_other=1.0
    )


def test_mesh_breakdown_trimmed_notification() -> None:
    from meshtax.profile.decompose import notify_ns
    from meshtax.testbed.probes import Histogram

    def hist(t: ThreadReading, rows: tuple[tuple[int, int, int], ...]) -> ThreadReading:
        h = Histogram(rows, shift=10)
        assert (h.count, h.ns) == (t.notify.count, t.notify.ns)  # the fixture's totals
        return replace(t, notify_hist=h)

    # sidecar: 2 wake-ups, 1000 + 5000 ns; app meshed 2 × 500; app direct 2 wake-ups, 1000 +
    # 4000; client meshed 2 × 4000, direct 2000 + 4000
    worker = hist(WORKER, ((0, 1, 1000), (4, 1, 5000)))
    app_m = hist(APP_IO_M, ((0, 2, 1000),))
    app_d = hist(APP_IO_D, ((0, 1, 1000), (3, 1, 4000)))
    cl_m = hist(CLIENT_M, ((3, 2, 8000),))
    cl_d = hist(CLIENT_D, ((1, 1, 2000), (3, 1, 4000)))
    meshed = Window.of(
        make_reading([worker, app_m, cl_m], ipc_ns=3000), 1, sidecar_tgid=100, app_tgid=200
    )
    direct = Window.of(
        make_reading([app_d, cl_d], ipc_ns=0, ipc_count=0), 2, sidecar_tgid=100, app_tgid=200
    )
    plain = mesh_breakdown(meshed, direct)
    assert mesh_breakdown(meshed, direct, notify_trim=0.0) == plain
    assert notify_ns(worker, 0.5) == pytest.approx(2000.0)  # 2 wake-ups × the faster one
    assert notify_ns(WORKER, 0.5) == WORKER.notify.ns  # no histogram: the sum
    half = mesh_breakdown(meshed, direct, notify_trim=0.5)
    # sidecar 2000/2e3 = 1; Δapp 1000/2e3 − 2000/4e3 = 0; client per call (4000 − 2000) × 2/4e3 = 1
    assert half.notification == pytest.approx(1.0 + 0.0 + 1.0)
    # only Notification changes
    assert replace(half, notification=plain.notification) == plain


def test_steady_breakdown_cancels_what_each_run_costs_once() -> None:
    from meshtax.profile.decompose import Breakdown, steady_breakdown

    # every crossing costs 50 µs of user CPU; each run costs 8 ms once (its connection)
    def run(requests: int) -> Breakdown:
        crossings = 2 * requests
        return Breakdown(user=(50.0 * crossings + 8000.0) / crossings, read=3.0)

    short, long = run(80), run(160)
    assert short.user == pytest.approx(100.0)  # what one run alone says: twice the cost
    steady = steady_breakdown(short, 80, long, 160)
    assert steady.user == pytest.approx(50.0) and steady.read == pytest.approx(3.0)
    with pytest.raises(ValueError):
        steady_breakdown(long, 160, short, 80)


def test_chain_breakdown_adds_on_cpu_time_not_waits() -> None:
    """1 request = 2 crossings. Meshed: the watched proxy read 2, wrote 6, waited 10 for the
    CPU others held (notify), ran 4 in user space and 12 in the kernel; the app and other
    proxies ran 3 more in user space and 5 more in the kernel than direct, waited 20 more.
    The client's calls: its notification took 1 µs longer per call (2 calls direct)."""
    side = replace(
        thread(1, read=2000, write=6000, notify=10_000, user=4000, tgid=7), sys_cpu_ns=12_000
    )
    app_m = replace(
        thread(2, read=1000, write=1000, notify=30_000, user=5000, tgid=8), sys_cpu_ns=9000
    )
    app_d = replace(
        thread(2, read=1000, write=1000, notify=10_000, user=2000, tgid=8), sys_cpu_ns=4000
    )
    cli_m = replace(thread(3, notify=6000, tgid=9), followed=True)
    cli_d = replace(thread(3, notify=4000, tgid=9), followed=True)
    m = Window(1, side, app_m, client=cli_m)
    d = Window(1, EMPTY_THREAD, app_d, client=cli_d)
    bd = chain_breakdown(m, d)
    wall = mesh_breakdown(m, d)
    assert (bd.read, bd.write, bd.ipc) == (wall.read, wall.write, wall.ipc)
    # the waits (10 of the proxy's, 20 more of the app's) are others' work: not counted
    assert bd.notification == pytest.approx((3000 - 2000) * 2 * 1e-3 / 2)
    assert bd.user == pytest.approx((4000 + 3000) * 1e-3 / 2)
    # kernel CPU 12 + 5 more, less what Read and Write already hold (2 + 6)
    assert bd.kernel_other == pytest.approx((12_000 + 5000 - 8000) * 1e-3 / 2)
    # in all: the on-CPU time added (user 4 + 3, kernel 12 + 5) and the client's change
    assert bd.total() == pytest.approx((4000 + 3000 + 12_000 + 5000) * 1e-3 / 2 + 1.0)


def test_notification_leaves_out_the_wait_behind_the_sidecars_counted_work() -> None:
    """A proxy delivering a large message in several writes (HAProxy, nginx: 16 KB buffers)
    wakes the app on its own CPU with the first; the app then waits for the CPU while the
    proxy writes the rest. Those writes are the proxy's Write already: the app's Notification
    counts only the part of its wait not behind them (the probe's ``notify_behind_ns``). Issue
    #18: tcp-mode HAProxy and nginx profiles over-counted +22 % (64 KB: +34 %) without it."""
    from meshtax.profile.decompose import notify_ns

    # meshed app: 2 wake-ups, 1000 ns of wall time of which 700 behind the sidecar's writes
    app_m = replace(APP_IO_M, notify_behind_ns=700)
    assert notify_ns(app_m) == pytest.approx(300.0)
    assert notify_ns(APP_IO_M) == APP_IO_M.notify.ns  # a reading without it: unchanged
    meshed = Window.of(
        make_reading([WORKER, app_m, APP_SLEEPER], ipc_ns=3000), 1, sidecar_tgid=100, app_tgid=200
    )
    old = Window.of(
        make_reading([WORKER, APP_IO_M, APP_SLEEPER], ipc_ns=3000),
        1,
        sidecar_tgid=100,
        app_tgid=200,
    )
    direct = Window.of(
        make_reading([APP_IO_D, APP_SLEEPER], ipc_ns=0, ipc_count=0),
        2,
        sidecar_tgid=100,
        app_tgid=200,
    )
    assert meshed.app.notify_behind_ns == 700  # Window sums keep it
    bd, before = mesh_breakdown(meshed, direct), mesh_breakdown(old, direct)
    # 700 ns per request = 0.35 µs per crossing less Notification, nothing else moves
    assert before.notification - bd.notification == pytest.approx(0.35)
    assert replace(bd, notification=before.notification) == before
    # a sidecar thread's own behind time (another of its threads' work) leaves it too
    worker = replace(WORKER, notify_behind_ns=2000)
    w2 = Window.of(
        make_reading([worker, app_m, APP_SLEEPER], ipc_ns=3000), 1, sidecar_tgid=100, app_tgid=200
    )
    assert mesh_breakdown(w2, direct).notification == pytest.approx(bd.notification - 1.0)
    # never below zero, and snapshots subtract it like every counter
    assert notify_ns(replace(APP_IO_M, notify_behind_ns=10**6)) == 0.0
    assert (app_m - APP_IO_M).notify_behind_ns == 700
