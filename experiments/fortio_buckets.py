"""How fortio's histogram reads a known latency shift (issue #18): the no-mesh latencies of a
stored validation (its kept traces' graphs, moved to the client's measured no-mesh p50), shifted
by the case's measured mean overhead, p50 taken (a) exactly and (b) as fortio's histogram at
1 µs resolution does (buckets ]…, 900, 1000, 2000, 3000, 4000, 5000, 7500, …] µs, linear within
a bucket, the first and last clamped to the run's min and max). Measures nothing.

``PYTHONPATH=src .venv/bin/python experiments/fortio_buckets.py --doc artifacts/s6/validate/node-l4/all.json [more …]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

import meshtax.validate.prediction as vp
from meshtax.model.sidecar import Mode, SidecarConfig

# fortio's bucket boundaries (stats.go histogramBucketValues), in units of the resolution
EDGES = (
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 16, 18, 20, 25, 30, 35, 40, 45, 50]
    + [60, 70, 80, 90, 100, 120, 140, 160, 180, 200, 250, 300, 350, 400, 450, 500]
    + [600, 700, 800, 900, 1000, 2000, 3000, 4000, 5000, 7500, 10000]
    + [20000, 30000, 40000, 50000, 75000, 100000]
)


def fortio_p50(x: np.ndarray, resolution_us: float = 1.0) -> float:
    """p50 as fortio's histogram reports it."""
    edges = np.asarray(EDGES, dtype=float) * resolution_us
    counts, _ = np.histogram(x, bins=np.concatenate((edges, [np.inf])))
    target = 0.5 * len(x)
    cum = 0.0
    for i, n in enumerate(counts):
        if cum + n >= target and n > 0:
            lo = max(edges[i], x.min())
            hi = min(edges[i + 1] if i + 1 < len(edges) else x.max(), x.max())
            return float(lo + (hi - lo) * (target - cum) / n)
        cum += n
    return float(x.max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--doc", nargs="+", required=True)
    ap.add_argument("--db", default="artifacts/s6/profiles.db", help="holds the docs' profile")
    a = ap.parse_args()
    global _DB
    _DB = a.db
    captured: list[Any] = []
    real = vp.summarize

    def grab(bp: Any, rate: float, warnings: tuple[str, ...] = ()) -> Any:
        captured.append(bp)
        return real(bp, rate, warnings)

    vp.summarize = grab
    print(
        "| doc | case | no-mesh p50 measured | shift (measured mean ovh) | exact p50 gap "
        "| fortio p50 gap | fortio/exact | measured p50 ovh |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for d in a.doc:
        doc = json.loads(Path(d).read_text())
        traces = Path(d).parent / "traces"
        for c in doc["cases"]:
            t = traces / f"{c['name'].replace('/', '-')}-{c['mode']}.json"
            if not t.exists():
                continue
            sidecars = {s: SidecarConfig(Mode(m)) for s, m in c["sidecar_modes"].items()}
            captured.clear()
            # any profile: only the graphs' no-mesh latencies are used
            vp.predict_traces(t, _profile(doc), sidecars, c["rate"])
            base = np.asarray(captured[-1].base_latency_us, dtype=float)
            x0 = base - np.percentile(base, 50) + c["no_mesh"]["p50_us"]
            shift = c["latency_mean"]["measured"]
            x1 = x0 + shift
            exact = float(np.percentile(x1, 50) - np.percentile(x0, 50))
            fort = fortio_p50(x1) - fortio_p50(x0)
            where = f"{Path(d).parent.parent.name}/{Path(d).parent.name}"
            print(
                f"| {where} | {c['name']} | {c['no_mesh']['p50_us']:.0f} | {shift:.0f} "
                f"| {exact:.0f} | {fort:.0f} | {fort / exact:.2f} | {c['latency']['measured']:.0f} |"
            )


_CACHE: dict[str, Any] = {}


def _profile(doc: dict[str, Any]) -> Any:
    from meshtax.store.sqlite import ProfileStore

    key = doc["profile"]
    if key not in _CACHE:
        _CACHE[key] = ProfileStore(_DB).get(key)
    return _CACHE[key]


_DB = ""  # --db: the docs' profile prices nothing here, only the no-mesh latencies are used

if __name__ == "__main__":
    main()
