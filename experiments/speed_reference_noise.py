"""The machine-speed references read N times back to back: how noisy one reading is (issue #14).

Each reading is ``speedref`` (the same-CPU and cross-CPU loopback ping-pongs, the user-space
loop) and the reference sidecar (:func:`meshtax.testbed.speed.measure_sidecar`: Envoy on
loopback, its CPU per request), on the profiler's CPUs (client 0, sidecar 1). One JSON line per
reading, then the median and spread of each reference::

    .venv/bin/python experiments/speed_reference_noise.py [--n 30] [--out FILE.jsonl]

Measures for about 6 s a reading; run it under ``scripts/quiet-measure.sh`` on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from meshtax.testbed.speed import measure_sidecar, measure_speed
from meshtax.testbed.system import RealSystem

KEYS = ("sidecar_ns", "user_ns", "local_ns", "cross_ns")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--n", type=int, default=30, help="readings (default 30)")
    ap.add_argument("--out", default=None, help="also write the readings here (JSON lines)")
    a = ap.parse_args()
    system = RealSystem()
    rows: list[dict[str, float]] = []
    for _ in range(a.n):
        s = measure_speed(system, 0, 1)
        row = {
            "t": time.time(),
            "sidecar_ns": measure_sidecar(system, 0, 1),
            "user_ns": s.user_ns,
            "local_ns": s.local_ns,
            "cross_ns": s.cross_ns,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    for k in KEYS:
        v = [r[k] for r in rows]
        m = statistics.median(v)
        sd = statistics.stdev(v) / m if len(v) > 1 else 0.0
        print(
            f"{k:10s} median {m:10.1f}  range {min(v) / m:.2f}–{max(v) / m:.2f}×  sd {100 * sd:.1f} %"
        )


if __name__ == "__main__":
    main()
