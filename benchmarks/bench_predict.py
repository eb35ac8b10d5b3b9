"""Prediction throughput: invocations per second of `predict_batch`.

Cases (issue #2): one ECG of 10, 100 and 10 000 invocations, and 100 000 small ECGs
(10 invocations each) in one batch. Random trees with sequential and parallel siblings,
every service meshed (http), reference profile. The batch is built once; the timed part is
the prediction (hop costs + three critical-path propagations + breakdowns).
Prints a JSON line per case with the median and the min–max over repeats.

    .venv/bin/python benchmarks/bench_predict.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

from meshtax.model.ecg import BatchBuilder, EcgBatch
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.engine import predict_batch, single_profile
from meshtax.store.reference import reference_profile
from meshtax.testbed.host import cpu_model


def random_batch(n_graphs: int, size: int, seed: int = 1) -> EcgBatch:
    rng = np.random.default_rng(seed)
    b = BatchBuilder()
    svcs = [b.service(f"s{i}", SidecarConfig(Mode.HTTP)) for i in range(50)]
    for g in range(n_graphs):
        parents = (
            np.concatenate([[-1], rng.integers(0, np.arange(1, size))])
            if size > 1
            else np.array([-1])
        )
        start = np.zeros(size)
        dur = np.zeros(size)
        dur[0] = 10_000.0
        callee = rng.integers(0, 50, size)
        rows = []
        for i in range(size):
            p = int(parents[i])
            if p >= 0:
                # a child inside its parent's window: random start, random share of what is left
                lo, hi = start[p], start[p] + dur[p]
                start[i] = lo + rng.random() * (hi - lo) * 0.5
                dur[i] = (hi - start[i]) * rng.random()
            rows.append(
                (
                    p,
                    -1 if p < 0 else svcs[callee[p]],
                    svcs[callee[i]],
                    100.0,
                    100.0,
                    1000.0,
                    start[i],
                    dur[i],
                )
            )
        b.add_graph(f"g{g}", rows)
    return b.build()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    look = single_profile(reference_profile())
    predict_batch(
        random_batch(2, 5), look
    )  # compile the kernel (cached on disk after the first run)
    cases = [
        ("1 ECG x 10", 1, 10),
        ("1 ECG x 100", 1, 100),
        ("1 ECG x 10 000", 1, 10_000),
        ("100 000 ECGs x 10", 100_000, 10),
    ]
    print(
        json.dumps(
            {
                "machine": {
                    "cpu": cpu_model(),
                    "cores": 2,
                    "kernel": platform.release(),
                    "python": platform.python_version(),
                }
            }
        )
    )
    for name, graphs, size in cases:
        batch = random_batch(graphs, size)
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            predict_batch(batch, look)
            times.append(time.perf_counter() - t)
        n = batch.n_invocations
        med = statistics.median(times)
        print(
            json.dumps(
                {
                    "case": name,
                    "invocations": n,
                    "median_s": round(med, 6),
                    "min_s": round(min(times), 6),
                    "max_s": round(max(times), 6),
                    "invocations_per_s_median": round(n / med),
                    "invocations_per_s_range": [round(n / max(times)), round(n / min(times))],
                }
            )
        )


if __name__ == "__main__":
    main()
