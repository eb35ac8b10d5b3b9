"""``meshtax profile`` as a real subprocess (root): nothing is left behind after a success,
after Ctrl-C (SIGINT), and after SIGKILL once the next run has started (it reaps).

"Left behind" means: a network namespace of the run (``mtx-*``; the iptables rules live in
the pod namespaces and go with them) or a process that ran inside one. Each run is tiny
(TCP, 100 B, 0.2 s runs) so the file stays well under half a minute.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshtax.testbed import tools
from meshtax.testbed.runstate import STATE_DIR, RealProcOps, RunBusy, RunLock, load_states
from tests.helpers import default_sigint, missing_for_real_profile

# one low rate, and gRPC carried through the tcp sidecar (the preset's default) at 100 B
ARGS = [
    "profile",
    "--modes",
    "tcp",
    "--sizes",
    "100",
    "--duration",
    "0.2",
    "--low-rates",
    "200",
    "--replace",
]
BUSY = "another meshtax profiling run holds"


def _missing() -> str | None:
    if not Path(sys.executable).with_name("meshtax").exists():
        return "meshtax console script not installed next to the interpreter"
    return missing_for_real_profile()


pytestmark = [pytest.mark.root, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]


def _netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith("mtx-")}


def _pids_in(ns: str) -> set[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return {int(t) for t in out.split() if t.isdigit()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose (its parent, maybe the killed CLI's, has not waited)
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _wait_lock_free(timeout: float = 600.0) -> None:
    """Other engineers' profiling runs share the machine-wide lock: wait for a gap."""
    lock = RunLock(STATE_DIR)
    try:
        lock.acquire(timeout)
    except RunBusy as e:
        pytest.skip(f"the profiling lock stayed busy: {e}")
    lock.release()


