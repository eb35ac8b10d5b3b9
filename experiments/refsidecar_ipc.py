"""Prototype measurement (issue #17): what Unix-socket IPC, zero-copy writes and sockmap
redirection change for one sidecar on loopback, end to end, before the profiler measures
them per component.

    client (fortio tcp, CPU 0) ──TCP──► refsidecar inbound (CPU 1) ──leg──► fortio TCP echo (CPU 1)

The sidecar↔app leg is what varies: loopback TCP (copy), a Unix socket, loopback TCP with
MSG_ZEROCOPY (threshold 0), or loopback TCP with sockmap/sk_msg redirection (bpf/sockredir on
a cgroup holding the sidecar and its app; the client stays outside, so only that leg is
redirected). The baseline is the client calling the echo directly. Every round runs every
configuration once (fixed rate, one connection, closed loop); a configuration's overhead in a
round is its median (and mean) latency minus that of a baseline run right before it; CPU is the sidecar's and the
app's on-CPU time (schedstat) per request. Medians over rounds with 95 % order-statistic
intervals (meshtax.model.stats.estimate).

Run (root, built refsidecar and bpf):
  flock /run/meshtax-measure.lock env PYTHONPATH=src python experiments/refsidecar_ipc.py \
      [--rounds 9] [--seconds 6] [--qps 2000] [--sizes 100,4096] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshtax.model.stats import estimate
from meshtax.testbed.system import free_ports

ROOT = Path(__file__).resolve().parents[1]
FORTIO = ROOT / ".tools" / "bin" / "fortio"
REFSIDECAR = ROOT / "refsidecar" / ".output" / "refsidecar"
SOCKREDIR = ROOT / "bpf" / ".output" / "sockredir"
CLIENT_CPU, SERVER_CPU = "0", "1"
CONFIGS = ("tcp", "uds", "zerocopy", "sockmap")


def cgroup2_root() -> Path:
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mnt, fstype, *_ = line.split()
        if fstype == "cgroup2":
            return Path(mnt)
    raise SystemExit("no cgroup-v2 mount")


def on_cpu_ns(pid: int) -> int:
    """On-CPU time of every thread of ``pid`` (schedstat, ns)."""
    total = 0
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((t / "schedstat").read_text().split()[0])
        except (OSError, ValueError):
            pass  # a thread that just ended
    return total


class Bench:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.procs: list[subprocess.Popen[bytes]] = []
        self.cgroup: Path | None = None

    def spawn(self, argv: Sequence[str], name: str, cgroup: Path | None = None) -> int:
        """Start ``argv`` pinned to the server CPU (inside ``cgroup`` from its first
        instruction); returns the PID of the real process (sh execs into it)."""
        pre = f"echo $$ > {cgroup}/cgroup.procs && " if cgroup else ""
        script = pre + 'umask 0 && exec taskset -c "$0" "$@"'
        log = (self.work / f"{name}.log").open("wb")
        p = subprocess.Popen(["sh", "-c", script, SERVER_CPU, *argv], stdout=log, stderr=log)
        self.procs.append(p)
        return p.pid

    def wait_log(self, name: str, text: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in (self.work / f"{name}.log").read_text(errors="replace"):
                return
            time.sleep(0.05)
        raise SystemExit(f"{name}: no {text!r} in its log")

    def close(self) -> None:
        for p in reversed(self.procs):  # by PID: only what this script started
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        if self.cgroup is not None:
            self.cgroup.rmdir()


def fortio_echo(b: Bench, name: str, where: str, cgroup: Path | None = None) -> int:
    args = [str(FORTIO), "server", "-tcp-port", where, "-http-port", "disabled"]
    args += ["-grpc-port", "disabled", "-udp-port", "disabled", "-redirect-port", "disabled"]
    return b.spawn(args, name, cgroup)


def load(port: int, size: int, qps: int, seconds: float) -> tuple[float, float, int]:
    """Mean and median latency (µs) and request count of one fortio tcp run (client CPU)."""
    argv = ["taskset", "-c", CLIENT_CPU, str(FORTIO), "load", "-qps", str(qps), "-c", "1"]
    argv += ["-t", f"{seconds}s", "-payload-size", str(size), "-json", "-", "-loglevel"]
    argv += ["error", "-p", "50", f"tcp://127.0.0.1:{port}"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=seconds + 60)
    doc = json.loads(out.stdout[out.stdout.index("{") :])
    if doc.get("ErrorsDurationHistogram", {}).get("Count", 0):
        raise SystemExit(f"errors through port {port}: {out.stderr[-500:]}")
    h = doc["DurationHistogram"]
    (p50,) = (p["Value"] for p in h["Percentiles"] if p["Percentile"] == 50)
    return float(h["Avg"]) * 1e6, float(p50) * 1e6, int(h["Count"])


metrics = ("overhead_p50_us", "sidecar_cpu_us_per_request", "app_cpu_us_per_request")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--qps", type=int, default=2000)
    ap.add_argument("--sizes", default="100,4096")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="meshtax-refsidecar-ipc-"))
    b = Bench(work)
    try:
        echo_tcp, echo_redir, *sidecar_ports = free_ports(2 + len(CONFIGS))
        ports = dict(zip(CONFIGS, sidecar_ports))
        app_pids = {"tcp": fortio_echo(b, "echo-tcp", f"127.0.0.1:{echo_tcp}")}
        uds = str(work / "echo.sock")
        app_pids["uds"] = fortio_echo(b, "echo-uds", uds)
        app_pids["zerocopy"] = app_pids["tcp"]
        b.cgroup = cgroup2_root() / f"meshtax-refsidecar-ipc-{os.getpid()}"
        b.cgroup.mkdir()
        redir = subprocess.Popen(
            [str(SOCKREDIR), "-c", str(b.cgroup)],
            stdout=subprocess.PIPE,
            stderr=(work / "sockredir.log").open("wb"),
        )
        b.procs.append(redir)
        b.wait_log("sockredir", "sockredir: ready")
        app_pids["sockmap"] = fortio_echo(b, "echo-redir", f"127.0.0.1:{echo_redir}", b.cgroup)
        app_of = {"tcp": f"127.0.0.1:{echo_tcp}", "zerocopy": f"127.0.0.1:{echo_tcp}"}
        app_of |= {"uds": uds, "sockmap": f"127.0.0.1:{echo_redir}"}
        side_pids: dict[str, int] = {}
        for c in CONFIGS:
            args = [str(REFSIDECAR), "-i", f"127.0.0.1:{ports[c]}", "-o", "none", "-a", app_of[c]]
            if c == "uds":
                args += ["--ipc", "uds", "-o", str(work / "unused.sock")]
            if c == "zerocopy":
                args += ["--write", "zerocopy", "--zerocopy-min", "0"]
            side_pids[c] = b.spawn(args, f"sidecar-{c}", b.cgroup if c == "sockmap" else None)
            b.wait_log(f"sidecar-{c}", "refsidecar: ready")
        time.sleep(1.0)
        rows: dict[str, Any] = {}
        for size in sizes:
            for c in CONFIGS:  # warm-up: first connections, page faults
                load(ports[c], size, a.qps, 1.0)
            over: dict[str, list[float]] = {c: [] for c in CONFIGS}
            over50: dict[str, list[float]] = {c: [] for c in CONFIGS}
            side_cpu: dict[str, list[float]] = {c: [] for c in CONFIGS}
            app_cpu: dict[str, list[float]] = {c: [] for c in (*CONFIGS, "direct")}
            for r in range(a.rounds):
                order = list(CONFIGS[r % len(CONFIGS) :] + CONFIGS[: r % len(CONFIGS)])
                for c in order:  # each configuration right after its own baseline run
                    a0 = on_cpu_ns(app_pids["tcp"])
                    base, base50, n = load(echo_tcp, size, a.qps, a.seconds)
                    app_cpu["direct"].append((on_cpu_ns(app_pids["tcp"]) - a0) / n / 1e3)
                    s0, a0 = on_cpu_ns(side_pids[c]), on_cpu_ns(app_pids[c])
                    lat, lat50, n = load(ports[c], size, a.qps, a.seconds)
                    side_cpu[c].append((on_cpu_ns(side_pids[c]) - s0) / n / 1e3)
                    app_cpu[c].append((on_cpu_ns(app_pids[c]) - a0) / n / 1e3)
                    over[c].append(lat - base)
                    over50[c].append(lat50 - base50)
                print(
                    f"{size} B round {r + 1}: "
                    + ", ".join(f"{c} {over50[c][-1]:.1f}" for c in CONFIGS),
                    file=sys.stderr,
                    flush=True,
                )
            rows[str(size)] = {
                c: {
                    "overhead_p50_us": estimate(over50[c]).to_dict(),
                    "overhead_mean_us": estimate(over[c]).to_dict(),
                    "sidecar_cpu_us_per_request": estimate(side_cpu[c]).to_dict(),
                    "app_cpu_us_per_request": estimate(app_cpu[c]).to_dict(),
                }
                for c in CONFIGS
            }
            rows[str(size)]["direct"] = {
                "app_cpu_us_per_request": estimate(app_cpu["direct"]).to_dict()
            }
        redir.send_signal(signal.SIGTERM)
        counters = json.loads(redir.communicate(timeout=10)[0].decode().strip().splitlines()[-1])
    finally:
        b.close()
        shutil.rmtree(work)
    doc = {
        "options": vars(a) | {"json": str(a.json) if a.json else None},
        "host": os.uname().release,
        "load": os.getloadavg(),
        "sockredir": counters,
        "results": rows,
    }
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1, default=str))
    print(f"load average {doc['load']}; sockredir {counters}")
    print("size  config    p50 overhead µs [95 %]   sidecar CPU µs/req     app CPU µs/req")
    for size_label, row in rows.items():
        for c in (*CONFIGS, "direct"):
            cells = [row[c].get(k) for k in metrics]
            text = [
                f"{e['median']:7.1f} [{e['lo']:.1f}, {e['hi']:.1f}]" if e else "-" for e in cells
            ]
            print(f"{size_label:>5} {c:9} " + "  ".join(f"{t:22}" for t in text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
