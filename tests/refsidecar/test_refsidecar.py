"""The reference sidecar (refsidecar/), run for real: echo through it on loopback in every
option combination, its counters, sanitizer builds, and Istio-style interception in pods."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.refsidecar import echo

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "refsidecar"
ECHO = Path(echo.__file__)
SIZES = (1, 100, 4096, 65535, 65536, 65537, 1 << 20)
COMBOS = [(ipc, w) for ipc in ("tcp", "uds") for w in ("copy", "zerocopy")]


def _build(target: str) -> Path:
    if shutil.which("make") is None or shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("needs make and a C compiler")
    r = subprocess.run(["make", "-s", "-C", str(SRC), target], capture_output=True, text=True)
    if r.returncode and target == "asan":
        pytest.skip(f"no AddressSanitizer build with this compiler: {r.stderr[-300:]}")
    assert r.returncode == 0, r.stderr
    name = "refsidecar-asan" if target == "asan" else "refsidecar"
    return SRC / ".output" / name


@pytest.fixture(scope="session")
def binary() -> Path:
    return _build("all")


@pytest.fixture(scope="session")
def asan_binary() -> Path:
    return _build("asan")


def addresses(ipc: str, tmp: Path) -> tuple[str, str, str]:
    """(inbound, outbound, app) listener addresses: free loopback ports (held together while
    chosen, so no two are the same) or socket paths for the app-facing ones."""
    held = [socket.socket() for _ in range(3)]
    try:
        for s in held:
            s.bind(("127.0.0.1", 0))
        inbound, outbound, app = (f"127.0.0.1:{s.getsockname()[1]}" for s in held)
    finally:
        for s in held:
            s.close()
    if ipc == "uds":
        outbound, app = str(tmp / "outbound.sock"), str(tmp / "app.sock")
    return inbound, outbound, app


def _wait_ready(
    proc: subprocess.Popen[str], marker: str = "refsidecar: ready", timeout: float = 10.0
) -> None:
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    seen = ""
    while (left := deadline - time.monotonic()) > 0:
        if select.select([proc.stderr], [], [], left)[0]:
            line = proc.stderr.readline()
            seen += line
            if marker in line:
                return
            if not line:  # it exited
                break
    proc.kill()  # by PID: the process this test started
    pytest.fail(f"no {marker!r}: {seen}")


class Running(dict[str, Any]):
    """A running sidecar; after it stopped: ``returncode``, ``stats``, ``stderr``."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        super().__init__()
        self.proc = proc

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until the sidecar has closed every session (it closes just after the client
        saw EOF), asking for its counters with SIGUSR1."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.proc.send_signal(signal.SIGUSR1)
            if json.loads(self.proc.stdout.readline())["sessions_open"] == 0:
                return
            time.sleep(0.05)
        pytest.fail("sessions still open")