class Cli:
    """One ``meshtax profile`` subprocess and the namespaces/processes it created."""

    def __init__(self, db: Path, name: str) -> None:
        _wait_lock_free()
        self.before = _netns()
        env = {**os.environ, "MESHTAX_DB": str(db)}
        exe = str(Path(sys.executable).with_name("meshtax"))
        self.proc = subprocess.Popen(
            [exe, *ARGS, "--name", name],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=default_sigint,
        )
        self.netns: set[str] = set()
        self.pids: set[int] = set()
        self.probes: set[int] = set()  # probe loaders seen (a subset of pids)
        self.dirs: set[str] = set()

    def watch(self) -> None:
        # only the namespaces this CLI's run registered: between their cases other runs (a
        # validation, another engineer's profile) create mtx-* namespaces too, and deleting
        # those in force_cleanup killed their processes
        states = [
            st
            for _, st in load_states(STATE_DIR)
            if st is not None and st.owner_pid == self.proc.pid
        ]
        mine = {ns for st in states for ns in st.netns}
        self.dirs |= {d for st in states for d in st.dirs}
        # every scratch directory the run owns, recorded or not (named after its owner)
        self.dirs |= {
            str(d) for d in Path(tempfile.gettempdir()).glob(f"meshtax-*.{self.proc.pid}.*")
        }
        for ns in (_netns() - self.before) & mine:
            self.netns.add(ns)
            self.pids |= _pids_in(ns)
        # processes outside the pods (the probe loader, perf) carry the run's tag
        for st in states:
            for pid in RealProcOps().tagged(st.run_id):
                self.pids.add(pid)
                if _cmdline(pid).startswith(str(tools.INSTALLED["probe"][0])):
                    self.probes.add(pid)

    def wait_until_measuring(self, timeout: float = 60.0) -> None:
        """Until the server pod runs the app and the sidecar (≥ 2 processes in a pod)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.watch()
            if any(ns.endswith("-server") and len(_pids_in(ns)) >= 2 for ns in self.netns):
                time.sleep(0.3)  # into the first load runs
                self.watch()
                return
            if self.proc.poll() is not None:
                code, out = self.finish(timeout=5)
                if BUSY in out:
                    raise Busy(out)
                pytest.fail(f"meshtax profile ended early ({code}): {out[-2000:]}")
            time.sleep(0.05)
        pytest.fail("the run never started its sidecar")

    def wait_until_probing(self, timeout: float = 60.0) -> None:
        """Until the eBPF probe loader runs (the run is in its probe windows)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.watch()
            if any(_alive(p) for p in self.probes):
                return
            if self.proc.poll() is not None:
                code, out = self.finish(timeout=5)
                pytest.fail(f"meshtax profile ended before probing ({code}): {out[-2000:]}")
            time.sleep(0.05)
        pytest.fail("the run never started its probe loader")

    def finish(self, timeout: float = 120.0) -> tuple[int, str]:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.watch()
            time.sleep(0.05)
        out, err = self.proc.communicate(timeout=10)  # also closes the pipes
        return self.proc.returncode, out + err

    def leftovers(self) -> tuple[set[str], set[int], set[str]]:
        """The run's namespaces, processes and scratch directories that still exist."""
        return (
            self.netns & _netns(),
            {p for p in self.pids if _alive(p)},
            {d for d in self.dirs if Path(d).exists()},
        )

    def force_cleanup(self) -> None:
        """Whatever the assertions said: end our processes by PID and delete our namespaces."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
        for p in self.pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        for ns in self.netns & _netns():
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def clis(tmp_path: Path) -> Iterator[list[Cli]]:
    made: list[Cli] = []
    yield made
    for c in made:
        c.force_cleanup()


class Busy(Exception):
    """Another profiling run took the lock between our check and our start."""


def start(clis: list[Cli], tmp_path: Path, name: str) -> Cli:
    c = Cli(tmp_path / "profiles.db", name)
    clis.append(c)
    return c


def start_measuring(clis: list[Cli], tmp_path: Path, name: str, tries: int = 3) -> Cli:
    """Start a run and wait until its sidecar runs; retry when the lock was taken meanwhile."""
    for _ in range(tries):
        c = start(clis, tmp_path, name)
        try:
            c.wait_until_measuring()
            return c
        except Busy:
            continue
    pytest.skip("the profiling lock kept being taken by other runs")


def test_ctrl_c_leaves_nothing(clis: list[Cli], tmp_path: Path) -> None:
    c = start_measuring(clis, tmp_path, "sigint")
    assert c.netns and c.pids, "saw no namespace or process of the run"
    os.kill(c.proc.pid, signal.SIGINT)
    code, out = c.finish(timeout=30)
    assert code != 0, out
    assert c.dirs and c.leftovers() == (set(), set(), set()), out


def test_killed_run_is_reaped_by_the_next_which_then_leaves_nothing(
    clis: list[Cli], tmp_path: Path
) -> None:
    dead = start_measuring(clis, tmp_path, "killed")
    dead.wait_until_probing()  # killed with the probe loader attached (outside any pod)
    os.kill(dead.proc.pid, signal.SIGKILL)
    dead.finish(timeout=10)
    ns, pids, dirs = dead.leftovers()
    assert ns and pids and dirs, (
        "SIGKILL should leave the run's namespaces, processes and scratch directory behind"
    )
    assert any(_alive(p) for p in dead.probes), "the probe loader should outlive SIGKILL"
    nxt = start(clis, tmp_path, "after")
    code, out = nxt.finish()
    if code != 0 and BUSY in out:
        pytest.skip("another engineer's profiling run took the lock between our two runs")
    assert code == 0, out
    assert "tcp" in out and "tcp+grpc" in out  # the breakdown table of the stored profile
    assert dead.leftovers() == (set(), set(), set()), out
    assert nxt.netns and nxt.leftovers() == (set(), set(), set()), out


def test_bad_carried_protocol_or_low_rate_is_a_usage_error(tmp_path: Path) -> None:
    exe = str(Path(sys.executable).with_name("meshtax"))
    env = {**os.environ, "MESHTAX_DB": str(tmp_path / "profiles.db")}
    for bad in (["--carried", "udp"], ["--low-rates", "0"], ["--low-rates", "fast"]):
        done = subprocess.run(
            [exe, "profile", "--modes", "tcp", *bad],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stdout + done.stderr
        # refused while the options are checked, before any namespace or process is made
        assert "--carried/--low-rates" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run(
        [exe, "profile", "--quick", "--resolve", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--resolve" in done.stderr, done.stdout + done.stderr
    for opt, n in (
        ("--instances", "0"),
        ("--instances", "17"),
        ("--instances", "two"),
        ("--rounds", "0"),
        ("--rounds", "9"),
    ):
        done = subprocess.run(
            [exe, "profile", "--quick", opt, n],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and opt in done.stderr, done.stdout + done.stderr
