"""Measured vs predicted sidecar overhead on the bundled applications (issue 6, Figure 8).

Run as root: ``.venv/bin/python benchmarks/bench_validate.py [--db PROFILES.db] [--profile NAME]
[--topologies bookinfo,online-boutique,hotel-reservation] [--modes tcp,http,grpc] [--rate 200]
[--duration 3] [--quick] [--architecture sidecar|node-l4|waypoint --pods-per-node N]
[--out artifacts/validation]``.

Every query of every topology × every mode (7 × 3 = 21 cases by default), with the profile of
this machine (the newest measured one in the database, or ``--profile``). Writes, per
topology, ``<out>/<topology>.json`` (``meshtax-validation/1``), and for all of them
``<out>/validation.html`` (report builder) and ``<out>/validation.md`` (per-case table and the
summary). Prints the table. Nothing is asserted; the accuracy check lives in
tests/validate/test_run.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from meshtax.app.data import write_document
from meshtax.app.measure import ValidateOptions, validate
from meshtax.model.sidecar import Mode
from meshtax.store.sqlite import ProfileStore
from meshtax.validate.result import CaseResult, ValidationResult
from meshtax.validate.run import machine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--db", default=None, help="profile database (default: $MESHTAX_DB or the user data dir)"
    )
    ap.add_argument("--profile", default=None)
    ap.add_argument("--topologies", default="bookinfo,online-boutique,hotel-reservation")
    ap.add_argument("--queries", default="", help="comma-separated; empty: all of each topology")
    ap.add_argument("--modes", default="tcp,http,grpc")
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--architecture", default="sidecar", help="sidecar, node-l4 or waypoint")
    ap.add_argument("--pods-per-node", type=int, default=1)
    ap.add_argument("--out", default="artifacts/validation")
    ap.add_argument(
        "--keep-traces",
        action="store_true",
        help="keep each case's no-mesh traces in <out>/traces (for validate_repredict.py)",
    )
    a = ap.parse_args()
    store = ProfileStore(a.db) if a.db else ProfileStore()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    results: list[ValidationResult] = []
    for topo in a.topologies.split(","):
        opts = ValidateOptions(
            topo,
            tuple(q for q in a.queries.split(",") if q),
            tuple(Mode(m) for m in a.modes.split(",")),
            rate=a.rate,
            duration_s=a.duration,
            profile_name=a.profile,
            quick=a.quick,
            traces_dir=str(out / "traces") if a.keep_traces else None,
            architecture=a.architecture,
            pods_per_node=a.pods_per_node,
        )
        res = validate(
            opts, store, lambda m: print(f"[{time.monotonic() - t0:6.0f}s] {m}", flush=True)
        )
        write_document(res.to_document(), str(out / f"{topo}.json"), store)
        print(res.table(), flush=True)
        results.append(res)
    cases: tuple[CaseResult, ...] = tuple(c for r in results for c in r.cases)
    everything = ValidationResult(
        "all",
        cases,
        results[0].profile if results else "",
        machine(),
        results[0].options if results else {},
        results[0].notes if results else (),
    )
    doc: dict[str, Any] = everything.to_document()
    doc["wall_s"] = time.monotonic() - t0
    (out / "all.json").write_text(json.dumps(doc, indent=1, default=float))
    write_document([r.to_document() for r in results], str(out / "validation.html"), store)
    s = doc["summary"]
    lines = [
        f"# Validation: measured vs predicted ({len(cases)} cases)",
        "",
        f"Machine: {doc['machine']['host']}; load average at the end {tuple(round(x, 2) for x in os.getloadavg())}; "
        f"profile {everything.profile}; rate {a.rate:g}/s; {a.duration:g} s per run; wall {doc['wall_s']:.0f} s.",
        "",
        everything.table(),
        "",
        "| metric | median abs error | mean signed error (bias) | worst | beyond 30 % |",
        "|---|---|---|---|---|",
    ]
    for m in ("latency", "p90", "mean", "cpu"):
        x = s[m]
        worst = x["worst"] or {"case": "-", "error": float("nan")}
        lines.append(
            f"| {m} | {x['median_abs_error']:.1%} | {x['mean_error']:+.1%} | {worst['case']} "
            f"{worst['error']:+.0%} | {', '.join(x['beyond_30pct']) or '-'} |"
        )
    by_mode = {}
    for mode in a.modes.split(","):
        errs = [c.comparisons for c in cases if c.mode == mode and c.comparisons]
        if errs:
            by_mode[mode] = (
                statistics.fmean(e["latency"].error for e in errs),
                statistics.fmean(e["cpu"].error for e in errs),
            )
    lines += ["", "| mode | mean latency error | mean CPU error |", "|---|---|---|"]
    lines += [f"| {m} | {lat:+.1%} | {cpu:+.1%} |" for m, (lat, cpu) in by_mode.items()]
    (out / "validation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
