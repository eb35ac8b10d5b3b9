"""perf cpu-clock attribution: symbol table, perf script parsing, sessions."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshtax.testbed.perf import (
    SYMBOL_TABLE,
    Bucket,
    Frame,
    PerfError,
    PerfSession,
    attribute,
    classify_stack,
    classify_symbol,
    parse_perf_script,
    record_argv,
    script_argv,
)
from meshtax.testbed.system import Completed, FakeSystem, RealSystem

FIXTURE = (Path(__file__).parent / "fixtures" / "perf_script.txt").read_text()
LOAD = Path(__file__).parent / "syscall_load.py"

K = 0xFFFFFFFF81000000  # a kernel address
U = 0x7F0000001000  # a user address


def kf(sym: str) -> Frame:
    return Frame(K, sym, "[kernel.kallsyms]")


def uf(sym: str = "main") -> Frame:
    return Frame(U, sym, "/usr/bin/app")


@pytest.mark.parametrize(
    ("sym", "bucket"),
    [
        ("tcp_sendmsg", Bucket.WRITE),
        ("tcp_sendmsg+0x5e", Bucket.WRITE),
        ("tcp_sendmsg_locked", Bucket.WRITE),
        ("sock_write_iter", Bucket.WRITE),
        ("__sys_sendto", Bucket.WRITE),
        ("tcp_recvmsg", Bucket.READ),
        ("tcp_recvmsg_locked.cold", Bucket.READ),
        ("sock_read_iter", Bucket.READ),
        ("ep_poll", Bucket.NOTIFICATION),
        ("ep_poll.isra.0", Bucket.NOTIFICATION),
        ("do_epoll_wait", Bucket.NOTIFICATION),
        ("sock_def_readable", Bucket.NOTIFICATION),
        ("loopback_xmit", Bucket.IPC),
        ("__netif_receive_skb_one_core", Bucket.IPC),  # prefix entry
        ("__netif_receive_skb_core.constprop.0", Bucket.IPC),
        ("ip_rcv", Bucket.IPC),
        ("tcp_v4_rcv", Bucket.IPC),
        ("net_rx_action", Bucket.IPC),
        ("bpf_prog_6deef7357e7b4530_sys_enter", Bucket.PROBE),
        ("finish_task_switch.isra.0", None),
        ("_raw_spin_unlock_irqrestore", None),
        ("tcp_sendmsg_lockedX", None),  # exact entries do not match longer names
        ("[unknown]", None),
    ],
)
def test_classify_symbol(sym: str, bucket: Bucket | None) -> None:
    assert classify_symbol(sym) is bucket


def test_symbol_table_has_no_duplicates() -> None:
    names = [s for s, _ in SYMBOL_TABLE]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    ("frames", "bucket"),
    [
        ((), Bucket.USER),
        ((uf(), uf("start")), Bucket.USER),
        ((kf("tcp_recvmsg_locked"), kf("sock_recvmsg"), uf()), Bucket.READ),
        # loopback RX inside a send: the leaf-most match wins → ipc
        ((kf("memcpy"), kf("tcp_v4_rcv"), kf("ip_rcv"), kf("tcp_sendmsg"), uf()), Bucket.IPC),
        ((kf("_raw_spin_unlock"), kf("sock_def_readable"), kf("tcp_v4_rcv")), Bucket.NOTIFICATION),
        ((kf("bpf_prog_abc_sys_exit"), kf("x64_sys_call"), kf("tcp_sendmsg")), Bucket.PROBE),
        ((kf("pv_native_safe_halt"), kf("do_idle")), Bucket.KERNEL_OTHER),
        # user frames are never searched for kernel symbols
        ((kf("exc_page_fault"), Frame(U, "tcp_sendmsg", "/x")), Bucket.KERNEL_OTHER),
        # an unresolved kernel address still counts as kernel
        ((Frame(K, "[unknown]", "[unknown]"),), Bucket.KERNEL_OTHER),
    ],
)
def test_classify_stack(frames: tuple[Frame, ...], bucket: Bucket) -> None:
    assert classify_stack(frames) is bucket


def test_parse_fixture() -> None:
    samples = list(parse_perf_script(FIXTURE.splitlines()))
    assert [(s.comm, s.pid, s.tid, s.period) for s in samples] == [
        ("python3", 11591, 11591, 1001001),
        ("fortio", 11539, 11541, 1001001),
        ("fortio", 11642, 11644, 1001001),
        ("swapper", 0, 0, 1001001),
    ]
    assert [len(s.frames) for s in samples] == [9, 38, 10, 12]
    assert samples[0].frames[0] == Frame(
        0xFFFFFFFF820123CD, "tcp_recvmsg_locked", "[kernel.kallsyms]"
    )
    assert samples[0].frames[7] == Frame(
        0x10A929, "__libc_recv", "/usr/lib/x86_64-linux-gnu/libc.so.6"
    )
    assert samples[2].frames[1].sym == "runtime.selectnbrecv"
    assert [classify_stack(s.frames) for s in samples] == [
        Bucket.READ,
        Bucket.NOTIFICATION,
        Bucket.USER,
        Bucket.KERNEL_OTHER,
    ]


def test_parse_without_callchains_and_odd_comms() -> None:
    text = (
        "         python3 10306/10306     250000 7fa722293c2a init_cpu_features+0x59a (/lib/ld.so)\n"
        "Thread (pooled) 77/78     250000 ffffffff8201352e tcp_recvmsg+0x6e ([kernel.kallsyms])\n"
    )
    s = list(parse_perf_script(text.splitlines()))
    assert [(x.comm, x.pid, x.tid) for x in s] == [
        ("python3", 10306, 10306),
        ("Thread (pooled)", 77, 78),
    ]
    assert [classify_stack(x.frames) for x in s] == [Bucket.USER, Bucket.READ]


@pytest.mark.parametrize("text", ["garbage line\n", "\tffff81 sym ([kernel.kallsyms])\n"])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(PerfError, match="unexpected perf script line"):
        list(parse_perf_script(text.splitlines()))


def test_attribute_filters_by_pid() -> None:
    samples = list(parse_perf_script(FIXTURE.splitlines()))
    prof = attribute(samples, [11539, 11642], freq=999, duration_s=1.0)
    assert prof.process(11539)[Bucket.NOTIFICATION] == 1001001
    assert prof.process(11642)[Bucket.USER] == 1001001
    assert prof.process(11591) == {b: 0 for b in Bucket}
    assert prof.total()[Bucket.NOTIFICATION] == 1001001
    assert sum(prof.total().values()) == 2 * 1001001
    assert prof.by_thread_ns == {(11539, 11541): 1001001, (11642, 11644): 1001001}
    assert prof.comms == {11539: "fortio", 11642: "fortio"}
    everything = attribute(samples, None, 999, 1.0)
    assert sum(everything.samples.values()) == 4
    assert everything.total([0])[Bucket.KERNEL_OTHER] == 1001001


def test_argv() -> None:
    out = Path("/t/perf.data")
    assert record_argv(out) == [
        "perf",
        "record",
        "-e",
        "cpu-clock",
        "-F",
        "999",
        "-a",
        "-q",
        "-g",
        "-o",
        "/t/perf.data",
    ]
    assert "-g" not in record_argv(out, freq=99, callgraph=False)
    assert script_argv(out) == [
        "perf",
        "script",
        "-i",
        "/t/perf.data",
        "-F",
        "comm,pid,tid,period,ip,sym,dso",
    ]


def test_perf_session_with_fake_system() -> None:
    def respond(argv: tuple[str, ...]) -> Completed | None:
        if argv[:2] == ("perf", "script"):
            return Completed(argv, 0, FIXTURE, "")
        return None

    fs = FakeSystem(responders=[respond])
    sess = PerfSession(fs, freq=499)
    sess.start()
    with pytest.raises(PerfError, match="already"):
        sess.start()
    prof = sess.stop([11591])
    assert prof.process(11591)[Bucket.READ] == 1001001 and prof.freq == 499
    rec, kill, script = fs.calls
    assert rec[:2] == ("perf", "record") and "499" in rec
    assert kill == ("kill", "-s", "INT", str(fs.processes[0].pid))
    assert script[:2] == ("perf", "script")
    with pytest.raises(PerfError, match="not recording"):
        sess.stop(None)


# --- real (root) -----------------------------------------------------------------------------


@pytest.mark.root
def test_perf_busy_loop_is_mostly_user() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (system-wide perf)")
    if shutil.which("perf") is None:
        pytest.skip("perf not installed (linux-perf)")
    p = subprocess.Popen(
        [sys.executable, str(LOAD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert p.stdin is not None and p.stdout is not None
    try:
        assert p.stdout.readline().strip() == "ready"
        sess = PerfSession(RealSystem(), freq=499, callgraph=True)
        sess.start()
        try:
            time.sleep(0.3)  # perf needs a moment to open its events
            p.stdin.write("spin 1.0\n")
            p.stdin.flush()
            assert p.stdout.readline().startswith("done")
            prof = sess.stop([p.pid])
        finally:
            sess.close()
        got = prof.process(p.pid)
        n = sum(prof.samples.get((p.pid, b), 0) for b in Bucket)
        # the loop gets as much CPU as a shared 2-core machine gives it: ask only for enough
        # samples that the user share below means something
        assert n >= 20, f"too few samples of the busy loop: {n}"
        assert got[Bucket.USER] >= 0.8 * sum(got.values()), got
    finally:
        p.stdin.close()
        p.wait(5)
        p.stdout.close()
