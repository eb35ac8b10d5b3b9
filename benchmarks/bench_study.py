"""Study throughput: the paper's five configurations over an ingested store.

Run benchmarks/bench_ingest.py first (it leaves the store in --dir/store). The profile is the
bundled reference (published per-mode totals) plus PLACEHOLDER filter models so that the two
"five filters" configurations run: numbers they produce are for timing only, not predictions.
Prints one JSON line: seconds, graphs/s, invocations/s, peak resident memory.

    .venv/bin/python benchmarks/bench_study.py --dir /tmp/meshtax-bench [--engine dask]
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from dataclasses import replace

from meshtax.model.components import filter_component
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.profile import Profile
from meshtax.store.reference import reference_profile
from meshtax.study import PAPER_FILTERS, run_study


def bench_profile() -> Profile:
    p = reference_profile()
    modes = {}
    for m, mp in p.modes.items():
        comps = dict(mp.components)
        for f in PAPER_FILTERS:
            comps[filter_component(f)] = ComponentModel(
                CostModel(5.0, note="placeholder"), CostModel(5.0, note="placeholder")
            )
        modes[m] = replace(mp, components=comps)
    return replace(p, name="bench-placeholder-filters", modes=modes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/meshtax-bench")
    ap.add_argument("--engine", default="local", choices=["local", "dask"])
    ap.add_argument("--scheduler", default=None)
    a = ap.parse_args()
    t = time.perf_counter()
    s = run_study(
        f"{a.dir}/store",
        None,
        bench_profile(),
        f"{a.dir}/study-{a.engine}",
        engine=a.engine,
        scheduler=a.scheduler,
        progress=False,
    )
    sec = time.perf_counter() - t
    print(
        json.dumps(
            {
                "bench": "study",
                "engine": a.engine,
                "graphs": s.graphs,
                "calls": s.calls,
                "partitions": s.partitions,
                "configs": list(s.configs),
                "seconds": sec,
                "graphs_per_s": s.graphs / sec,
                "calls_per_s_per_config": s.calls * len(s.configs) / sec,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


if __name__ == "__main__":
    main()
