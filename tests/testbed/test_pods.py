"""Testbed: exact commands and rules against FakeSystem, and the real thing as root."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from meshtax.testbed.pods import CleanupError, Interception, Testbed, istio_rules
from meshtax.testbed.runstate import FakeProcOps, RunBusy, list_netns
from meshtax.testbed.system import Completed, FakeSystem, Placement, RealSystem, wait_until
from tests.helpers import default_sigint

HERE = Path(__file__).parent
NETPROBE = str(HERE / "netprobe.py")
CHILD = str(HERE / "testbed_child.py")


def fake_procs(table: dict[int, int] | None = None) -> FakeProcOps:
    return FakeProcOps(dict(table or {}), default=lambda pid: pid * 10)


def fake_bed(tmp_path: Path, **kw: object) -> tuple[Testbed, FakeSystem, FakeProcOps]:
    sysm = FakeSystem()
    procs = fake_procs()
    tb = Testbed(sysm, "abc123", state_dir=tmp_path, procs=procs, **kw)  # type: ignore[arg-type]
    return tb, sysm, procs


# --- pure / fake ------------------------------------------------------------------------------

DEFAULT_RULES = """\
-N ISTIO_INBOUND
-N ISTIO_REDIRECT
-N ISTIO_IN_REDIRECT
-N ISTIO_OUTPUT
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A ISTIO_INBOUND -p tcp --dport 15000 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN
-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT
-A OUTPUT -p tcp -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_OUTPUT -j ISTIO_REDIRECT"""


def test_istio_rules_default() -> None:
    rules = istio_rules(Interception())
    assert all(r[:4] == ["iptables", "-w", "-t", "nat"] for r in rules)
    assert "\n".join(" ".join(r[4:]) for r in rules) == DEFAULT_RULES


def test_istio_rules_custom_ports_uid_and_exclusions() -> None:
    c = Interception(
        inbound_port=9006,
        outbound_port=9001,
        proxy_uid=2000,
        proxy_gid=2001,
        exclude_inbound_ports=(22,),
        exclude_outbound_ports=(5432, 6379),
    )
    text = [" ".join(r[4:]) for r in istio_rules(c)]
    assert "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 9001" in text
    assert "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 9006" in text
    assert [t for t in text if t.startswith("-A ISTIO_INBOUND")] == [
        "-A ISTIO_INBOUND -p tcp --dport 22 -j RETURN",
        "-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT",
    ]
    out = [t for t in text if t.startswith("-A ISTIO_OUTPUT")]
    # port exclusions come before anything that could redirect
    assert out[:2] == [
        "-A ISTIO_OUTPUT -p tcp --dport 5432 -j RETURN",
        "-A ISTIO_OUTPUT -p tcp --dport 6379 -j RETURN",
    ]
    assert "-A ISTIO_OUTPUT -m owner --uid-owner 2000 -j RETURN" in out
    assert "-A ISTIO_OUTPUT -m owner --gid-owner 2001 -j RETURN" in out
    assert out[-1] == "-A ISTIO_OUTPUT -j ISTIO_REDIRECT"


def test_add_pod_commands(tmp_path: Path) -> None:
    tb, sysm, _ = fake_bed(tmp_path)
    with tb:
        start = len(sysm.calls)
        pod = tb.add_pod("client")
        assert pod.netns == "mtx-abc123-client" and pod.ip == "10.77.0.2"
        assert tb.add_pod("server").ip == "10.77.0.3"
        br = "mtx-abc123-bridge"
        assert sysm.calls[start : start + 7] == [
            ("ip", "netns", "add", "mtx-abc123-client"),
            (
                "ip",
                "netns",
                "exec",
                "mtx-abc123-client",
                "sysctl",
                "-q",
                "-w",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ),
            (
                "ip",
                "-n",
                br,
                "link",
                "add",
                "veth1",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                "mtx-abc123-client",
            ),
            ("ip", "-n", br, "link", "set", "veth1", "master", "br0", "up"),
            ("ip", "-n", "mtx-abc123-client", "addr", "add", "10.77.0.2/24", "dev", "eth0"),
            ("ip", "-n", "mtx-abc123-client", "link", "set", "eth0", "up"),
            ("ip", "-n", "mtx-abc123-client", "link", "set", "lo", "up"),
        ]
        state = json.loads((tmp_path / "abc123.json").read_text())
        assert state["netns"] == [br, "mtx-abc123-client", "mtx-abc123-server"]
        assert state["owner_pid"] == os.getpid()
    assert not (tmp_path / "abc123.json").exists()


def test_open_creates_bridge_netns_only_inside_namespaces(tmp_path: Path) -> None:
    tb, sysm, _ = fake_bed(tmp_path)
    with tb:
        pass
    br = "mtx-abc123-bridge"
    assert ("ip", "netns", "add", br) in sysm.calls
    assert ("ip", "-n", br, "link", "add", "br0", "type", "bridge") in sysm.calls
    # every link/addr command names a namespace: the root namespace is never touched
    for c in sysm.calls:
        if c[:2] == ("ip", "link") or c[:2] == ("ip", "addr"):
            pytest.fail(f"root-namespace command {c}")


def test_mesh_runs_rules_in_pod_netns(tmp_path: Path) -> None:
    tb, sysm, _ = fake_bed(tmp_path)
    with tb:
        pod = tb.add_pod("server")
        start = len(sysm.calls)
        c = tb.mesh(pod, exclude_inbound_ports=(15021,))
        issued = sysm.calls[start:]
        assert issued == [tuple(Placement(netns=pod.netns).wrap(r)) for r in istio_rules(c)]
        assert c.exclude_inbound_ports == (15021,) and c.proxy_gid == 1337
        with pytest.raises(ValueError, match="already meshed"):
            tb.mesh(pod)


def test_spawn_records_and_close_stops_and_deletes_in_reverse(tmp_path: Path) -> None:
    tb, sysm, procs = fake_bed(tmp_path)
    with tb:
        pod = tb.add_pod("server")
        p = tb.spawn(pod, ["envoy", "-c", "x"], place=Placement(cpus=(1,), uid=1337))
        state = json.loads((tmp_path / "abc123.json").read_text())
        rec = state["processes"][0]
        assert rec["pid"] == p.pid and rec["start_time"] == p.pid * 10
        assert rec["netns"] == pod.netns
        assert rec["argv"][:6] == ["ip", "netns", "exec", pod.netns, "taskset", "-c"]
        n = len(sysm.calls)
    assert p.poll() == -signal.SIGTERM
    dels = [c for c in sysm.calls[n:] if c[:3] == ("ip", "netns", "del")]
    assert dels == [
        ("ip", "netns", "del", "mtx-abc123-server"),
        ("ip", "netns", "del", "mtx-abc123-bridge"),
    ]
    assert not (tmp_path / "abc123.json").exists()
    assert not (tmp_path / "profile.lock").read_text()  # holder PID cleared


def test_cleanup_on_exception_fake(tmp_path: Path) -> None:
    tb, sysm, _ = fake_bed(tmp_path)
    with pytest.raises(ZeroDivisionError):
        with tb:
            tb.add_pod("a")
            scratch = tb.scratch_dir("meshtax-test-")
            (scratch / "envoy.log").write_text("x")
            # recorded, so a crash leaves it to the reaper
            assert json.loads((tmp_path / "abc123.json").read_text())["dirs"] == [str(scratch)]
            raise ZeroDivisionError
    assert ("ip", "netns", "del", "mtx-abc123-a") in sysm.calls
    assert not (tmp_path / "abc123.json").exists()
    assert not scratch.exists()


def test_failed_open_cleans_up_and_releases_lock(tmp_path: Path) -> None:
    def fail_bridge(argv: tuple[str, ...]) -> Completed | None:
        if "bridge" in argv and "type" in argv:
            return Completed(argv, 2, "", "RTNETLINK answers: Operation not supported")
        return None

    sysm = FakeSystem(responders=[fail_bridge])
    tb = Testbed(sysm, "abc123", state_dir=tmp_path, procs=fake_procs())
    with pytest.raises(Exception, match="Operation not supported"):
        tb.open()
    assert ("ip", "netns", "del", "mtx-abc123-bridge") in sysm.calls
    Testbed(FakeSystem(), "def456", state_dir=tmp_path, procs=fake_procs()).open().close()


def test_close_reports_failures_after_finishing(tmp_path: Path) -> None:
    class Stubborn:
        pid = 777

        def stop(self, timeout: float = 5.0) -> int | None:
            raise OSError("nope")

    tb, sysm, _ = fake_bed(tmp_path)
    tb.open()
    tb.add_pod("a")
    tb.adopt(Stubborn())  # type: ignore[arg-type]
    with pytest.raises(CleanupError, match="stop PID 777"):
        tb.close()
    assert ("ip", "netns", "del", "mtx-abc123-a") in sysm.calls  # teardown still ran


def test_names_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Testbed(FakeSystem(), "Bad_ID")
    tb, _, _ = fake_bed(tmp_path)
    with pytest.raises(RuntimeError, match="not open"):
        tb.add_pod("a")
    with tb:
        for bad in ("bridge", "Has_Upper", "x" * 21, ""):
            with pytest.raises(ValueError):
                tb.add_pod(bad)
        tb.add_pod("a")
        with pytest.raises(ValueError, match="exists"):
            tb.add_pod("a")


def test_sigterm_handler_installed_only_while_open(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    tb, _, _ = fake_bed(tmp_path)
    with tb:
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


# --- real -------------------------------------------------------------------------------------

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("iptables") is None,
    reason="needs root, iproute2 and iptables",
)
LOCK_WAIT = 60.0  # other runs (other tests, other engineers) may hold the lock for a while


def netns_now() -> set[str]:
    return set(list_netns(RealSystem()))


def alive(pid: int) -> bool:
    """Running (a zombie whose parent is gone does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def start_listener(tb: Testbed, pod: object, uid: int, ports: list[int], tmp: Path) -> None:
    ready = tmp / f"ready-{uid}-{ports[0]}"
    with ready.open("wb") as out:  # the listener inherits the fd: no file access as uid
        tb.spawn(
            pod,  # type: ignore[arg-type]
            [sys.executable, NETPROBE, "listen", *map(str, ports)],
            place=Placement(uid=uid),
            stdout=out,
        )
    assert wait_until(lambda: b"ready" in ready.read_bytes(), 10), f"{ports}: no listener"


def probe(pod: object, ip: str, port: int, uid: int | None = None) -> str:
    out = RealSystem().run(
        [sys.executable, NETPROBE, "connect", ip, str(port)],
        place=Placement(netns=pod.netns, uid=uid),  # type: ignore[attr-defined]
        timeout=20,
    )
    return out.stdout.strip()


@pytest.mark.root
@needs_root
def test_real_pods_connect_and_teardown(tmp_path: Path) -> None:
    with Testbed(RealSystem(), lock_timeout=LOCK_WAIT) as tb:
        client, server = tb.add_pod("client"), tb.add_pod("server")
        names = {tb.bridge_netns, client.netns, server.netns}
        assert names <= netns_now()
        start_listener(tb, server, 0, [8080], tmp_path)
        assert probe(client, server.ip, 8080).startswith("port=8080 ")
        pid = tb.processes[0].pid
        state_file = tb.state_dir / f"{tb.run_id}.json"
        assert state_file.exists()
    assert not names & netns_now()
    assert not alive(pid)
    assert not state_file.exists()


@pytest.mark.root
@needs_root
def test_real_interception(tmp_path: Path) -> None:
    with Testbed(RealSystem(), lock_timeout=LOCK_WAIT) as tb:
        client, server = tb.add_pod("client"), tb.add_pod("server")
        tb.mesh(client)
        tb.mesh(server)
        app = f"{server.ip}:8080"
        start_listener(tb, client, 1337, [15001, 15006], tmp_path)  # client's sidecar
        start_listener(tb, server, 1337, [15001, 15006], tmp_path)  # server's sidecar
        start_listener(tb, server, 0, [8080, 15090], tmp_path)  # server's app
        # the client app's outbound call is captured by its own sidecar, original dst kept
        assert probe(client, server.ip, 8080) == f"port=15001 orig={app} uid=1337"
        # the sidecar's own call is not redirected again (no loop); the server's inbound
        # capture hands it to the server's sidecar
        assert probe(client, server.ip, 8080, uid=1337) == f"port=15006 orig={app} uid=1337"
        # excluded inbound port reaches the app directly
        assert probe(client, server.ip, 15090, uid=1337).startswith("port=15090 ")
        assert probe(client, server.ip, 15090, uid=1337).endswith(" uid=0")
        # in-pod loopback to the app is not intercepted
        assert probe(server, "127.0.0.1", 8080).startswith("port=8080 ")


@pytest.mark.root
@needs_root
def test_real_cleanup_after_exception() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with Testbed(RealSystem(), lock_timeout=LOCK_WAIT) as tb:
            pod = tb.add_pod("a")
            p = tb.spawn(pod, ["sleep", "300"])
            names = {tb.bridge_netns, pod.netns}
            raise RuntimeError("boom")
    assert not names & netns_now()
    assert not alive(p.pid)


@pytest.mark.root
@needs_root
def test_real_lock_refuses_second_run() -> None:
    with Testbed(RealSystem(), lock_timeout=LOCK_WAIT):
        with pytest.raises(RunBusy, match=f"PID {os.getpid()}"):
            Testbed(RealSystem()).open()


def run_child() -> tuple[subprocess.Popen[str], dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1] / "src")}
    child = subprocess.Popen(
        [sys.executable, CHILD],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        preexec_fn=default_sigint,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    child.stdout.close()  # nothing more to read; an open pipe would warn
    if not line:
        child.wait(5)
        pytest.fail(f"testbed child exited {child.returncode} before reporting")
    return child, json.loads(line)


@pytest.mark.root
@needs_root
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_real_cleanup_after_signal(sig: signal.Signals) -> None:
    child, info = run_child()
    names = set(cast(list[str], info["netns"]))
    pids: list[int] = info["pids"]  # type: ignore[assignment]
    assert names <= netns_now() and all(alive(p) for p in pids)
    child.send_signal(sig)
    try:
        rc = child.wait(20)
    finally:
        if child.poll() is None:  # never leave a child holding the machine-wide lock
            child.kill()
            child.wait(10)
    # SIGTERM becomes Terminated (exit 143); after KeyboardInterrupt Python re-raises SIGINT
    assert rc == (143 if sig == signal.SIGTERM else -signal.SIGINT)
    assert not names & netns_now()
    assert not any(alive(p) for p in pids)
    assert not Path(f"/run/meshtax/{info['run_id']}.json").exists()


@pytest.mark.root
@needs_root
def test_real_reap_after_sigkill() -> None:
    child, info = run_child()
    names = set(cast(list[str], info["netns"]))
    pids: list[int] = info["pids"]  # type: ignore[assignment]
    child.kill()
    child.wait(10)
    left = names & netns_now()
    assert all(alive(p) for p in pids)  # SIGKILL leaves them behind …
    with Testbed(RealSystem(), lock_timeout=LOCK_WAIT) as tb:
        # … and the next run removes them (unless another run got there first)
        assert left <= set(tb.reaped.netns)
        assert not names & netns_now()
        assert wait_until(lambda: not any(alive(p) for p in pids), 5)
        assert not Path(f"/run/meshtax/{info['run_id']}.json").exists()
