"""CPU overhead per request of 1-, 2-, 4- and 8-service HTTP chains at a low and a high rate (issue 6).

Run as root under the measurement lock: ``flock /run/meshtax-measure.lock .venv/bin/python
experiments/bench_chain_rates.py --db PROFILES.db --profile NAME [--rates 100,1000]``.

The question it answers: when an application's pods share a CPU, is the extra CPU a message
costs at a low request rate paid per crossing at each sidecar's own rate (as a one-hop
profile measures it), per request, or per crossing at the rate the shared CPU sees? Every pod
on one CPU (the profile's placement), http mode, fortio at each rate; prints, per chain and
rate, measured CPU-µs per request and per crossing with the prediction of the engine (which
prices at the shared CPU's rate, ``predict.shared_cpu.shared_cpu_rates``). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json

from meshtax.app.measure import ValidateOptions, validate
from meshtax.model.sidecar import Mode
from meshtax.store.sqlite import ProfileStore

# crossings per request: client → s1 is one sidecar (2 crossings), every further hop two (4)
CROSSINGS = {"one": 2, "two": 6, "four": 14, "eight": 30}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=None)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--rates", default="100,1000")
    a = ap.parse_args()
    store = ProfileStore(a.db) if a.db else ProfileStore()
    rows = []
    for rate in (float(r) for r in a.rates.split(",")):
        opts = ValidateOptions(
            "chain",
            modes=(Mode.HTTP,),
            rate=rate,
            duration_s=3.0,
            profile_name=a.profile,
            min_pairs=6,
            max_pairs=8,
        )
        for c in validate(opts, store, lambda m: print(m, flush=True)).cases:
            if c.error is not None:
                rows.append({"rate": rate, "chain": c.query, "error": c.error})
                continue
            k = c.comparisons["cpu"]
            n = CROSSINGS[c.query]
            rows.append(
                {
                    "rate": rate,
                    "chain": c.query,
                    "crossings": n,
                    "cpu_us_per_request": k.measured.median,
                    "ci": [k.measured.lo, k.measured.hi],
                    "per_crossing": k.measured.median / n,
                    "predicted_per_request": k.predicted,
                    "error": k.error,
                }
            )
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
