"""A suite run's cases predicted at a *smoothed* machine speed: each case's speed reading
replaced, field by field, by the median of the ``k`` readings nearest it in time (itself
included; ``k`` = all: the sitting's median), written into a copy of the run directory that
``benchmarks/bench_suite.py --report COPY --repredict --transfer`` then scores as any run.

Why (issue #14, run 21, seen): one case's reference-sidecar reading came out 391 µs where the
sitting's median was 264 µs; the case was priced 1.5× in user space and was the worst outlier.
A single reading per case carries its own noise into that case's prediction; its neighbours'
readings, minutes apart, measure the same machine.

Offline, nothing is measured. Usage::

    .venv/bin/python experiments/suite_smoothed_speed.py RUN/run COPY --k 5
    .venv/bin/python benchmarks/bench_suite.py --report COPY --repredict --transfer \\
        --db RUN/profiles.db --profile NAME
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any

FIELDS = ("local_ns", "cross_ns", "user_ns", "sidecar_ns")


def smoothed(readings: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """Each reading's fields replaced by the median over the ``k`` readings nearest it in
    time (ties: the earlier first; ``k`` ≥ len: all of them)."""
    t = [datetime.fromisoformat(r["measured"]).timestamp() for r in readings]
    out = []
    for i, r in enumerate(readings):
        near = sorted(range(len(readings)), key=lambda j: (abs(t[j] - t[i]), t[j]))[:k]
        s = dict(r)
        for f in FIELDS:
            vals = [readings[j][f] for j in near if readings[j].get(f) is not None]
            if vals and r.get(f) is not None:
                s[f] = statistics.median(vals)
        out.append(s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a suite run's directory (its cases/ and traces/)")
    ap.add_argument("copy", type=Path, help="where to write the copy (must not exist)")
    ap.add_argument("--k", type=int, default=5, help="readings in each median (0: all)")
    a = ap.parse_args()
    if a.copy.exists():
        ap.error(f"{a.copy} exists")
    shutil.copytree(a.run, a.copy)
    files = sorted((a.copy / "cases").glob("*/*.json"))
    docs = [json.loads(f.read_text()) for f in files]
    have = [i for i, d in enumerate(docs) if d.get("case", {}).get("speed_now")]
    readings = [docs[i]["case"]["speed_now"] for i in have]
    new = smoothed(readings, a.k if a.k > 0 else len(readings))
    for i, s in zip(have, new):
        before = docs[i]["case"]["speed_now"].get("sidecar_ns")
        docs[i]["case"]["speed_now"] = s
        files[i].write_text(json.dumps(docs[i], indent=1))
        print(
            f"{docs[i]['key']:42} sidecar {before or 0:9.0f} → {s.get('sidecar_ns') or 0:9.0f} ns"
        )
    print(f"{len(have)} of {len(files)} cases re-read at the median of k={a.k or len(readings)}")


if __name__ == "__main__":
    main()
