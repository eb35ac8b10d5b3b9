"""Run registry, lock and reaper."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshtax.testbed.runstate import (
    FakeProcOps,
    ProcRecord,
    RealProcOps,
    Registry,
    RunBusy,
    RunLock,
    RunState,
    cleanup_stale,
    list_netns,
    load_states,
    parse_stat_start_time,
    reap,
)
from meshtax.testbed.system import Completed, FakeSystem


def FakeProcs(table: dict[int, int], netns_of: dict[int, str] | None = None) -> FakeProcOps:
    return FakeProcOps(dict(table), netns_of or {})


def ip_answers(netns: list[str], pids: dict[str, list[int]]) -> FakeSystem:
    def answer(argv: tuple[str, ...]) -> Completed | None:
        if argv == ("ip", "netns", "list"):
            return Completed(argv, 0, "".join(f"{n} (id: {i})\n" for i, n in enumerate(netns)), "")
        if argv[:3] == ("ip", "netns", "pids"):
            return Completed(argv, 0, "".join(f"{p}\n" for p in pids.get(argv[3], [])), "")
        if argv[:3] == ("ip", "netns", "del"):
            netns.remove(argv[3])
            return Completed(argv, 0, "", "")
        return None

    return FakeSystem(responders=[answer])


def test_parse_stat_start_time_with_awkward_comm() -> None:
    fields = " ".join(str(i) for i in range(3, 53))  # field n has value n
    assert parse_stat_start_time(f"123 (a) b (c)) {fields}") == 22


def test_real_start_time_of_self_is_stable() -> None:
    ops = RealProcOps()
    st = ops.start_time(os.getpid())
    assert st is not None and st == ops.start_time(os.getpid())
    assert ops.start_time(2**22 + 12345) is None  # above pid_max's default range


def test_state_roundtrip_and_registry(tmp_path: Path) -> None:
    st = RunState("r1", 10, 99, created=5.0)
    reg = Registry(tmp_path, st, tmp_path / "index")
    reg.add_netns("mtx-r1-a")
    reg.add_process(ProcRecord(11, 100, ["sleep", "1"], "mtx-r1-a"))
    reg.add_dir(tmp_path / "scratch")
    [(path, loaded)] = load_states(tmp_path)
    assert path == tmp_path / "r1.json" and loaded == st
    (tmp_path / "junk.json").write_text("{not json")
    assert [s for _, s in load_states(tmp_path)] == [None, st]
    reg.remove()
    assert not path.exists()


def test_lock_is_exclusive_and_names_holder(tmp_path: Path) -> None:
    a, b = RunLock(tmp_path), RunLock(tmp_path)
    a.acquire()
    with pytest.raises(RunBusy, match=f"PID {os.getpid()}") as e:
        b.acquire(timeout=0.2)
    assert e.value.holder_pid == os.getpid()
    a.release()
    b.acquire()
    assert b.held
    b.release()


def test_lock_holder_in_another_process(tmp_path: Path) -> None:
    code = (
        "import sys, time; from pathlib import Path; from meshtax.testbed.runstate import RunLock;"
        f"RunLock(Path({str(tmp_path)!r})).acquire(); print('held', flush=True); time.sleep(30)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with pytest.raises(RunBusy, match=f"PID {holder.pid}"):
            RunLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
    # the kernel drops the flock with the process
    lock = RunLock(tmp_path)
    lock.acquire(timeout=5)
    lock.release()


def test_reap_dead_runs_orphans_and_reused_pids(tmp_path: Path) -> None:
    # dead run: owner 10 gone; its process 11 alive with the recorded start; its process 12's
    # PID was reused by another program (start differs) and must not be touched
    idx = tmp_path / "index"
    dead_dir, live_dir = tmp_path / "scratch-dead", tmp_path / "scratch-live"
    for d in (dead_dir, live_dir):
        (d / "tcp").mkdir(parents=True)
    Registry(
        tmp_path,
        RunState(
            "dead",
            10,
            1000,
            ["mtx-dead-bridge", "mtx-dead-a"],
            [ProcRecord(11, 1100, ["envoy"]), ProcRecord(12, 1200, ["fortio"])],
            dirs=[str(dead_dir)],
        ),
        idx,
    ).save()
    # live run: owner 20 alive with matching start; nothing of it may be touched
    Registry(
        tmp_path,
        RunState(
            "live",
            20,
            2000,
            ["mtx-live-a"],
            [ProcRecord(21, 2100, ["envoy"])],
            dirs=[str(live_dir)],
        ),
        idx,
    ).save()
    netns = ["mtx-dead-bridge", "mtx-dead-a", "mtx-live-a", "mtx-orphan-x", "someone-else"]
    procs = FakeProcs(
        {11: 1100, 12: 9999, 20: 2000, 21: 2100, 31: 3100, 41: 4100},
        netns_of={31: "mtx-dead-a", 41: "mtx-orphan-x"},
    )
    sysm = ip_answers(netns, {"mtx-dead-a": [31], "mtx-orphan-x": [41]})
    rep = reap(sysm, procs, tmp_path, index_dir=idx, tmp_dir=tmp_path / "tmp")
    assert rep.runs == ["dead"]
    assert rep.dirs == [str(dead_dir)] and not dead_dir.exists() and live_dir.exists()
    assert rep.netns == ["mtx-dead-a", "mtx-dead-bridge", "mtx-orphan-x"]
    assert sorted(rep.processes) == [11, 31, 41]
    assert sorted(procs.terminated) == [11, 31, 41]
    assert netns == ["mtx-live-a", "someone-else"]
    assert [s.run_id for _, s in load_states(tmp_path) if s] == ["live"]
    assert [s.run_id for _, s in load_states(idx) if s] == [
        "live"
    ]  # the dead run left the index too


def test_reap_spares_live_runs_of_other_state_dirs(tmp_path: Path) -> None:
    # a run registered under another state dir (tests, validation) is alive: a reaper of this
    # state dir must not take its namespaces for orphans; once its owner is dead, it may
    idx, mine, other = tmp_path / "index", tmp_path / "mine", tmp_path / "other"
    Registry(other, RunState("else", 20, 2000, ["mtx-else-a"]), idx).save()
    netns = ["mtx-else-a", "mtx-orphan-x"]
    rep = reap(ip_answers(netns, {}), FakeProcs({20: 2000}), mine, index_dir=idx, tmp_dir=mine)
    assert rep.netns == ["mtx-orphan-x"] and netns == ["mtx-else-a"]
    rep = reap(ip_answers(netns, {}), FakeProcs({}), mine, index_dir=idx, tmp_dir=mine)
    assert rep.netns == ["mtx-else-a"] and netns == []


def test_reap_keeps_named_runs_and_drops_corrupt_files(tmp_path: Path) -> None:
    Registry(tmp_path, RunState("mine", 10, None, ["mtx-mine-a"]), tmp_path / "index").save()
    (tmp_path / "broken.json").write_text("")
    netns = ["mtx-mine-a"]
    rep = reap(
        ip_answers(netns, {}),
        FakeProcs({}),
        tmp_path,
        keep_runs=["mine"],
        index_dir=tmp_path / "index",
        tmp_dir=tmp_path,
    )
    assert not rep and netns == ["mtx-mine-a"]
    assert not (tmp_path / "broken.json").exists()


def test_list_netns_parses_both_formats() -> None:
    sysm = ip_answers(["a", "b"], {})
    assert list_netns(sysm) == ["a", "b"]


def test_real_terminate_checks_start_time() -> None:
    ops = RealProcOps()
    p = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        start = ops.start_time(p.pid)
        assert start is not None
        assert not ops.terminate(p.pid, start + 1, timeout=0.5)  # "reused PID": untouched
        time.sleep(0.05)
        assert p.poll() is None
        assert not ops.terminate(p.pid, start, netns="mtx-no-such-ns", timeout=0.5)
        assert p.poll() is None
        assert ops.terminate(p.pid, start, timeout=2)
        assert p.wait(2) == -15
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_cleanup_stale_takes_the_lock(tmp_path: Path) -> None:
    Registry(tmp_path, RunState("dead", 10, 1000, ["mtx-dead-a"]), tmp_path / "index").save()
    netns = ["mtx-dead-a"]
    held = RunLock(tmp_path)
    held.acquire()
    with pytest.raises(RunBusy):
        cleanup_stale(ip_answers(netns, {}), FakeProcs({}), tmp_path)
    assert netns == ["mtx-dead-a"]  # nothing touched while another run holds the lock
    held.release()
    rep = cleanup_stale(ip_answers(netns, {}), FakeProcs({}), tmp_path)
    assert rep.runs == ["dead"] and netns == []
