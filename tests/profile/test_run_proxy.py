"""run_profile on another proxy and IPC: the reference sidecar with Unix-socket legs, against
fakes with exact expectations (the echo on Unix sockets, who the probe watches, the components
of Unix-socket delivery, what the profile records), and what is refused before anything runs;
one short real run as root."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO

import pytest

from meshtax.model.components import IPC, READ, WRITE
from meshtax.model.proxy import ProxyChoice, ProxyError
from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends
from meshtax.profile.build import ClosureWarning, family_hash
from meshtax.profile.plan import Plan
from meshtax.profile.run import ProfileOptions, run_profile
from meshtax.testbed.probe_reading import OpStat
from meshtax.testbed.probes import ProbeReading
from meshtax.testbed.refsidecar import READY
from meshtax.testbed.runstate import STATE_DIR
from meshtax.testbed.system import Completed, Placement, Process, RealSystem
from tests.helpers import missing_for_real_profile
from tests.profile.test_decompose import make_reading, thread
from tests.profile.test_run import PIN, EchoFakeSystem, FakePerf, Procs, World

UDS = ProxyChoice("refsidecar", "uds")


class RefsidecarFakeSystem(EchoFakeSystem):
    """The echo says it listens (EchoFakeSystem); refsidecar says it is ready."""

    def spawn(
        self,
        argv: Sequence[str],
        *,
        place: Placement = Placement(),
        stdout: IO[bytes] | int | None = None,
        stderr: IO[bytes] | int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Process:
        if any(a.endswith("/refsidecar") for a in argv) and not isinstance(stderr, int):
            assert stderr is not None
            stderr.write(READY.encode() + b"\n")
            stderr.flush()
        return super().spawn(argv, place=place, stdout=stdout, stderr=stderr, env=env)


def refsidecar_version(argv: tuple[str, ...]) -> Completed | None:
    if argv[-2:] == ("/x/refsidecar", "--version"):
        return Completed(argv, 0, "refsidecar 0.1.0\n", "")
    return None


class UnixProbe:
    """Meshed windows: the sidecar read 2 ms and wrote 6 ms, 2 ms of which delivered to the app
    over its Unix socket; the meshed app (the echo on Unix sockets) wrote 1 ms, 0.4 ms of it
    delivering back; nothing on lo. Direct windows: the TCP echo wrote 3 ms to the client. Per
    crossing (1000 requests = 2000 crossings): IPC (2 + 0.4) / 2 = 1.2 µs, Write 3 + 0.5 − 1.5
    − 1.2 = 0.8 µs, Read 1 µs."""

    def __init__(self, sock_method: str = "sk_data_ready->sock_send_length") -> None:
        self.started: list[tuple[int, ...]] = []
        self.sock_method = sock_method

    def start(self, pids: Sequence[int], follow_netns: str | None = None) -> None:
        self.started.append(tuple(pids))

    def stop(self) -> ProbeReading:
        side, uds_app, tcp_app = self.started[-1]
        if len(self.started) % 2:
            w = thread(7, read=2_000_000, write=6_000_000, epoll=10**8, notify=10**6, tgid=side)
            w = replace(w, sock_ipc=OpStat(1000, 2_000_000, 10**5, 0))
            a = thread(8, write=1_000_000, epoll=10**8, tgid=uds_app)
            a = replace(a, sock_ipc=OpStat(1000, 400_000, 10**5, 0))
            r = make_reading([w, a], ipc_ns=0, ipc_count=0)
            return replace(r, ipc=replace(r.ipc, sock_method=self.sock_method))
        return make_reading(
            [thread(9, write=3_000_000, epoll=10**8, tgid=tcp_app)], ipc_ns=0, ipc_count=0
        )

    def close(self) -> None:
        pass


def _backends(tmp_path: Path, probe: UnixProbe | ZeroCopyProbe) -> Backends:
    sched = iter(range(0, 10**12, 6_000_000))
    return Backends(
        probe=lambda s: probe,
        perf=lambda s: FakePerf([]),
        schedstat=lambda pid: {pid: next(sched)},
        state_dir=tmp_path / "state",
        procs=Procs(),
        fortio_binary=Path("/x/fortio"),
        proxy_binary=Path("/x/refsidecar"),
        niceness=lambda n: contextlib.nullcontext(),
        meter=None,
        speed=None,
    )


def test_refsidecar_over_unix_sockets(tmp_path: Path) -> None:
    sysm = RefsidecarFakeSystem(responders=[refsidecar_version, World()])
    probe = UnixProbe()
    plan = Plan(
        closure_retries=0,
        modes=(Mode.TCP,),
        sizes=(100,),
        rate_fractions=(1.0,),
        latency_run_s=0.1,
        latency_max_runs=3,
        probe_pairs=1,
        pinning=PIN,
        carried=("grpc",),
        carried_probe_pairs=1,
        carried_rate_fractions=(1.0,),
        low_rates=(),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ClosureWarning)
        prof = run_profile(
            ProfileOptions(name="rs", plan=plan, proxy=UDS),
            sysm,
            None,
            backends=_backends(tmp_path, probe),
        )
    # no Envoy anywhere; the echo on Unix sockets in the server pod, its sockets open to 1337
    assert not any("envoy" in a for c in sysm.calls for a in c)
    echo_uds = next(
        p for p in sysm.processes if "server" in p.argv and any(".sock" in a for a in p.argv)
    )
    echo_tcp = next(p for p in sysm.processes if "server" in p.argv and p is not echo_uds)
    argv = echo_uds.argv
    sockets = Path(argv[argv.index("-tcp-port") + 1]).parent
    assert argv[argv.index("-http-port") + 1] == str(sockets / "http.sock")
    assert argv[3].endswith("-server") and argv[5:7] == ("-c", "1")  # pod and CPU of the app
    assert ("chown", "1337:1337", str(sockets)) in sysm.calls
    assert ("chmod", "0666", *(str(sockets / f"{m}.sock") for m in ("tcp", "http", "grpc"))) in (
        sysm.calls
    )
    # refsidecar as uid 1337 on the sidecar CPU, to the app's Unix socket of each protocol
    sidecars = [p for p in sysm.processes if "/x/refsidecar" in p.argv and len(p.argv) > 2]
    assert len(sidecars) == 2  # tcp echo, then gRPC carried
    for p, proto in zip(sidecars, ("tcp", "grpc")):
        a = p.argv
        assert "--reuid=1337" in a and a[4:7] == ("taskset", "-c", "1")
        assert a[a.index("--app") + 1] == str(sockets / f"{proto}.sock")
        assert a[a.index("--ipc") + 1] == "uds"
        assert a[a.index("--outbound") + 1] == str(sockets / "outbound.sock")
    # the probe watched the sidecar and both echoes; Window split them by path
    assert probe.started[0] == (sidecars[0].pid, echo_uds.pid, echo_tcp.pid)
    lat = {c: m.latency.intercept for c, m in prof.modes[Mode.TCP].components.items()}
    assert lat[IPC] == pytest.approx(1.2) and lat[WRITE] == pytest.approx(0.8)
    assert lat[READ] == pytest.approx(1.0)
    # the platform and the record say which proxy and variant
    pl = prof.platform
    assert (pl.proxy, pl.proxy_version, pl.variant) == ("refsidecar", "0.1.0", "ipc=uds")
    assert pl.config_hash == family_hash(UDS) != family_hash(ProxyChoice("refsidecar"))
    o = prof.provenance.options
    assert o["proxy"] == {"proxy": "refsidecar", "ipc": "uds", "write": "copy", "version": "0.1.0"}
    assert "envoy_version" not in o
    assert "sidecar: refsidecar (ipc=uds)" in prof.provenance.notes
    assert not any("no sk_data_ready" in n for n in prof.provenance.notes)
    assert all(p.returncode is not None for p in sysm.processes)


class SockmapFakeSystem(RefsidecarFakeSystem):
    """... and sockredir says it attached."""

    def spawn(
        self,
        argv: Sequence[str],
        *,
        place: Placement = Placement(),
        stdout: IO[bytes] | int | None = None,
        stderr: IO[bytes] | int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Process:
        if any(a.endswith("/sockredir") for a in argv) and not isinstance(stderr, int):
            assert stderr is not None
            stderr.write(b"sockredir: ready\n")
            stderr.flush()
        return super().spawn(argv, place=place, stdout=stdout, stderr=stderr, env=env)


def test_sockmap_puts_sidecar_and_its_echo_in_one_redirected_cgroup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MESHTAX_SOCKREDIR", "/x/sockredir")
    if not any(ln.split()[2] == "cgroup2" for ln in Path("/proc/mounts").read_text().splitlines()):
        pytest.skip("no cgroup-v2 mount on this machine")
    sysm = SockmapFakeSystem(responders=[refsidecar_version, World()])
    plan = Plan(
        closure_retries=0,
        modes=(Mode.TCP,),
        sizes=(100,),
        rate_fractions=(1.0,),
        probe_pairs=1,
        pinning=PIN,
        carried=(),
        low_rates=(),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ClosureWarning)
        prof = run_profile(
            ProfileOptions(plan=plan, proxy=ProxyChoice("refsidecar", "sockmap")),
            sysm,
            None,
            backends=_backends(tmp_path, UnixProbe()),
        )
    (mkdir,) = [c for c in sysm.calls if c[0] == "mkdir"]
    cgroup = mkdir[1]
    assert cgroup.endswith("-sockmap")
    join = ("sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup)
    (redir,) = [p for p in sysm.processes if any(x.endswith("/sockredir") for x in p.argv)]
    assert redir.argv[-2:] == ("-c", cgroup)
    # the meshed echo (127.0.0.1:9178…) and the sidecar start in the cgroup; the direct echo not
    echo = next(p for p in sysm.processes if "server" in p.argv and p.argv[:4] == join)
    assert echo.argv[echo.argv.index("-tcp-port") + 1] == "127.0.0.1:9178"
    (side,) = [p for p in sysm.processes if "/x/refsidecar" in p.argv and len(p.argv) > 2]
    assert side.argv[:4] == join and "--reuid=1337" in side.argv
    a = side.argv
    assert a[a.index("--app") + 1] == "127.0.0.1:9178" and a[a.index("--ipc") + 1] == "tcp"
    direct = [p for p in sysm.processes if "server" in p.argv and p is not echo]
    assert len(direct) == 1 and direct[0].argv[0] != "sh"
    # removed after everything in it stopped
    assert sysm.calls.index(("rmdir", cgroup)) > sysm.calls.index(mkdir)
    assert prof.platform.variant == "ipc=sockmap"


def test_a_kernel_without_the_unix_tracepoints_is_said(tmp_path: Path) -> None:
    sysm = RefsidecarFakeSystem(responders=[refsidecar_version, World()])
    plan = Plan(
        closure_retries=0,
        modes=(Mode.TCP,),
        sizes=(100,),
        rate_fractions=(1.0,),
        probe_pairs=1,
        pinning=PIN,
        carried=(),
        low_rates=(),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ClosureWarning)
        prof = run_profile(
            ProfileOptions(plan=plan, proxy=UDS),
            sysm,
            None,
            backends=_backends(tmp_path, UnixProbe("unavailable")),
        )
    assert any(
        "no sk_data_ready/sock_send_length tracepoints" in n and "IPC + Write" in n
        for n in prof.provenance.notes
    )


class ZeroCopyProbe:
    """Meshed windows: the sidecar read 2 ms, wrote 6 ms and reaped zero-copy completions
    (``recvmsg(MSG_ERRQUEUE)``) for ``errqueue_ns``; 2 ms crossed lo; the app wrote 1 ms.
    Direct windows: the app wrote 3 ms."""

    def __init__(self, errqueue_ns: int) -> None:
        self.started: list[tuple[int, ...]] = []
        self.errqueue_ns = errqueue_ns

    def start(self, pids: Sequence[int], follow_netns: str | None = None) -> None:
        self.started.append(tuple(pids))

    def stop(self) -> ProbeReading:
        side, app = self.started[-1][0], self.started[-1][-1]
        if len(self.started) % 2:
            w = thread(7, read=2_000_000, write=6_000_000, epoll=10**8, notify=10**6, tgid=side)
            w = replace(w, errqueue=OpStat(500, self.errqueue_ns, 0, 0))
            w = replace(w, sys_ns=w.sys_ns + self.errqueue_ns)
            a = thread(8, write=1_000_000, epoll=10**8, tgid=app)
            return make_reading([w, a], ipc_ns=2_000_000, ipc_count=2000)
        return make_reading([thread(9, write=3_000_000, epoll=10**8, tgid=app)], ipc_ns=0)

    def close(self) -> None:
        pass


def test_zero_copy_writes_run_the_sidecar_so_and_their_completions_are_write(
    tmp_path: Path,
) -> None:
    zc = ProxyChoice("refsidecar", write="zerocopy", zerocopy_min=0)
    plan = Plan(
        closure_retries=0,
        modes=(Mode.TCP,),
        sizes=(100,),
        rate_fractions=(1.0,),
        probe_pairs=1,
        pinning=PIN,
        carried=(),
        low_rates=(),
    )
    lat = {}
    for ns in (0, 1_000_000):
        sysm = RefsidecarFakeSystem(responders=[refsidecar_version, World()])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ClosureWarning)
            prof = run_profile(
                ProfileOptions(plan=plan, proxy=zc),
                sysm,
                None,
                backends=_backends(tmp_path / str(ns), ZeroCopyProbe(ns)),
            )
        comps = prof.modes[Mode.TCP].components
        lat[ns] = {c: m.latency.intercept for c, m in comps.items()}
        (side,) = [p for p in sysm.processes if "/x/refsidecar" in p.argv and len(p.argv) > 2]
        a = side.argv
        assert a[a.index("--write") + 1] == "zerocopy" and a[a.index("--zerocopy-min") + 1] == "0"
        assert a[a.index("--ipc") + 1] == "tcp" and a[a.index("--app") + 1] == "127.0.0.1:9078"
        # one echo only: the meshed path reaches the app over loopback TCP, as the direct one
        assert len([p for p in sysm.processes if "server" in p.argv and "-tcp-port" in p.argv]) == 1
        assert prof.platform.variant == "write=zerocopy(min=0)"
        assert (
            prof.platform.config_hash == family_hash(zc) != family_hash(replace(zc, write="copy"))
        )
        assert prof.provenance.options["proxy"]["zerocopy_min"] == 0
    # 1 ms of completions over 1000 requests (2000 crossings) is 0.5 µs more Write, not Read
    assert lat[1_000_000][WRITE] - lat[0][WRITE] == pytest.approx(0.5)
    assert lat[1_000_000][READ] == pytest.approx(lat[0][READ])
    assert lat[1_000_000][IPC] == pytest.approx(lat[0][IPC])


def test_what_an_l4_proxy_cannot_profile_is_refused_before_anything_runs(tmp_path: Path) -> None:
    sysm = RefsidecarFakeSystem(responders=[refsidecar_version, World()])
    opts = ProfileOptions(plan=Plan(modes=(Mode.TCP, Mode.HTTP)), proxy=UDS)
    with pytest.raises(ProxyError, match="runs tcp mode only, not http"):
        run_profile(opts, sysm, None, backends=_backends(tmp_path, UnixProbe()))
    assert sysm.calls == []


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0 or missing_for_real_profile() is not None,
    reason=missing_for_real_profile() or "needs root",
)
def test_real_refsidecar_profile_over_unix_sockets() -> None:
    """A short real run: refsidecar with Unix-socket legs in a pod, probed; Unix-socket
    delivery is measured (not zero), and nothing goes over lo between sidecar and app."""
    plan = Plan(
        closure_retries=0,
        modes=(Mode.TCP,),
        sizes=(100,),
        rate_fractions=(1.0,),
        latency_run_s=0.3,
        latency_min_runs=3,
        latency_max_runs=3,
        probe_run_s=1.0,
        maxqps_run_s=0.5,
        carried=(),
        low_rates=(),
        warmup_n=50,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ClosureWarning)
        prof = run_profile(
            ProfileOptions(name="smoke-uds", plan=plan, proxy=UDS),
            RealSystem(),
            None,
            backends=Backends(state_dir=STATE_DIR, lock_timeout=180.0),
        )
    assert prof.platform.proxy == "refsidecar" and prof.platform.variant == "ipc=uds"
    windows = prof.provenance.options["measurements"]["tcp"][0]["probe"]["windows"]
    meshed = [w for w in windows if w["meshed"]]
    assert meshed and all(w["ipc_packets"] == 0 for w in meshed)  # nothing on lo
    for w in meshed:
        n = w["requests"]
        # one delivery per message each way: the sidecar's to the app, the app's back
        assert w["sidecar"]["sock_ipc_n"] >= n and w["app"]["sock_ipc_n"] >= n
        assert w["sidecar"]["sock_ipc_ns"] > 0
    # the component is that delivery plus the change of the client's write (an intercepted
    # write to lo against a write to the veth): that change is a difference of two noisy means
    # (±3 µs in 1 s windows), so the sum may be held at 0 on a busy run; it is never negative
    assert prof.modes[Mode.TCP].components[IPC].latency.intercept >= 0
