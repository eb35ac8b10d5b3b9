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

Architectures side by side (issue #18): ``--architectures sidecar,node-l4,waypoint`` runs the
same cases in each, one after the other in one sitting, each into ``<out>/<architecture>/``;
node proxies and waypoints are priced with this machine's newest profile of their role in the
database (``meshtax profile --architecture ...``), the sidecars with ``--profile``.
``--topologies`` items may name queries, ``topology:query[+query]`` (e.g.
``chain:four,bookinfo:productpage,online-boutique:index``). ``<out>/architectures.md`` has, per
architecture, the median absolute error of latency and CPU overhead and whether it is within
the sidecar's on the same cases.
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


def _cases(spec: str, queries: str) -> list[tuple[str, tuple[str, ...]]]:
    """``topology`` or ``topology:query[+query]`` items; ``--queries`` applies to the bare ones."""
    out = []
    for item in spec.split(","):
        topo, _, qs = item.partition(":")
        names = qs.split("+") if qs else [q for q in queries.split(",") if q]
        out.append((topo, tuple(q for q in names if q)))
    return out


def run_architecture(
    a: argparse.Namespace, arch: str, store: ProfileStore, out: Path, t0: float
) -> list[ValidationResult]:
    """Every case in one architecture, into ``out``; its files and tables as before."""
    out.mkdir(parents=True, exist_ok=True)
    results: list[ValidationResult] = []
    for topo, queries in _cases(a.topologies, a.queries):
        opts = ValidateOptions(
            topo,
            queries,
            tuple(Mode(m) for m in a.modes.split(",")),
            rate=a.rate,
            duration_s=a.duration,
            profile_name=a.profile,
            accept_unclosed=a.accept_unclosed,
            quick=a.quick,
            traces_dir=str(out / "traces") if a.keep_traces else None,
            architecture=arch,
            pods_per_node=a.pods_per_node,
        )
        res = validate(
            opts,
            store,
            lambda m: print(f"[{time.monotonic() - t0:6.0f}s] {arch}: {m}", flush=True),
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
        tuple(dict.fromkeys(n for r in results for n in r.notes)),
    )
    doc: dict[str, Any] = everything.to_document()
    doc["wall_s"] = time.monotonic() - t0
    doc["architecture"] = arch
    (out / "all.json").write_text(json.dumps(doc, indent=1, default=float))
    write_document([r.to_document() for r in results], str(out / "validation.html"), store)
    s = doc["summary"]
    lines = [
        f"# Validation: measured vs predicted ({len(cases)} cases, {arch})",
        "",
        f"Machine: {doc['machine']['host']}; load average at the end {tuple(round(x, 2) for x in os.getloadavg())}; "
        f"profile {everything.profile}; rate {a.rate:g}/s; {a.duration:g} s per run; wall {doc['wall_s']:.0f} s.",
        "",
        *(f"- {n}" for n in everything.notes),
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
    return results


def _median_abs(results: list[ValidationResult], metric: str) -> tuple[int, float, float]:
    errs = [c.comparisons[metric].error for r in results for c in r.cases if c.comparisons]
    if not errs:
        return 0, float("nan"), float("nan")
    return len(errs), statistics.median(abs(e) for e in errs), statistics.fmean(errs)


def compare_architectures(by_arch: dict[str, list[ValidationResult]]) -> str:
    """Per architecture: cases, median absolute error of latency and CPU overhead (and the
    signed mean), and whether each is within the sidecar's on the same cases."""
    side = by_arch.get("sidecar")
    ref = {m: _median_abs(side, m)[1] for m in ("latency", "cpu")} if side else {}
    lines = [
        "| architecture | cases | latency: median abs error (mean signed) | CPU: median abs "
        "error (mean signed) | within the sidecar's (latency / CPU) | priced with |",
        "|---|---:|---:|---:|---|---|",
    ]
    for arch, results in by_arch.items():
        n, lat, lat_b = _median_abs(results, "latency")
        _, cpu, cpu_b = _median_abs(results, "cpu")
        within = (
            "—"
            if arch == "sidecar" or not ref
            else " / ".join(
                "yes" if v <= ref[m] else "no" for m, v in (("latency", lat), ("cpu", cpu))
            )
        )
        priced = "; ".join(
            dict.fromkeys(
                [f"sidecar {results[0].profile}" if results else ""]
                + [n for r in results for n in r.notes if "priced from" in n]
            )
        )
        lines.append(
            f"| {arch} | {n} | {lat:.1%} ({lat_b:+.1%}) | {cpu:.1%} ({cpu_b:+.1%}) | {within} "
            f"| {priced} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--db", default=None, help="profile database (default: $MESHTAX_DB or the user data dir)"
    )
    ap.add_argument("--profile", default=None)
    ap.add_argument(
        "--topologies",
        default="bookinfo,online-boutique,hotel-reservation",
        help="comma-separated; an item may name queries: topology:query[+query]",
    )
    ap.add_argument("--queries", default="", help="comma-separated; empty: all of each topology")
    ap.add_argument("--modes", default="tcp,http,grpc")
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--architecture", default="sidecar", help="sidecar, node-l4 or waypoint")
    ap.add_argument(
        "--architectures",
        default="",
        help="several, one after the other on the same cases (e.g. sidecar,node-l4,waypoint); "
        "each into <out>/<architecture>/, compared in <out>/architectures.md",
    )
    ap.add_argument("--pods-per-node", type=int, default=1)
    ap.add_argument("--accept-unclosed", action="store_true")
    ap.add_argument("--out", default="artifacts/validation")
    ap.add_argument(
        "--keep-traces",
        action="store_true",
        help="keep each case's no-mesh traces in <out>/traces (for validate_repredict.py)",
    )
    a = ap.parse_args()
    store = ProfileStore(a.db) if a.db else ProfileStore()
    out = Path(a.out)
    t0 = time.monotonic()
    if not a.architectures:
        run_architecture(a, a.architecture, store, out, t0)
        return
    by_arch: dict[str, list[ValidationResult]] = {}
    for arch in a.architectures.split(","):
        by_arch[arch] = run_architecture(a, arch, store, out / arch, t0)
    table = compare_architectures(by_arch)
    head = (
        f"# Validation per architecture, same cases, one sitting\n\ncases: {a.topologies}; "
        f"modes {a.modes}; rate {a.rate:g}/s; {a.pods_per_node} pod(s) a node for node-l4 and "
        f"waypoint; wall {time.monotonic() - t0:.0f} s\n\n"
    )
    (out / "architectures.md").write_text(head + table + "\n")
    print(head + table)


if __name__ == "__main__":
    main()
