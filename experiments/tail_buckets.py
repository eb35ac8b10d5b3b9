"""How wide fortio's histogram bucket is where one hop's measured percentiles fall (issue #20):
for each stored tail validation's levels, each side's pooled p50/p90/p99 (as the record pools
its runs), the fortio bucket it lies in (1 µs resolution: ≤ 10 % wide below 1 ms, 1 ms wide
from 1 to 5 ms), and the overhead's range if each side's true percentile may lie anywhere in
its bucket (the counts place it in that bucket exactly; only the position within is linear
interpolation). Where the runs kept every request's latency (an access log) and the
histogram's quantiles beside them (``histogram_quantiles_us``, since set 9), the overhead
read from the histogram against the requests' own: the buckets' error itself. Measures nothing.

``PYTHONPATH=src .venv/bin/python experiments/tail_buckets.py DOC.json [DOC.json …]``
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from meshtax.validate.tail import TailRun, _pooled

# fortio's bucket boundaries (stats.go histogramBucketValues), µs at 1 µs resolution
EDGES = np.asarray(
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 16, 18, 20, 25, 30, 35, 40, 45, 50]
    + [60, 70, 80, 90, 100, 120, 140, 160, 180, 200, 250, 300, 350, 400, 450, 500]
    + [600, 700, 800, 900, 1000, 2000, 3000, 4000, 5000, 7500, 10000]
    + [20000, 30000, 40000, 50000, 75000, 100000],
    dtype=float,
)


def bucket(v: float) -> tuple[float, float]:
    """The fortio bucket ]lo, hi] holding ``v`` µs."""
    i = int(np.searchsorted(EDGES, v, side="left"))
    if i >= len(EDGES):
        return float(EDGES[-1]), float("inf")
    return float(EDGES[max(i - 1, 0)]), float(EDGES[i])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("docs", nargs="+")
    ap.add_argument("--percentiles", default="50,90,99")
    ap.add_argument(
        "--histogram-doc",
        default="",
        help="write a copy of the (one) document with every run's quantiles the histogram's "
        "(its runs' histogram_quantiles_us), to score the model on the buckets' reading",
    )
    a = ap.parse_args()
    if a.histogram_doc:
        d = json.loads(Path(a.docs[0]).read_text())
        for pt in d.get("tail", d)["points"]:
            for r in pt.get("runs", []):
                for side in ("no_mesh", "mesh"):
                    h = r[side].get("histogram_quantiles_us")
                    if not h:
                        raise SystemExit(f"{a.docs[0]}: a run without histogram_quantiles_us")
                    r[side]["quantiles_us"] = h
        Path(a.histogram_doc).write_text(json.dumps(d))
    ps = [float(x) for x in a.percentiles.split(",")]
    print(
        "| doc | level | rate/s | p | no mesh µs (bucket) | mesh µs (bucket) | overhead µs | "
        "overhead range if anywhere in the buckets | ± ÷ overhead |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    rel: dict[float, list[float]] = {p: [] for p in ps}
    hist_err: dict[float, list[float]] = {p: [] for p in ps}
    for doc in a.docs:
        d = json.loads(Path(doc).read_text())
        for pt in d.get("tail", d)["points"]:
            if not pt.get("sustained", True) or not pt.get("runs"):
                continue
            runs = {s: [TailRun.from_dict(r[s]) for r in pt["runs"]] for s in ("no_mesh", "mesh")}
            for p in ps:
                v = {s: _pooled(rs, p / 100) for s, rs in runs.items()}
                b = {s: bucket(x) for s, x in v.items()}
                oh = v["mesh"] - v["no_mesh"]
                lo = b["mesh"][0] - b["no_mesh"][1]
                hi = b["mesh"][1] - b["no_mesh"][0]
                half = (hi - lo) / 2
                r = half / abs(oh) if oh else float("inf")
                if pt["fraction"] != 0.6:
                    rel[p].append(r)
                if all(x.histogram_quantiles_us for rs in runs.values() for x in rs):
                    h = {
                        s: _pooled(
                            [replace(x, quantiles_us=x.histogram_quantiles_us) for x in rs], p / 100
                        )
                        for s, rs in runs.items()
                    }
                    hoh = h["mesh"] - h["no_mesh"]
                    if pt["fraction"] != 0.6 and oh:
                        hist_err[p].append(hoh / oh - 1)
                    print(
                        f"|  | histogram | | p{p:g} | {h['no_mesh']:.0f} | {h['mesh']:.0f} | {hoh:.0f} | "
                        f"exact {oh:.0f} | {hoh / oh - 1:+.0%} |"
                    )
                print(
                    f"| {Path(doc).parent.name} | {pt['fraction']:g} | {pt['rate']:.0f} | p{p:g} | "
                    f"{v['no_mesh']:.0f} ({b['no_mesh'][0]:.0f}–{b['no_mesh'][1]:.0f}) | "
                    f"{v['mesh']:.0f} ({b['mesh'][0]:.0f}–{b['mesh'][1]:.0f}) | {oh:.0f} | "
                    f"{lo:.0f} … {hi:.0f} | {r:.0%} |"
                )
    for p, xs in hist_err.items():
        if xs:
            print(
                f"p{p:g}: the histogram's overhead ÷ the exact one − 1, median |·| "
                f"{np.median(np.abs(xs)):.0%}, mean {np.mean(xs):+.0%} over {len(xs)} levels"
            )
    for p, xs in rel.items():
        if xs:
            print(
                f"p{p:g}: bucket half range ÷ overhead, median {np.median(xs):.0%}, "
                f"max {max(xs):.0%} over {len(xs)} levels (60 % levels left out)"
            )


if __name__ == "__main__":
    main()
