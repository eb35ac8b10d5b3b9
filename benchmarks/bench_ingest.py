"""Generation and ingestion throughput of Alibaba-like call graphs.

Generates N synthetic graphs (v2021 or v2022 CSV), then ingests them into a partitioned
Parquet store (hash-bucketed streaming pass + per-bucket graph building). Prints one JSON
line with times, rows/s and the peak resident memory of each phase (each phase runs in its
own process so the peaks do not mix).

    .venv/bin/python benchmarks/bench_ingest.py --graphs 1000000 --dir /tmp/meshtax-bench
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def _phase(args: argparse.Namespace) -> dict[str, float]:
    d = Path(args.dir)
    t = time.perf_counter()
    if args.phase == "generate":
        from meshtax.traces.synth import generate

        s = generate(args.graphs, args.seed, args.version, d / "input.csv")
        out: dict[str, float] = {
            "graphs": s.graphs,
            "calls": s.calls,
            "csv_rows": s.rows,
            "csv_bytes": (d / "input.csv").stat().st_size,
        }
    else:
        from meshtax.traces.alibaba import AlibabaOptions
        from meshtax.traces.api import ingest

        opts = AlibabaOptions(
            bucket_bytes=args.bucket_mb << 20, partition_graphs=args.partition_graphs
        )
        st, rep = ingest(d / "input.csv", d / "store", options=opts, overwrite=True, progress=False)
        out = {
            "graphs": st.n_graphs,
            "calls": st.n_rows,
            "partitions": len(st.partitions),
            "rows_read": rep.rows_read,
        }
    out["seconds"] = round(time.perf_counter() - t, 3)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--version", default="alibaba-v2021")
    ap.add_argument("--dir", default="/tmp/meshtax-bench")
    ap.add_argument("--bucket-mb", type=int, default=256)
    ap.add_argument("--partition-graphs", type=int, default=100_000)
    ap.add_argument("--phase", choices=["generate", "ingest"], default=None)
    a = ap.parse_args()
    if a.phase:
        print(json.dumps(_phase(a)))
        return
    Path(a.dir).mkdir(parents=True, exist_ok=True)
    res = {}
    for ph in ("generate", "ingest"):
        out = subprocess.run(
            [sys.executable, *sys.argv, "--phase", ph], check=True, capture_output=True, text=True
        ).stdout
        res[ph] = json.loads(out.strip().splitlines()[-1])
    res["ingest"]["csv_rows_per_s"] = res["generate"]["csv_rows"] / res["ingest"]["seconds"]
    print(json.dumps({"bench": "ingest", "version": a.version, "bucket_mb": a.bucket_mb, **res}))


if __name__ == "__main__":
    main()
