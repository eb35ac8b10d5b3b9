"""The sidecar eBPF probe: parsing (fixture), sessions (fake loader), and the real probe as root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from meshtax.testbed.probes import (
    FakeProbe,
    Histogram,
    IpcStat,
    OpStat,
    ProbeError,
    ProbeReading,
    RealProbe,
    SnapshotSession,
    parse_reading,
    realtime,
)
from meshtax.testbed.system import Completed, FakeSystem, RealSystem

FIXTURES = Path(__file__).parent / "fixtures"
READING = (FIXTURES / "sidecar_reading.json").read_text()
ROOT = Path(__file__).resolve().parents[2]
LOAD = Path(__file__).parent / "syscall_load.py"


# --- parsing -------------------------------------------------------------------------------


def test_parse_fixture_threads_and_totals() -> None:
    r = parse_reading(READING)
    assert r.pids == (8526,)
    assert [t.tid for t in r.threads] == [8526, 8627]  # sorted by tid
    writer = r.threads[1]
    assert (writer.comm, writer.tgid) == ("python3", 8526)
    assert writer.write == OpStat(count=1000, ns=7782845, bytes=100000, errors=0)
    assert writer.oncpu_ns == writer.user_ns + writer.sys_cpu_ns + writer.unknown_cpu_ns
    main = r.threads[0]
    assert main.notify.count == 1000 and main.epoll.count == 1000
    assert r.total.write == OpStat(1004, 7803076, 100012, 0)
    assert r.total.write == main.write + writer.write


def test_parse_fixture_ipc_counters_programs() -> None:
    r = parse_reading(READING)
    assert r.ipc.method == "net_dev_queue(lo)->netif_receive_skb(lo)"
    assert (r.ipc.count, r.ipc.ns, r.ipc.bytes, r.ipc.max_ns) == (2006, 2365256, 204328, 14452)
    assert r.counters["exit_unmatched"] == 4
    assert r.dropped == 0  # exit_unmatched is expected at attach, not a loss
    assert [p.name for p in r.programs] == [
        "sys_enter",
        "sys_exit",
        "sched_switch",
        "sched_wakeup",
        "net_dev_queue",
        "netif_receive_skb",
    ]
    assert r.probe_ns == sum(p.run_time_ns for p in r.programs) > 0
    assert r.stats_enabled  # the fixture was recorded with -s


def test_process_sum_and_components() -> None:
    r = parse_reading(READING)
    p = r.process(8526)
    assert (p.tid, p.tgid) == (0, 8526)
    assert p.write == r.total.write and p.user_ns == r.total.user_ns
    c = r.components()
    assert set(c) == {"read", "write", "notification", "ipc", "user"}
    assert c["notification"] == r.total.notify
    assert c["ipc"].count == 2006 and c["user"].ns == r.total.user_ns
    assert c["write"].mean_ns == pytest.approx(7803076 / 1004)
    assert OpStat().mean_ns == 0.0


def test_dropped_counts_map_full_and_recursion_misses() -> None:
    d = json.loads(READING)
    d["counters"]["thread_map_full"] = 3
    d["programs"][3]["recursion_misses"] = 2
    assert parse_reading(json.dumps(d)).dropped == 5


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "unparseable"),
        (READING[:300], "unparseable"),
        (json.dumps({**json.loads(READING), "version": 2}), "version=2"),
        (json.dumps({**json.loads(READING), "tool": "other"}), "tool='other'"),
        (json.dumps({k: v for k, v in json.loads(READING).items() if k != "ipc"}), "ipc"),
        ("[1, 2]", "unparseable"),
    ],
)
def test_parse_rejects(text: str, match: str) -> None:
    with pytest.raises(ProbeError, match=match):
        parse_reading(text)


# --- sessions without root -------------------------------------------------------------------


def test_fake_probe_scripted_readings() -> None:
    r = parse_reading(READING)
    fake = FakeProbe([r, r])
    with pytest.raises(ProbeError, match="not started"):
        fake.stop()
    fake.start([1, 2])
    with pytest.raises(ProbeError, match="already running"):
        fake.start([3])
    assert fake.stop() is r
    fake.start([3])
    fake.close()
    assert not fake.running
    fake.start([4])
    assert fake.stop() is r
    fake.start([5])
    with pytest.raises(ProbeError, match="no more"):
        fake.stop()
    assert fake.started == [(1, 2), (3,), (4,), (5,)]
    assert fake.followed == [None, None, None, None]
    fake.close()
    fake.readings.append(r)
    fake.start([6], follow_netns="/run/netns/c")
    assert fake.followed[-1] == "/run/netns/c"


def test_parse_followed_threads_and_namespace() -> None:
    d = json.loads(READING)
    d["follow_netns"] = 4026532392
    for t in d["threads"]:
        t["followed"] = int(t["tid"] == 8627)
    r = parse_reading(json.dumps(d))
    assert r.follow_netns == 4026532392
    assert [t.followed for t in r.threads] == [False, True]
    # a sum is followed only if every part is
    assert not (r.threads[0] + r.threads[1]).followed
    assert (r.threads[1] + r.threads[1]).followed
    # readings of loaders that predate -f parse as "nothing followed"
    old = parse_reading(READING)
    assert old.follow_netns == 0 and not any(t.followed for t in old.threads)


def test_real_probe_argv() -> None:
    p = RealProbe(FakeSystem(), binary=Path("/x/sidecar"))
    assert p.argv([12, 34]) == ["/x/sidecar", "-p", "12,34"]
    assert p.argv([12], "/run/netns/c") == ["/x/sidecar", "-p", "12", "-f", "/run/netns/c"]
    assert RealProbe(FakeSystem(), binary=Path("/x/sidecar"), all_netns=True).argv([5]) == [
        "/x/sidecar",
        "-p",
        "5",
        "-a",
    ]
    assert RealProbe(FakeSystem(), binary=Path("/x/sidecar"), run_stats=True).argv([5]) == [
        "/x/sidecar",
        "-p",
        "5",
        "-s",
    ]
    with pytest.raises(ValueError):
        p.argv([])


def _fake_loader(tmp_path: Path, body: str) -> Path:
    """An executable that speaks the loader's protocol (stderr ready mark, SIGINT → JSON)."""
    path = tmp_path / "fake-sidecar"
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def test_real_probe_session_against_fake_loader(tmp_path: Path) -> None:
    (tmp_path / "reading.json").write_text(READING)
    loader = _fake_loader(
        tmp_path,
        f"""
        import signal, sys, time
        stop = []
        signal.signal(signal.SIGINT, lambda *a: stop.append(1))
        open({str(tmp_path / "argv")!r}, "w").write(" ".join(sys.argv[1:]))
        print("sidecar: ready (6 programs)", file=sys.stderr, flush=True)
        while not stop:
            time.sleep(0.01)
        sys.stdout.write(open({str(tmp_path / "reading.json")!r}).read())
        """,
    )
    probe = RealProbe(RealSystem(), binary=loader)
    probe.start([8526, 8627])
    reading = probe.stop()
    assert reading == parse_reading(READING)
    assert (tmp_path / "argv").read_text() == "-p 8526,8627"
    with pytest.raises(ProbeError, match="not started"):
        probe.stop()