@contextmanager
def sidecar(
    binary: Path, args: Sequence[str], env: dict[str, str] | None = None
) -> Iterator[Running]:
    """Run the sidecar; on exit SIGTERM it and record its exit code, counters and stderr."""
    proc = subprocess.Popen(
        [str(binary), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    result = Running(proc)
    try:
        _wait_ready(proc)
        yield result
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()  # by PID: only the process this test started
            out, err = proc.communicate()
        result.update(returncode=proc.returncode, stderr=err, out=out)
        lines = out.strip().splitlines()
        result["stats"] = json.loads(lines[-1]) if lines else None


@contextmanager
def chain(
    binary: Path, tmp: Path, ipc: str, write: str, extra: Sequence[str] = ()
) -> Iterator[tuple[str, Running]]:
    """client → outbound listener → (upstream: own inbound listener, TCP) → app echo; the
    app-facing legs over ``ipc``. Yields the address the client connects to."""
    inbound, outbound, app = addresses(ipc, tmp)
    srv = echo.serve(app, lambda _: None)
    args = ["--ipc", ipc, "--write", write, "-i", inbound, "-o", outbound]
    args += ["-u", inbound, "-a", app, *extra]
    try:
        with sidecar(binary, args) as res:
            yield outbound, res
    finally:
        srv.close()


def check_clean_exit(res: dict[str, Any]) -> dict[str, Any]:
    assert res["returncode"] == 0, res["stderr"]
    st = res["stats"]
    assert (st["sessions_open"], st["chunks_in_use"], st["chunks_orphaned"]) == (0, 0, 0), st
    return dict(st)


def test_help_and_bad_options(binary: Path) -> None:
    ok = subprocess.run([binary, "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "--ipc tcp|uds" in ok.stdout and "--write" in ok.stdout
    for args, message in [
        (["--ipc", "udp"], "--ipc: expected tcp or uds"),
        (["--ipc", "uds"], "--ipc uds needs --outbound PATH and --app PATH"),
        (["--write", "splice"], "--write: expected copy or zerocopy"),
        (["-a", "localhost:80"], "--app: bad IPV4:PORT localhost:80"),
        (["-i", "none", "-o", "none"], "nothing to do"),
        (["-w", "0"], "--workers"),
    ]:
        r = subprocess.run([binary, *args], capture_output=True, text=True)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)


@pytest.mark.parametrize(("ipc", "write"), COMBOS)
def test_echo_is_intact_in_every_combination(
    binary: Path, tmp_path: Path, ipc: str, write: str
) -> None:
    with chain(binary, tmp_path, ipc, write, ["--zerocopy-min", "0"]) as (addr, res):
        for size in SIZES:
            assert echo.roundtrip(addr, size) == echo.payload(size), size
        res.settle()
    st = check_clean_exit(res)
    moved = 2 * 2 * sum(SIZES)  # two sessions per round trip, each both ways
    assert (st["accepted"], st["bytes_in"], st["bytes_out"]) == (2 * len(SIZES), moved, moved)
    assert st["connect_failed"] == st["no_original_dst"] == 0
    if write == "copy":
        assert st["zc_sends"] == 0 and st["zc_notifications"] == 0
    else:
        # every TCP send is zero-copy (threshold 0); Unix sockets have none and copy
        assert st["zc_sends"] > 0 and st["zc_completed"] == st["zc_sends"]
        assert st["zc_notifications"] >= 1 and st["zc_fallbacks"] == 0
        assert (st["sends"] == 0) if ipc == "tcp" else (st["sends"] > 0)
        # loopback delivery copies the pages anyway, and the kernel says so per completion
        assert st["zc_copied"] == st["zc_completed"]


def test_zerocopy_threshold(binary: Path, tmp_path: Path) -> None:
    with chain(binary, tmp_path, "tcp", "zerocopy") as (addr, res):  # default: 10240 bytes
        assert echo.roundtrip(addr, 100) == echo.payload(100)
        res.settle()
    small = check_clean_exit(res)
    assert small["zerocopy_min"] == 10240 and small["zc_sends"] == 0 and small["sends"] > 0
    with chain(binary, tmp_path, "tcp", "zerocopy") as (addr, res):
        assert echo.roundtrip(addr, 1 << 20) == echo.payload(1 << 20)
        res.settle()
    big = check_clean_exit(res)
    assert big["zc_sends"] > 0 and big["zc_completed"] == big["zc_sends"]


def test_several_workers_share_the_listeners(binary: Path, tmp_path: Path) -> None:
    with chain(binary, tmp_path, "tcp", "copy", ["-w", "3"]) as (addr, res):
        for size in (1, 65537, 1 << 20) * 3:
            assert echo.roundtrip(addr, size) == echo.payload(size)
        res.settle()
    st = check_clean_exit(res)
    assert st["workers"] == 3 and st["accepted"] == 18


def _reset(addr: str, size: int) -> None:
    """Send ``size`` bytes and close with a RST, reading nothing."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.sendall(echo.payload(size))


@pytest.mark.parametrize(("ipc", "write"), COMBOS)
def test_sanitizers_find_no_error_or_leak(
    asan_binary: Path, tmp_path: Path, ipc: str, write: str
) -> None:
    env = {"ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1", "UBSAN_OPTIONS": "halt_on_error=1"}
    inbound, outbound, app = addresses(ipc, tmp_path)
    args = ["--ipc", ipc, "--write", write, "--zerocopy-min", "0", "-i", inbound]
    args += ["-o", outbound, "-u", inbound, "-a", app]
    # the app is not there yet: the inbound connect fails and the client sees the end
    with sidecar(asan_binary, args, env) as res:
        assert echo.roundtrip(outbound, 100) == b""
        srv = echo.serve(app, lambda _: None)
        try:
            for size in SIZES:
                assert echo.roundtrip(outbound, size) == echo.payload(size)
            _reset(inbound, 1 << 20)  # a client that resets mid-transfer
            res.settle()
        finally:
            srv.close()
    assert res["returncode"] == 0 and "Sanitizer" not in res["stderr"], res["stderr"]
    st = res["stats"]
    assert st["connect_failed"] == 1 and st["sessions_open"] == 0 and st["chunks_in_use"] == 0


def test_buffers_the_kernel_still_holds_are_never_freed_early(
    asan_binary: Path, tmp_path: Path
) -> None:
    # an app that never reads: zero-copy sends wait in TCP write queues (the kernel holds the
    # pages) when the sidecar is stopped; it must keep them, then exit without leaks
    env = {"ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1", "UBSAN_OPTIONS": "halt_on_error=1"}
    inbound, outbound, app = addresses("tcp", tmp_path)
    host, port = app.rsplit(":", 1)
    sink = socket.create_server((host, int(port)))  # listens, never accepts
    args = ["--write", "zerocopy", "--zerocopy-min", "0", "-i", inbound, "-o", outbound]
    try:
        with sidecar(asan_binary, [*args, "-u", inbound, "-a", app], env) as res:
            ohost, oport = outbound.rsplit(":", 1)
            client = socket.create_connection((ohost, int(oport)))
            client.setblocking(False)
            data, sent = echo.payload(1 << 20), 0
            deadline = time.monotonic() + 10
            while sent < 8 << 20 and time.monotonic() < deadline:  # until everything is full
                try:
                    sent += client.send(data)
                except BlockingIOError:
                    time.sleep(0.05)
            client.close()
    finally:
        sink.close()
    assert res["returncode"] == 0 and "Sanitizer" not in res["stderr"], res["stderr"]
    st = res["stats"]
    assert st["zc_sends"] > st["zc_completed"] and st["chunks_orphaned"] > 0
    assert st["chunks_in_use"] == 0  # freed at exit, not before


# --- interception in pods (root) -----------------------------------------------------------

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("iptables") is None,
    reason="needs root, iproute2 and iptables",
)
LOCK_WAIT = 60.0  # the testbed's machine-wide run lock may be held by another run
PROXY_UID = 1337


def _wait_for(path: Path, text: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = path.read_text() if path.exists() else ""
        if text in got:
            return got
        time.sleep(0.05)
    pytest.fail(f"{path}: no {text!r} in {got!r}")


@pytest.mark.root
@needs_root
@pytest.mark.parametrize("write", ["copy", "zerocopy"])
def test_interception_in_pods(binary: Path, tmp_path: Path, write: str) -> None:
    from meshtax.testbed.pods import Testbed
    from meshtax.testbed.system import Placement, RealSystem

    sizes = ("1", "4096", "65537", str(1 << 20))
    with Testbed(RealSystem(), lock_timeout=LOCK_WAIT) as tb:
        client, server = tb.add_pod("client"), tb.add_pod("server")
        tb.mesh(server, proxy_uid=PROXY_UID)
        logs = {n: tmp_path / f"{n}.log" for n in ("app", "remote", "proxy", "proxy.err")}
        with logs["app"].open("wb") as a, logs["remote"].open("wb") as r:
            tb.spawn(server, [sys.executable, str(ECHO), "serve", "0.0.0.0:8080"], stdout=a)
            tb.spawn(client, [sys.executable, str(ECHO), "serve", "0.0.0.0:7070"], stdout=r)
        with logs["proxy"].open("wb") as out, logs["proxy.err"].open("wb") as err:
            args = [str(binary), "--write", write, "--zerocopy-min", "0"]
            proxy = tb.spawn(server, args, place=Placement(uid=PROXY_UID), stdout=out, stderr=err)
        for name in ("app", "remote"):
            _wait_for(logs[name], "ready")
        _wait_for(logs["proxy.err"], "refsidecar: ready")
        run = RealSystem().run
        # inbound: the client calls the server's app; REDIRECT hands it to the sidecar
        got = run(
            [sys.executable, str(ECHO), "send", f"{server.ip}:8080", *sizes],
            place=Placement(netns=client.netns),
            timeout=60,
        )
        assert got.stdout.split() == [w for s in sizes for w in ("ok", s)]
        # ...which reached the app from Istio's passthrough source
        assert _wait_for(logs["app"], "peer=").count("peer=127.0.0.6:") == len(sizes)
        # outbound: the server's app calls the client's service through its sidecar
        got = run(
            [sys.executable, str(ECHO), "send", f"{client.ip}:7070", *sizes],
            place=Placement(netns=server.netns),
            timeout=60,
        )
        assert got.stdout.split() == [w for s in sizes for w in ("ok", s)]
        # a connection addressed to the inbound listener itself has no other destination
        refused = run(
            [sys.executable, str(ECHO), "send", f"{server.ip}:15006", "10"],
            place=Placement(netns=client.netns),
            check=False,
            timeout=60,
        )
        assert refused.returncode != 0
        proxy.stop()
    st = json.loads(logs["proxy"].read_text().strip().splitlines()[-1])
    assert st["accepted"] == 2 * len(sizes) + 1 and st["no_original_dst"] == 1
    assert st["connect_failed"] == 0 and st["sessions_open"] == 0
    assert st["bytes_in"] == st["bytes_out"] == 2 * 2 * sum(map(int, sizes))
    if write == "zerocopy":
        assert st["zc_sends"] > 0 and st["zc_completed"] == st["zc_sends"]


# --- socket redirection (sockmap / sk_msg, bpf/sockredir) ------------------------------------


def _cgroup2_root() -> Path | None:
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mnt, fstype, *_ = line.split()
        if fstype == "cgroup2":
            return Path(mnt)
    return None


@pytest.fixture()
def cgroup() -> Iterator[Path]:
    """A fresh cgroup-v2 directory, removed afterwards (its processes must have ended)."""
    root = _cgroup2_root()
    if os.geteuid() != 0 or root is None:
        pytest.skip("needs root and a cgroup-v2 mount")
    path = root / f"meshtax-sockredir-{os.getpid()}"
    path.mkdir()
    try:
        yield path
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                path.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def _in_cgroup(cg: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside ``cg`` from its first instruction (sockets take the cgroup of the
    process that creates them)."""
    return ["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh", *argv]


@pytest.mark.root
def test_socket_redirection_between_app_and_sidecar(binary: Path, cgroup: Path) -> None:
    if not (Path("/sys/kernel/btf/vmlinux").exists() and shutil.which("bpftool")):
        pytest.skip("needs the kernel's BTF and bpftool")
    subprocess.run(["make", "-s", "-C", str(ROOT / "bpf")], check=True, capture_output=True)
    loader = subprocess.Popen(
        [str(ROOT / "bpf" / ".output" / "sockredir"), "-c", str(cgroup)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    procs: list[subprocess.Popen[str]] = [loader]
    sizes = ("1", "100", "4096", "65537", str(1 << 20))
    try:
        _wait_ready(loader, "sockredir: ready")
        inbound, outbound, app = addresses("tcp", cgroup)
        app_proc = subprocess.Popen(
            _in_cgroup(cgroup, [sys.executable, str(ECHO), "serve", app]),
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(app_proc)
        assert app_proc.stdout is not None and app_proc.stdout.readline().strip() == "ready"
        args = ["-i", inbound, "-o", outbound, "-u", inbound, "-a", app]
        side = subprocess.Popen(
            _in_cgroup(cgroup, [str(binary), *args]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(side)
        _wait_ready(side)
        got = subprocess.run(
            _in_cgroup(cgroup, [sys.executable, str(ECHO), "send", outbound, *sizes]),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert got.stdout.split() == [w for s in sizes for w in ("ok", s)], got.stderr
    finally:
        outs = {}
        for p in reversed(procs):  # by PID: only what this test started
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            outs[p.pid] = p.communicate(timeout=10)[0]
    st = json.loads(outs[loader.pid].strip().splitlines()[-1])
    # client→outbound, outbound→inbound, inbound→app: both ends of three connections each
    assert st["socks_added"] == 6 * len(sizes) and st["add_failed"] == 0
    assert st["msg_redirected"] > 0 and st["msg_passed"] == 0
