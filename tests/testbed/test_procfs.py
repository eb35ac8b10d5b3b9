"""What /proc says, read from a fake /proc tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshtax.testbed.procfs import (
    ProcError,
    cpu_cap,
    parse_schedstat,
    parse_vmrss,
    read_rss,
    schedstat,
    worker_cpu_ns,
)


def test_worker_cpu_ns_reads_worker_threads(tmp_path: Path) -> None:
    for tid, comm, ns in (
        (1, "envoy", 500),
        (2, "wrk:worker_0", 7000),
        (3, "wrk:worker_1", 3000),
        (4, "dog:main", 9),
    ):
        d = tmp_path / "77" / "task" / str(tid)
        d.mkdir(parents=True)
        (d / "comm").write_text(comm + "\n")
        (d / "schedstat").write_text(f"{ns} 0 0\n")
    assert worker_cpu_ns(77, tmp_path) == 10000
    (tmp_path / "77" / "task" / "2" / "comm").write_text("memcheck\n")
    (tmp_path / "77" / "task" / "3" / "comm").write_text("memcheck\n")
    assert worker_cpu_ns(77, tmp_path) == 500 + 7000 + 3000 + 9


def test_schedstat_reads_proc_layout(tmp_path: Path) -> None:
    for tid, text in [(10, "123456 789 12\n"), (11, "5 0 1\n")]:
        d = tmp_path / "10" / "task" / str(tid)
        d.mkdir(parents=True)
        (d / "schedstat").write_text(text)
    assert schedstat(10, proc=tmp_path) == {10: 123456, 11: 5}
    with pytest.raises(ProcError, match="no such process 99"):
        schedstat(99, proc=tmp_path)
    with pytest.raises(ProcError, match="unparseable"):
        parse_schedstat("")


def test_schedstat_increases_for_a_busy_process() -> None:
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nend=time.monotonic()+0.6\nwhile time.monotonic()<end: pass",
        ]
    )
    try:
        time.sleep(0.1)
        before = sum(schedstat(p.pid).values())
        time.sleep(0.3)
        after = sum(schedstat(p.pid).values())
        assert after > before > 0
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Name:\tenvoy\nVmPeak:\t  900 kB\nVmRSS:\t   65432 kB\nRssAnon: 1 kB\n", 65432 * 1024),
        ("VmRSS:\t0 kB\n", 0),
    ],
)
def test_parse_vmrss(text: str, expected: int) -> None:
    assert parse_vmrss(text) == expected


@pytest.mark.parametrize("text", ["Name: kthreadd\nState: S\n", "VmRSS: 12 MB\n"])
def test_parse_vmrss_rejects(text: str) -> None:
    with pytest.raises(ProcError):
        parse_vmrss(text)


def test_read_rss_of_this_process() -> None:
    assert read_rss(os.getpid()) > 1_000_000


def test_cpu_cap_reads_the_process_cgroup(tmp_path: Path) -> None:
    """A process in a cgroup with a CPU quota (v1 ``cpu`` or v2 ``cpu.max``) is capped; what
    its children measure waits out the quota (issue #18)."""
    proc, cg = tmp_path / "proc", tmp_path / "cg"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text("3:cpuset:/\n1:cpu:/mtx-bg\n0::/\n")
    v1 = cg / "cpu" / "mtx-bg"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "cpu.cfs_quota_us").write_text("25000\n")
    assert cpu_cap(7, proc, cg) == ("/mtx-bg", 0.25)
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_cap(7, proc, cg) is None
    (proc / "8").mkdir()
    (proc / "8" / "cgroup").write_text("0::/slice/x\n")
    (cg / "slice" / "x").mkdir(parents=True)
    (cg / "slice" / "x" / "cpu.max").write_text("50000 100000\n")
    assert cpu_cap(8, proc, cg) == ("/slice/x", 0.5)
    (cg / "slice" / "x" / "cpu.max").write_text("max 100000\n")
    assert cpu_cap(8, proc, cg) is None
    with pytest.raises(ProcError):
        cpu_cap(9, proc, cg)
