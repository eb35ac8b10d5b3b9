"""One mesh of ``benchmarks/bench_meshes.py`` for a few seconds, then every Envoy's admin
counters and the latency histogram: what made the mTLS paths fail and what the latency
deltas were (issue #18). Run as root:

    .venv/bin/python experiments/mesh_probe.py envoy-mtls --placement intra -c 400 --qps 400
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

from meshtax.model.sidecar import Mode
from meshtax.testbed.fortio import FortioServer, LoadFailed, LoadSpec, run_spec
from meshtax.testbed.meshes import MESHES, Service, deploy
from meshtax.testbed.nodes import NodeNet
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import RealSystem
from meshtax.testbed.tools import tool

PORT = 8080
STATS = re.compile(
    r"(upstream_cx_(total|active|connect_fail|connect_timeout|destroy_remote|destroy_local|"
    r"overflow|none_healthy|connect_attempts_exceeded)|upstream_rq_(pending_overflow|"
    r"timeout|5xx|total|pending_failure_eject)|ssl\.(handshake|connection_error|fail_verify|"
    r"no_certificate)|downstream_cx_(total|overflow|destroy_remote)|"
    r"tcp\.\w+\.(upstream_flush|idle_timeout|upstream_cx_no_successful_host)|"
    r"downstream_rq_5xx|no_route|overflow)"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mesh", choices=sorted(MESHES))
    ap.add_argument("--placement", choices=("intra", "inter"), default="intra")
    ap.add_argument("-c", type=int, default=4)
    ap.add_argument("--qps", type=float, default=20.0)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--delay-ms", type=int, default=200)
    ap.add_argument("--fortio-args", default="", help="extra fortio load flags")
    ap.add_argument("--resolution", type=float, default=1e-6)
    a = ap.parse_args()
    fortio = Path(tool("fortio"))
    with Testbed(RealSystem(), lock_timeout=60) as tb:
        net = NodeNet(tb)
        cn = net.add_node("pc")
        sn = cn if a.placement == "intra" else net.add_node("ps")
        client, server = net.add_pod("cp", cn), net.add_pod("sp", sn)
        app = FortioServer(
            tb.registered,
            tb.scratch_dir("meshtax-probe-app-"),
            host="0.0.0.0",
            http_port=PORT,
            grpc_port=None,
            tcp_port=None,
            place=server.place(),
            binary=fortio,
        )
        app.start()
        d = deploy(
            tb,
            net,
            MESHES[a.mesh],
            client,
            [Service("server", server, PORT)],
            Mode.HTTP,
            tb.scratch_dir("meshtax-probe-mesh-"),
        )
        try:
            spec = LoadSpec(
                f"http://{server.ip}:{PORT}/echo?delay={a.delay_ms}ms",
                Mode.HTTP,
                0,
                a.qps,
                connections=a.c,
                duration_s=a.duration,
                timeout_s=10.0,
                resolution_s=a.resolution,
                extra_args=tuple(a.fortio_args.split()),
            )
            try:
                r = run_spec(spec, RealSystem(), client.place(), fortio)
                h = r.raw["DurationHistogram"]
                print(
                    f"ok: count {r.count} qps {r.actual_qps:.0f} min {r.min_us / 1e3:.1f} "
                    f"avg {r.avg_us / 1e3:.1f} max {r.max_us / 1e3:.1f} ms; "
                    f"pct {json.dumps({k: round(v / 1e3, 1) for k, v in r.percentiles_us.items()})}"
                )
                for b in h["Data"]:
                    print(f"  [{b['Start'] * 1e3:9.3f}, {b['End'] * 1e3:9.3f}] ms  {b['Count']}")
            except LoadFailed as e:
                print("FAILED", str(e)[-600:])
            nss = {role: (d.proxies[role], role) for role in d.proxies}
            for role, (px, _) in nss.items():
                ns = _netns_of(px.pid)
                out = subprocess.run(
                    ["ip", "netns", "exec", ns, "curl", "-s", "127.0.0.1:15000/stats"],
                    capture_output=True,
                    text=True,
                    check=False,
                ).stdout
                hits = [ln for ln in out.splitlines() if STATS.search(ln) and not ln.endswith(" 0")]
                print(f"--- {role} (pid {px.pid}, {ns}) ---")
                print("\n".join(hits))
                lim = Path(f"/proc/{px.pid}/limits").read_text().splitlines()
                print(" ", next(x for x in lim if "open files" in x))
        finally:
            d.stop()
            app.stop()
    return 0


def _netns_of(pid: int) -> str:
    out = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True)
    return out.stdout.strip()


if __name__ == "__main__":
    raise SystemExit(main())
