"""Tail latency under load, predicted vs measured (issue #20): p50/p90/p99 overhead at load
levels of the no-mesh maximum on one hop and on a multi-service topology, and where the
sidecar saturates.

Run as root under the machine's measurement lock::

    flock /run/meshtax-measure.lock .venv/bin/python benchmarks/bench_tail.py \\
        --db DB --out DIR [--profile NAME] [--modes http] [--topologies onehop,bookinfo] \\
        [--levels 25,50,75,90] [--connections 32] [--duration 5] [--pairs 8] [--passes 2] \\
        [--onehop-log]

Without ``--profile`` it first takes a quick profile with capacities (``meshtax profile --quick
--capacity`` for ``--profile-modes``, default tcp,http, into ``DB``; named ``tail-<time>``), so
profile and validation share one sitting. Then, per mode: the one-hop validation (``meshtax
validate --sweep rate``; ``onehop``) and each topology's (``meshtax validate TOPOLOGY --levels
…``), each document written to ``DIR`` (JSON and an HTML report); finally ``DIR/summary.json``
and a table: per percentile the median absolute error and the signed bias over every compared
level, how much a level's two halves (passes) differ, and the saturation rate predicted vs
measured (the mesh side's closed-loop maximum with the same clients) and the profile's own
capacity measurement. Nothing is asserted.

``--speed`` (issue #20, set 7): the machine's speed (the reference workload ``speedref`` on
the profile's client and sidecar CPUs, as ``meshtax validate --speed now``) measured after
the profile, before and after each validation, in ``summary.json`` (``speed``), so a
validation's priced sidecar CPU can be set against the speed it was measured at offline.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from meshtax.app.data import write_document
from meshtax.app.tail_validate import TailValidateOptions, validate_tail
from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends
from meshtax.profile.run import ProfileOptions, run_profile
from meshtax.report.exporters import EXPORTERS
from meshtax.store.sqlite import ProfileStore
from meshtax.testbed.pinning import pinning_of
from meshtax.testbed.speed import speed_on
from meshtax.testbed.system import RealSystem
from meshtax.validate.tail import TailValidation


def summary(results: list[TailValidation], profile: Any) -> dict[str, Any]:
    """Errors over every compared level of every result, per percentile, and saturation."""
    out: dict[str, Any] = {"profile": profile.name, "results": {}}
    for r in results:
        rel = r.options.get("relative_to", "no_mesh")
        out["results"][f"{r.name} ({r.mode}) of the {rel} maximum"] = r.summary()
    for key in ("p50", "p90", "p99"):
        errs = [e for r in results for e in r.errors(key)]
        diffs = [d for r in results for d in r.repeat(key)["diffs"]]
        out[key] = {
            "levels": len(errs),
            "median_abs_error": statistics.median(abs(e) for e in errs) if errs else None,
            "bias": statistics.fmean(errs) if errs else None,
            # the level's halves (passes) against each other, ÷ the level's overhead
            "repeat_median_abs_diff": statistics.median(abs(d) for d in diffs) if diffs else None,
        }
    caps = {m.value: mp.capacity.to_dict() for m, mp in profile.modes.items() if mp.capacity}
    out["profile_capacity"] = caps
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--modes", default="http")
    ap.add_argument("--profile-modes", default="tcp,http", help="modes the quick profile measures")
    ap.add_argument(
        "--topologies", default="onehop,bookinfo", help="onehop and/or topologies in pods"
    )
    ap.add_argument("--query", default=None)
    ap.add_argument("--levels", default="25,50,75,90")
    ap.add_argument("--connections", type=int, default=32)
    # a level's p99 pools every request of its runs: 8 pairs of 5 s give Bookinfo's lowest
    # level (~130/s) some 50 requests beyond its p99 on each side
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--pairs", type=int, default=8, help="pairs per level in each pass")
    ap.add_argument(
        "--passes",
        type=int,
        default=2,
        help="the levels measured this many times over (each level's halves: its repeatability)",
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=1.0,
        help="seconds of unrecorded load per side before each level's pairs in each pass",
    )
    ap.add_argument(
        "--speed",
        action="store_true",
        help="measure the machine's speed after the profile and around each validation",
    )
    ap.add_argument(
        "--onehop-log",
        action="store_true",
        help="one hop's fixed-rate runs keep fortio's access log (exact percentiles; the "
        "histogram's beside them), which costs the client CPU at high rates (set 9)",
    )
    ap.add_argument(
        "--relative",
        default="no_mesh,mesh",
        help="Levels as shares of whose closed-loop maximum: no_mesh (the issue's), mesh (every "
        "level below the mesh's saturation), or both.",
    )
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    store = ProfileStore(a.db)
    t0 = time.monotonic()

    def say(m: str) -> None:
        print(f"[{time.monotonic() - t0:5.0f}s] {m}", flush=True)

    loads = {"start": os.getloadavg()}
    if a.profile is None:
        name = f"tail-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}"
        pm = tuple(a.profile_modes.split(","))
        opts = ProfileOptions(name=name, quick=True, capacity=True, modes=pm)
        # waits for another testbed run (a root test) as the validations do
        be = Backends(lock_timeout=900.0)
        prof = run_profile(opts, RealSystem(), store, lambda p: say(p.description), backends=be)
        say(f"profile {name} stored in {a.db}")
    else:
        prof = store.get(a.profile)
    loads["profiled"] = os.getloadavg()
    speeds: list[dict[str, Any]] = []

    def speed(when: str) -> None:
        if a.speed:  # a failure is recorded, never the end of the validations
            try:
                got, why = speed_on(RealSystem(), pinning_of(prof))
            except Exception as e:  # noqa: BLE001
                got, why = None, f"{type(e).__name__}: {e}"
            speeds.append({"when": when, **(got.to_dict() if got else {"error": why})})
            say(f"speed {when}: {speeds[-1]}")

    speed("profiled")
    levels = tuple(float(x) / 100 for x in a.levels.split(","))
    results: list[TailValidation] = []
    for mode in (Mode(m) for m in a.modes.split(",")):
        where = [None if t == "onehop" else t for t in a.topologies.split(",")]
        for topology, rel in itertools.product(where, a.relative.split(",")):
            stem = f"{'onehop' if topology is None else topology}-{mode.value}-of-{rel}"
            o = TailValidateOptions(
                topology,
                a.query,
                mode,
                levels,
                a.connections,
                a.duration,
                a.pairs,
                prof.name,
                accept_unclosed=True,
                # a topology's traces per level stay, so the runs can be predicted again
                keep_dir=None if topology is None else str(out / f"{stem}-work"),
                relative_to=rel,
                passes=a.passes,
                settle_s=a.settle,
                onehop_log=a.onehop_log,
            )
            speed(f"before {stem}")
            r = validate_tail(o, store, say)
            speed(f"after {stem}")
            results.append(r)
            doc = r.to_document()
            (out / f"{stem}.json").write_text(EXPORTERS["json"].export(doc))
            write_document(doc, str(out / f"{stem}.html"), store)
            print(f"\n{stem}, {a.connections} connections:\n{r.table()}\n")
            loads[stem] = os.getloadavg()
    s = summary(results, prof)
    s["loadavg"] = loads
    s["speed"] = speeds
    s["profile_speed"] = prof.speed.to_dict() if prof.speed else None
    s["wall_s"] = time.monotonic() - t0
    (out / "summary.json").write_text(json.dumps(s, indent=2, default=str))
    for key in ("p50", "p90", "p99"):
        v = s[key]
        if v["levels"]:
            rep = v["repeat_median_abs_diff"]
            print(
                f"{key}: median |error| {v['median_abs_error']:.1%}, bias {v['bias']:+.1%} "
                f"over {v['levels']} levels; the halves of a level differ by a median "
                + ("-" if rep is None else f"{rep:.1%}")
            )
    for r in results:
        sat = r.summary()["saturation"]
        print(
            f"saturation {r.name} ({r.mode}): predicted {sat['predicted']:.0f}/s, measured "
            f"{sat['measured']:.0f}/s ({sat['error']:+.1%})"
        )
    print(f"load average {loads}; wall {s['wall_s']:.0f} s; documents in {out}")


if __name__ == "__main__":
    main()
