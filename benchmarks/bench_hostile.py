"""Scale cliffs of issue #15: many siblings under one parent, very large graphs, large ECG files.

Measures, on the running machine, median and range over ``--repeat`` runs:

* the critical-path kernel (``structure`` + ``propagate``) on one parent with k siblings,
  k = 10^3 … 10^5 (the old pairwise scan was quadratic in k: 44 s at 10^5);
* ``predict_batch`` (every hop priced, both bounds, the what-if-free prediction) on one graph of
  10^6 invocations (a random tree, fan-out 1-20, sequential and parallel siblings);
* ``meshtax predict`` end to end (a subprocess: import, read, validate, predict, print) on a
  10^5-sibling ECG file, JSON and YAML.

    flock /run/meshtax-measure.lock .venv/bin/python benchmarks/bench_hostile.py --out /tmp/h.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from meshtax.model.ecg import BatchBuilder, EcgBatch
from meshtax.model.sidecar import SidecarConfig
from meshtax.predict.critical_path import propagate, structure
from meshtax.predict.engine import predict_batch
from meshtax.store.reference import reference_profile


def siblings(k: int) -> EcgBatch:
    """One root, ``k`` children: back-to-back pairs overlap their neighbours (both rules)."""
    b = BatchBuilder()
    a = b.service("a", SidecarConfig())
    c = b.service("b", SidecarConfig())
    rows = [(-1, -1, a, 100.0, 100.0, 1000.0, 0.0, 10.0 * k + 100)]
    rows += [(0, a, c, 100.0, 100.0, 1000.0, 10.0 * i, 15.0) for i in range(k)]
    b.add_graph("siblings", rows)
    return b.build()


def big_tree(n: int, seed: int = 1) -> EcgBatch:
    """One graph of ``n`` invocations: parents before children, fan-out 1-20, children
    inside their parent's interval, sometimes sequential, sometimes overlapping."""
    rng = np.random.default_rng(seed)
    parent = np.full(n, -1, dtype=np.int64)
    start = np.zeros(n)
    dur = np.zeros(n)
    dur[0] = 1e9
    nxt, frontier = 1, [0]
    while nxt < n:
        new: list[int] = []
        for p in frontier:
            k = min(int(rng.integers(1, 21)), n - nxt)
            if k <= 0:
                break
            slot = dur[p] / (k + 1)
            for j in range(k):
                i = nxt + j
                parent[i] = p
                seq = rng.random() < 0.5
                start[i] = start[p] + (j * slot if seq else rng.random() * slot)
                dur[i] = slot * (0.9 if seq else rng.random())
            new.extend(range(nxt, nxt + k))
            nxt += k
        frontier = new
    b = BatchBuilder()
    s = b.service("s", SidecarConfig())
    b.add_graph(
        "tree",
        zip(
            parent.tolist(),
            [-1] + [s] * (n - 1),
            [s] * n,
            [100.0] * n,
            [100.0] * n,
            [1000.0] * n,
            start.tolist(),
            dur.tolist(),
        ),
    )
    return b.build()


def timed(fn: Callable[[], Any], repeat: int) -> dict[str, float]:
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "n": repeat}


def ecg_file(k: int, path: Path) -> Path:
    invs = [{"id": "r", "callee": "a", "start_us": 0, "duration_us": 10 * k + 100}]
    invs += [
        {"id": f"c{i}", "parent": "r", "callee": "b", "start_us": 10 * i, "duration_us": 15}
        for i in range(k)
    ]
    doc = {"services": {"a": {}, "b": {}}, "invocations": invs}
    if path.suffix == ".json":
        path.write_text(json.dumps(doc))
    else:
        lines = ["services: {a: {}, b: {}}", "invocations:"]
        lines += ["  - " + json.dumps(x).replace('"', "") for x in invs]
        path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--big", type=int, default=1_000_000, help="invocations of the large graph")
    ap.add_argument("--no-cli", action="store_true", help="skip the end-to-end CLI runs")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    prof = reference_profile()
    out: dict[str, Any] = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load": os.getloadavg(),
            "python": sys.version.split()[0],
        },
        "kernel_siblings": {},
    }
    propagate(structure(siblings(10)), np.zeros(11))  # compile once
    for k in (1_000, 10_000, 100_000):
        batch = siblings(k)
        extra = np.full(batch.n_invocations, 5.0)
        r = timed(
            functools.partial(lambda b, x: propagate(structure(b), x), batch, extra), a.repeat
        )
        out["kernel_siblings"][k] = r
        print(f"kernel, {k:>7} siblings: {r['median_s'] * 1e3:8.1f} ms (median of {a.repeat})")
    t0 = time.perf_counter()
    tree = big_tree(a.big)
    build_s = time.perf_counter() - t0
    r = timed(lambda: predict_batch(tree, lambda name: prof), a.repeat)
    out["predict_big"] = {"invocations": a.big, "build_s": build_s, **r}
    print(
        f"predict_batch, one graph of {a.big} invocations: {r['median_s']:.2f} s "
        f"(range {r['min_s']:.2f}-{r['max_s']:.2f}; building the batch: {build_s:.1f} s)"
    )
    if not a.no_cli:
        out["cli"] = {}
        with tempfile.TemporaryDirectory() as d:
            for name in ("sib.json", "sib.yaml"):
                f = ecg_file(100_000, Path(d) / name)
                cmd = [sys.executable, "-m", "meshtax.cli", "predict", str(f)]
                cmd += ["--profile", "reference", "--format", "json", "-o", str(Path(d) / "o")]
                r = timed(
                    functools.partial(subprocess.run, cmd, check=True, capture_output=True), 3
                )
                out["cli"][name] = r
                print(
                    f"meshtax predict, 10^5 siblings ({name}): {r['median_s']:.1f} s (median of 3)"
                )
    if a.out:
        a.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
