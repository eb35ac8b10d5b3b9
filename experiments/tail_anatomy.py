"""What makes a sidecar's tail under load (issue #20): on the profiler's echo bed (client on
one CPU, sidecar and app on the other), paired fixed-rate runs without and through one
sidecar at load levels of the meshed closed-loop maximum, each run recording the latency
quantiles, the on-CPU and run-queue time of the app and the sidecar, the pods' CPU from
``/proc/stat`` (tasks, interrupts, steal, idle) and, with ``--probe``, the per-event
notification histograms (wake-up → epoll return) of the sidecar's and the app's threads.

Run (root, under the measurement lock)::

    flock /run/meshtax-measure.lock .venv/bin/python experiments/tail_anatomy.py \\
        --out artifacts/tail/anatomy.json [--mode http] [--fractions 0.1,0.25,0.5,0.75,0.9] \\
        [--connections 32] [--duration 4] [--pairs 4] [--probe]

Writes one JSON document (every run raw) and prints per level the medians over pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from meshtax.model.sidecar import Mode
from meshtax.testbed import procfs
from meshtax.testbed.bed import echo_testbed
from meshtax.testbed.fortio import histogram_quantiles
from meshtax.testbed.paired import PairPolicy, paired_runs
from meshtax.testbed.pinning import default_pinning
from meshtax.testbed.pods import Testbed
from meshtax.testbed.probes import RealProbe
from meshtax.testbed.system import RealSystem
from meshtax.validate.tail import BASE_PROBS

PCTS = (50.0, 75.0, 90.0, 99.0, 99.9)


def _hist(t: Any) -> list[list[int]]:
    return [list(b) for b in t.notify_hist.bins]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", default="http")
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--fractions", default="0.1,0.25,0.5,0.75,0.9")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--probe", action="store_true")
    a = ap.parse_args()
    mode = Mode(a.mode)
    pin = default_pinning()
    pod_cpus = sorted({*(pin.sidecars or ()), *(pin.app or ())})
    t0 = time.monotonic()
    doc: dict[str, Any] = {"options": vars(a), "pinning": pin.describe(), "levels": []}
    doc["loadavg_start"] = os.getloadavg()

    def say(m: str) -> None:
        print(f"[{time.monotonic() - t0:5.0f}s] {m}", flush=True)

    with Testbed(RealSystem(), lock_timeout=900.0) as tb, echo_testbed(tb, pin) as bed:
        envoy = bed.start_sidecar(mode)
        app = bed.app_pid
        targets = {"direct": bed.direct_target(mode), "meshed": bed.meshed_target}
        probe = RealProbe(bed.system) if a.probe else None
        if probe is not None:
            probe.start([envoy.pid, app])

        def load(side: str, qps: float, extra: tuple[str, ...] = ()) -> Any:
            return bed.load(
                targets[side],
                mode,
                a.size,
                qps,
                duration_s=a.duration,
                connections=a.connections,
                extra_args=extra,
            )

        for side in targets:
            bed.load(targets[side], mode, a.size, n=500, connections=a.connections)
        tops: dict[str, list[float]] = {"direct": [], "meshed": []}
        for i in range(3):
            for side in ("direct", "meshed") if i % 2 == 0 else ("meshed", "direct"):
                tops[side].append(load(side, 0.0).actual_qps)
        top = {s: statistics.median(v) for s, v in tops.items()}
        doc["closed_loop_max"] = {"runs": tops, "median": top}
        say(f"closed-loop maximum: {top}")

        def run(side: str, qps: float) -> dict[str, Any]:
            pids = [app] + ([envoy.pid] if side == "meshed" else [])
            cpu0, wait0, st0 = procfs.cpu_ns(pids), _waits(pids), procfs.cpu_times()
            snap0 = probe.snapshot() if probe is not None else None
            r = load(side, qps, ("-uniform",))
            snap1 = probe.snapshot() if probe is not None else None
            cpu1, wait1, st1 = procfs.cpu_ns(pids), _waits(pids), procfs.cpu_times()
            names = {app: "app", envoy.pid: "sidecar"}
            out: dict[str, Any] = {
                "side": side,
                "target_qps": qps,
                "achieved_qps": r.actual_qps,
                "count": r.count,
                "duration_s": r.duration_s,
                "percentiles_us": {f"p{p:g}": v for p, v in r.percentiles_us.items()},
                "avg_us": r.avg_us,
                "max_us": r.max_us,
                "quantiles_us": histogram_quantiles([r], BASE_PROBS),
                "cpu_ns": {names[p]: cpu1.get(p, 0) - cpu0.get(p, 0) for p in pids},
                "runqueue_ns": {names[p]: wait1[p] - wait0[p] for p in pids},
                "pod_cpu": {
                    str(c): vars(st1[c] - st0[c]) for c in pod_cpus if c in st1 and c in st0
                },
            }
            if snap0 is not None and snap1 is not None:
                w = snap1.since(snap0)
                out["probe"] = {}
                for p in pids:
                    t = w.process(p)
                    out["probe"][names[p]] = {
                        "notify_count": t.notify.count,
                        "notify_ns": t.notify.ns,
                        "notify_hist": _hist(t),
                        "shift": t.notify_hist.shift,
                        "switches_in": t.switches_in,
                        "oncpu_ns": t.oncpu_ns,
                        "read_count": t.read.count,
                        "epoll_count": t.epoll.count,
                    }
            return out

        for f in (float(x) for x in a.fractions.split(",")):
            rate = f * top["meshed"]
            say(f"{f:.0%} of the meshed maximum: {rate:.0f}/s")
            got = paired_runs(
                [("direct", "meshed")], partial(run, qps=rate), PairPolicy.fixed(a.pairs)
            )
            pairs = got.pairs("direct", "meshed")
            doc["levels"].append(
                {
                    "fraction": f,
                    "rate": rate,
                    "pairs": [{"direct": d, "meshed": m} for d, m in pairs],
                }
            )
            _print_level(f, rate, pairs, say)
        if probe is not None:
            probe.close()
        envoy.stop()
    doc["loadavg_end"] = os.getloadavg()
    doc["wall_s"] = time.monotonic() - t0
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1))
    say(f"written {a.out}")


def _waits(pids: list[int]) -> dict[int, int]:
    return {p: procfs.runqueue_wait_ns(p) for p in pids}


def _print_level(
    f: float, rate: float, pairs: list[tuple[Any, Any]], say: Callable[[str], None]
) -> None:
    for side, name in ((0, "direct"), (1, "meshed")):
        runs = [p[side] for p in pairs]

        def med(xs: list[float]) -> float:
            return statistics.median(xs)

        pct = " ".join(
            f"{k}={med([r['percentiles_us'].get(k, float('nan')) for r in runs]):.0f}"
            for k in ("p50", "p90", "p99", "p99.9")
        )
        per = {
            (what, g): med([r[what].get(g, 0) * 1e-3 / r["count"] for r in runs])
            for what in ("cpu_ns", "runqueue_ns")
            for g in ("app", "sidecar")
        }
        say(
            f"  {name}: achieved {med([r['achieved_qps'] for r in runs]):.0f}/s; {pct} µs; "
            f"CPU-µs/req app {per['cpu_ns', 'app']:.1f} sidecar {per['cpu_ns', 'sidecar']:.1f}; "
            f"run-queue µs/req app {per['runqueue_ns', 'app']:.1f} "
            f"sidecar {per['runqueue_ns', 'sidecar']:.1f}"
        )


if __name__ == "__main__":
    main()