def test_real_probe_snapshots_against_fake_loader(tmp_path: Path) -> None:
    """SIGUSR1 → one line with the totals so far; stop → the last line after snapshots."""
    one_line = json.dumps(json.loads(READING))
    loader = _fake_loader(
        tmp_path,
        f"""
        import json, signal, sys, time
        stop, dumps = [], []
        signal.signal(signal.SIGINT, lambda *a: stop.append(1))
        signal.signal(signal.SIGUSR1, lambda *a: dumps.append(1))
        base = json.loads({one_line!r})
        print("sidecar: ready (6 programs)", file=sys.stderr, flush=True)
        def emit(k):
            d = dict(base, duration_ns=k)
            print(json.dumps(d), flush=True)
        k = 0
        while not stop:
            if dumps:
                dumps.pop()
                k += 1
                emit(k)
            time.sleep(0.005)
        emit(99)
        """,
    )
    probe = RealProbe(RealSystem(), binary=loader)
    probe.start([8526])
    try:
        assert probe.snapshot().duration_ns == 1
        assert probe.snapshot().duration_ns == 2
        assert probe.stop().duration_ns == 99
    finally:
        probe.close()


def test_histogram_sums_trims_and_quantiles() -> None:
    # bins of 1024 ns: 3 events in bin 2 (2500 ns each), 1 in bin 10 (10500 ns)
    h = Histogram(((2, 3, 7500), (10, 1, 10500)), shift=10)
    assert (h.count, h.ns) == (4, 18000)
    assert h.trimmed_mean_ns(0.0) == pytest.approx(4500.0)  # the plain mean
    assert h.trimmed_mean_ns(0.25) == pytest.approx(2500.0)  # the slowest event dropped
    # a cut inside a bin takes that bin's mean: keep 3.5 of 4 → (7500 + 0.5 × 10500) / 3.5
    assert h.trimmed_mean_ns(0.125) == pytest.approx((7500 + 5250) / 3.5)
    assert h.quantile_ns(0.5) == pytest.approx((2 + 2 / 3) * 1024)
    assert Histogram().trimmed_mean_ns(0.1) == 0.0
    with pytest.raises(ValueError, match="trim"):
        h.trimmed_mean_ns(1.0)
    # windows add and subtract bin by bin; a bin that empties disappears
    g = Histogram(((2, 1, 2000), (5, 2, 11000)), shift=10)
    assert (h + g).bins == ((2, 4, 9500), (5, 2, 11000), (10, 1, 10500))
    assert (h + g) - g == h
    assert Histogram() + h == h and h - Histogram() == h
    with pytest.raises(ValueError, match="bin widths"):
        h + Histogram(((1, 1, 1),), shift=9)


