"""The sidecar's CPU per request on the one-hop echo bed at fixed rates, with 1 and with 32
fortio connections (``-uniform``), read from ``/proc`` around each run — to tell whether the
capacity runs' lower CPU per request (the tail model's load factor) comes from the rate or
from the number of connections, and what it is at the low per-sidecar rates of a topology.

``sudo .venv/bin/python experiments/tail_clients_cpu.py --db DB --profile NAME
[--rates 200,500,1000,2000,4000] [--connections 1,32] [--duration 3]`` (under the
measurement lock). Prints one row per run: rate asked / achieved, connections, sidecar and
app CPU-µs per request, the pods' CPU busy share, the client's p50/p99 (µs).
"""

from __future__ import annotations

import argparse
import json

from meshtax.model.sidecar import Mode
from meshtax.store.sqlite import ProfileStore
from meshtax.testbed import procfs
from meshtax.testbed.bed import echo_testbed
from meshtax.testbed.pinning import pinning_of
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import RealSystem


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--rates", default="200,500,1000,2000,4000")
    ap.add_argument("--connections", default="1,32")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--out", default=None, help="JSON lines of every run")
    a = ap.parse_args()
    prof = ProfileStore(a.db).get(a.profile)
    pinning = pinning_of(prof)
    pods = sorted({*(pinning.sidecars or ()), *(pinning.app or ())})
    mode = Mode.HTTP
    rows = []
    with Testbed(RealSystem(), lock_timeout=900.0) as tb, echo_testbed(tb, pinning) as bed:
        envoy = bed.start_sidecar(mode)
        pids = [envoy.pid, bed.app_pid]
        for c in (int(x) for x in a.connections.split(",")):
            bed.load(bed.meshed_target, mode, a.size, n=500, connections=c)
            for rate in (float(x) for x in a.rates.split(",")):
                for side, target in (
                    ("direct", bed.direct_target(mode)),
                    ("mesh", bed.meshed_target),
                ):
                    b0, t0 = procfs.cpu_ns(pids), procfs.cpu_times()
                    r = bed.load(
                        target,
                        mode,
                        a.size,
                        rate,
                        duration_s=a.duration,
                        connections=c,
                        extra_args=("-uniform",),
                    )
                    b1, t1 = procfs.cpu_ns(pids), procfs.cpu_times()
                    n = max(r.count, 1)
                    busy = sum(
                        t1[k].task_ns + t1[k].irq_ns - t0[k].task_ns - t0[k].irq_ns for k in pods
                    )
                    tot = sum(t1[k].total_ns - t0[k].total_ns for k in pods)
                    row = {
                        "connections": c,
                        "side": side,
                        "rate": rate,
                        "achieved": r.actual_qps,
                        "count": r.count,
                        "sidecar_us": (b1[envoy.pid] - b0[envoy.pid]) * 1e-3 / n
                        if side == "mesh"
                        else 0.0,
                        "app_us": (b1[bed.app_pid] - b0[bed.app_pid]) * 1e-3 / n,
                        "pods_busy": busy / tot if tot else 0.0,
                        "p50": r.percentiles_us.get(50.0, 0.0),
                        "p99": r.percentiles_us.get(99.0, 0.0),
                    }
                    rows.append(row)
                    print(
                        f"c={c:2d} {side:6s} {rate:7.0f} → {r.actual_qps:7.0f}/s  sidecar "
                        f"{row['sidecar_us']:6.1f}  app {row['app_us']:6.1f} µs/req  pods busy "
                        f"{row['pods_busy']:.2f}  p50 {row['p50']:6.0f}  p99 {row['p99']:6.0f}",
                        flush=True,
                    )
        envoy.stop()
    if a.out:
        with open(a.out, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