def test_parse_notify_histogram_optional() -> None:
    d = json.loads(READING)
    assert all(t.notify_hist == Histogram() for t in parse_reading(READING).threads)  # older loader
    d["threads"][0]["notify_hist"] = [[3, 2, 7000], [40, 1, 41500]]
    d["threads"][0]["notify_hist_shift"] = 10
    r = parse_reading(json.dumps(d))
    t = next(t for t in r.threads if t.tid == d["threads"][0]["tid"])
    assert t.notify_hist == Histogram(((3, 2, 7000), (40, 1, 41500)), 10)
    # a window between snapshots has the histogram of its events only
    grown = replace(t, notify_hist=t.notify_hist + Histogram(((3, 1, 3100),), 10))
    assert (grown - t).notify_hist.bins == ((3, 1, 3100),)


def test_since_is_the_window_between_snapshots() -> None:
    r = parse_reading(READING)
    writer = r.threads[1]
    grown = replace(
        writer,
        write=writer.write + OpStat(10, 5000, 1000, 0),
        user_ns=writer.user_ns + 700,
        syscalls=writer.syscalls + 10,
    )
    newcomer = replace(writer, tid=9999, followed=True)
    later = replace(
        r,
        threads=(r.threads[0], grown, newcomer),
        duration_ns=r.duration_ns + 500,
        ipc=IpcStat(r.ipc.method, r.ipc.count + 3, r.ipc.ns + 300, r.ipc.bytes + 30, 7),
        counters={**r.counters, "exit_unmatched": r.counters["exit_unmatched"] + 1},
    )
    w = later.since(r)
    assert w.duration_ns == 500
    by_tid = {t.tid: t for t in w.threads}
    assert by_tid[8526].write == OpStat() and by_tid[8526].user_ns == 0  # idle in the window
    assert by_tid[8627].write == OpStat(10, 5000, 1000, 0) and by_tid[8627].user_ns == 700
    assert by_tid[9999] == newcomer  # new in the window: whole
    assert w.total.write == OpStat(10, 5000, 1000, 0) + newcomer.write
    assert (w.ipc.count, w.ipc.ns, w.ipc.bytes, w.ipc.max_ns) == (3, 300, 30, 7)
    assert w.counters["exit_unmatched"] == 1 and w.counters["thread_map_full"] == 0
    assert all(p.run_cnt == 0 for p in w.programs)
    assert r.since(r).total.write == OpStat()


def test_fake_probe_snapshot_stays_started() -> None:
    r = parse_reading(READING)
    fake = FakeProbe([r, r])
    assert isinstance(fake, SnapshotSession)
    with pytest.raises(ProbeError, match="not started"):
        fake.snapshot()
    fake.start([1])
    assert fake.snapshot() is r and fake.running
    assert fake.stop() is r


def test_real_probe_reports_loader_failure(tmp_path: Path) -> None:
    loader = _fake_loader(
        tmp_path,
        """
        import sys
        print("sidecar: failed to attach sched_switch (tracepoint/sched/sched_switch): EPERM",
              file=sys.stderr)
        sys.exit(1)
        """,
    )
    probe = RealProbe(RealSystem(), binary=loader)
    with pytest.raises(ProbeError, match="before attaching: .*failed to attach sched_switch"):
        probe.start([1])
    probe.close()  # idempotent after a failed start


# --- the real probe (root) -------------------------------------------------------------------


def _build_probe() -> Path:
    if os.geteuid() != 0:
        pytest.skip("needs root (BPF)")
    missing = [t for t in ("clang", "bpftool", "make", "cc") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"cannot build the probe: {', '.join(missing)} not installed")
    if not Path("/sys/kernel/btf/vmlinux").is_file():
        pytest.skip("kernel has no BTF (/sys/kernel/btf/vmlinux)")
    if not Path("/usr/include/bpf/libbpf.h").is_file():
        pytest.skip("libbpf-dev not installed")
    done = subprocess.run(["make", "-s", "-C", str(ROOT / "bpf")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return ROOT / "bpf" / ".output" / "sidecar"


class Load:
    """The syscall-load child, driven over stdin/stdout."""

    def __init__(self) -> None:
        self.p = subprocess.Popen(
            [sys.executable, str(LOAD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.ask_line() == "ready"

    def ask_line(self) -> str:
        assert self.p.stdout is not None
        return self.p.stdout.readline().strip()

    def ask(self, cmd: str) -> str:
        assert self.p.stdin is not None
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        answer = self.ask_line()
        assert answer.startswith("done"), answer
        return answer

    def close(self) -> None:
        if self.p.stdin is not None:
            self.p.stdin.close()
        try:
            self.p.wait(5)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        if self.p.stdout is not None:
            self.p.stdout.close()


@pytest.fixture
def load() -> Iterator[Load]:
    ld = Load()
    try:
        yield ld
    finally:
        ld.close()


@pytest.mark.root
def test_real_probe_counts_a_known_syscall_load(load: Load) -> None:
    binary = _build_probe()
    n_sock, n_pipe = 300, 1000
    probe = RealProbe(RealSystem(), binary=binary)
    probe.start([load.p.pid])
    try:
        load.ask(f"sock {n_sock}")
        load.ask(f"pipe {n_pipe}")
        reading: ProbeReading = probe.stop()
    finally:
        probe.close()
    t = reading.process(load.p.pid)
    assert reading.pids == (load.p.pid,)
    assert len(reading.threads) >= 2  # main + the writer thread
    assert t.write.count >= n_sock + n_pipe
    assert t.write.bytes >= n_sock * 100 + n_pipe
    assert t.read.count >= n_pipe + 1  # recv may coalesce the socket messages
    assert t.read.bytes >= n_sock * 100 + n_pipe
    assert 1 <= t.notify.count <= t.epoll.count
    assert 0 < t.notify.ns
    # the per-event histogram holds every notification, to the ns
    assert (t.notify_hist.count, t.notify_hist.ns) == (t.notify.count, t.notify.ns)
    # TCP_NODELAY: every send is one data skb on lo (plus ACKs)
    assert reading.ipc.count >= n_sock
    assert reading.ipc.bytes >= n_sock * 100
    assert t.user_ns > 0 and t.sys_cpu_ns > 0
    assert t.oncpu_ns == t.user_ns + t.sys_cpu_ns + t.unknown_cpu_ns
    assert reading.counters["thread_map_full"] == 0
    assert reading.counters["skb_map_full"] == 0
    assert {p.name for p in reading.programs} >= {"sys_enter", "sys_exit", "sched_switch"}


@pytest.mark.root
def test_real_probe_times_unix_socket_delivery_and_zero_copy_completions(load: Load) -> None:
    binary = _build_probe()
    n_unix, n_zc = 300, 100
    probe = RealProbe(RealSystem(), binary=binary)
    probe.start([load.p.pid])
    try:
        load.ask(f"unix {n_unix}")
        reaped = int(load.ask(f"zerocopy {n_zc}").split()[1])
        reading: ProbeReading = probe.stop()
    finally:
        probe.close()
    t = reading.process(load.p.pid)
    assert reading.ipc.sock_method.startswith("sk_data_ready->sock_send_length")
    # every Unix send woke the reader from epoll and is timed once, with its bytes; the TCP
    # sends of the zero-copy part are not Unix deliveries
    assert t.sock_ipc.count == n_unix and t.sock_ipc.bytes == n_unix * 100
    assert 0 < t.sock_ipc.ns < t.write.ns
    # every completion reaped from the error queue, apart from Read; none of it lost
    assert reaped > 0 and t.errqueue.count == n_zc and t.errqueue.errors == n_zc - reaped
    assert t.read.bytes >= n_unix * 100 + n_zc * 4096 and t.errqueue.bytes == 0


@pytest.mark.root
def test_real_probe_fails_clearly_for_missing_pid() -> None:
    binary = _build_probe()
    probe = RealProbe(RealSystem(), binary=binary)
    # PID 2**22+1 is above PID_MAX_LIMIT, so it never exists
    with pytest.raises(ProbeError, match="4194305"):
        probe.start([2**22 + 1])


@pytest.mark.root
def test_real_probe_follows_a_namespace_and_reads_a_later_client(load: Load) -> None:
    """A process started in the followed namespace *after* the probe attached (as fortio's
    client is, once per window) is tracked: non-zero write time, marked followed."""
    binary = _build_probe()
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (ip) not installed")
    ns = f"mtxtest-follow-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        probe = RealProbe(RealSystem(), binary=binary)
        probe.start([load.p.pid], follow_netns=f"/run/netns/{ns}")
        try:
            before = probe.snapshot()
            client = subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "dd",
                    "if=/dev/zero",
                    "of=/dev/null",
                    "bs=1",
                    "count=2000",
                ],
                capture_output=True,
                check=True,
            )
            assert client.returncode == 0
            reading = probe.snapshot().since(before)
            final = probe.stop()
        finally:
            probe.close()
    finally:
        subprocess.run(["ip", "netns", "delete", ns], check=True)
    followed = [t for t in reading.threads if t.followed]
    assert reading.follow_netns > 0
    assert followed and all(t.tgid != load.p.pid for t in followed)
    writes = sum(t.write.count for t in followed)
    assert writes >= 2000 and sum(t.write.ns for t in followed) > 0
    assert sum(t.read.count for t in followed) >= 2000
    # the PID target is still tracked normally and never marked followed
    assert all(not t.followed for t in reading.threads if t.tgid == load.p.pid)
    # nothing ran in the namespace before the first snapshot; the final reading has it all
    assert not any(t.followed for t in before.threads)
    assert sum(t.write.count for t in final.threads if t.followed) >= writes


# --- real-time probe windows ------------------------------------------------------------------


def test_realtime_sets_and_restores_every_pid() -> None:
    sys_ = FakeSystem()
    with realtime(sys_, {11: 3, 22: 4}) as on:
        assert on
        assert sys_.calls == [
            ("chrt", "-f", "-a", "-p", "3", "11"),
            ("chrt", "-f", "-a", "-p", "4", "22"),
        ]
        sys_.calls.clear()
    assert sys_.calls == [
        ("chrt", "-o", "-a", "-p", "0", "22"),
        ("chrt", "-o", "-a", "-p", "0", "11"),
    ]
    # restored on an exception too
    sys_.calls.clear()
    with pytest.raises(KeyError), realtime(sys_, {11: 1}):
        raise KeyError("x")
    assert sys_.calls[-1] == ("chrt", "-o", "-a", "-p", "0", "11")
    # off: nothing runs
    none = FakeSystem()
    with realtime(none, {}) as on:
        assert not on
    assert none.calls == []


def test_realtime_is_all_or_nothing() -> None:
    def refuse_22(argv: tuple[str, ...]) -> Completed | None:
        return (
            Completed(argv, 1, "", "EPERM")
            if argv[:2] == ("chrt", "-f") and argv[-1] == "22"
            else None
        )

    sys_ = FakeSystem(responders=[refuse_22])
    with realtime(sys_, {11: 1, 22: 1, 33: 1}) as on:
        assert not on
        # 11 was set, then put back before the block ran; 33 was never tried
        assert sys_.calls == [
            ("chrt", "-f", "-a", "-p", "1", "11"),
            ("chrt", "-f", "-a", "-p", "1", "22"),
            ("chrt", "-o", "-a", "-p", "0", "11"),
        ]
    assert len(sys_.calls) == 3  # nothing more to restore


_BEHIND = textwrap.dedent(
    """
    # a "proxy" and an "app" on one CPU: the proxy writes 4 chunks a burst over loopback TCP
    # with user-space work after each; the app sleeps in epoll and drains them
    import os, select, socket, sys, time
    os.sched_setaffinity(0, {0})
    ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)
    port = ls.getsockname()[1]
    go_r, go_w = os.pipe()
    app = os.fork()
    if app == 0:
        c = socket.create_connection(("127.0.0.1", port)); c.setblocking(False)
        ep = select.epoll(); ep.register(c.fileno(), select.EPOLLIN)
        while True:
            ep.poll()
            try:
                while True:
                    if not c.recv(1 << 20):
                        os._exit(0)
            except BlockingIOError:
                pass
    s, _ = ls.accept()
    print(os.getpid(), app, flush=True)
    sys.stdin.readline()  # the probe is attached
    for _ in range(200):
        for _ in range(4):
            s.sendall(b"x" * 16384)
            t = time.perf_counter()
            while time.perf_counter() - t < 20e-6:
                pass
        time.sleep(0.002)
    s.close(); os.waitpid(app, 0)
    print("done", flush=True)
    """
)


@pytest.mark.root
@pytest.mark.parametrize("proxy_first", [True, False])
def test_real_probe_times_the_wait_behind_the_watched_proxy(proxy_first: bool) -> None:
    """``notify_behind_ns``: the part of a thread's wake-up → epoll return spent while the
    probe's first PID (the watched proxy) worked on that CPU outside epoll — here the app
    woken by the proxy's first chunk of a burst. When the first PID is someone else, none."""
    binary = _build_probe()
    p = subprocess.Popen(
        [sys.executable, "-c", _BEHIND], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert p.stdin is not None and p.stdout is not None
    proxy, app = (int(x) for x in p.stdout.readline().split())
    idle = subprocess.Popen(["sleep", "60"])
    probe = RealProbe(RealSystem(), binary=binary)
    try:
        probe.start([proxy, app] if proxy_first else [idle.pid, proxy, app])
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "done"
        reading: ProbeReading = probe.stop()
    finally:
        probe.close()
        idle.kill()
        idle.wait()
        p.wait(10)
        p.stdin.close()
        p.stdout.close()
    a = reading.process(app)
    assert a.notify.count >= 200
    assert 0 <= a.notify_behind_ns <= a.notify.ns
    if proxy_first:
        assert a.notify_behind_ns > 0
    else:
        assert a.notify_behind_ns == 0
