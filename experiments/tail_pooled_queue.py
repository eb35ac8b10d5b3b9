"""One hop's and a topology's queue bound read from the capacity ramps' queue pooled over
profiles (issue #20, set 18's candidate ``s18-pooled-queue``; ``TailOptions.ramp_pooled``,
``ramp_queue.pooled_queue``) against the profile's own single runs: per set and pooled, each
scored level's predicted ÷ measured p90/p99 as ``tail_bias_saturation.py`` scores them (60 %
left out), with the table pooled over every given set's profile (``in``), over the *other*
sets' profiles (``out``: leave one set out) or the one frozen before set 18 (``frozen``); then
the pooled table at p90/p99 and each profile's own queue there. Offline: nothing is measured.

``.venv/bin/python experiments/tail_pooled_queue.py --set DB ONEHOP TOPO [--set …] [--print-table]``
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import Any

import tail_variants as tv
from _pooled_queue_s10_17 import POOLED_QUEUE_S10_17
from _tail_sets import add_sets, set_profile
from tail_bias_saturation import level_errors, set_docs

from meshtax.model.capacity import SKETCH_PROBS
from meshtax.model.sidecar import Mode
from meshtax.predict.ramp_queue import POOL_FRACTIONS, RampQueue, pooled_queue, ramp_queue

BASE = "s13-ramp-shape"


def own_queue(prof: Any) -> RampQueue:
    mp = prof.modes[Mode.HTTP]
    rq = ramp_queue(mp) if mp is not None else None
    assert rq is not None, "a profile without a ramp queue"
    return rq


def score(name: str, sets: list[tuple[str, Any, Any]], tables: dict[str, Any] | None) -> None:
    """Print one variant's per-set table and the pooled medians; ``tables``: per set name the
    ``ramp_pooled`` table to use (None: the base model)."""
    print(f"\n## {name}\n")
    print("| set | topology | 25 % | 50 % | 75 % | 90 % | p90 / p99 bias | p90 / p99 median abs |")
    print("|---|---|---|---|---|---|---|---|")
    pooled: dict[str, dict[str, list[float]]] = {}
    for sname, prof, docs in sets:
        variant = BASE
        if tables is not None:
            variant = f"{name}:{sname}"
            tv.VARIANTS[variant] = {**tv.VARIANTS[BASE], "ramp_pooled": tables[sname]}
        got = level_errors(docs, prof, variant)
        for topo, rows in got.items():
            per: dict[str, list[float]] = {"p90": [], "p99": []}
            cells = []
            for f in sorted(x for x in rows if x > 0):
                r = rows[f]
                cells.append(f"{r['p90']:.2f} / {r['p99']:.2f}")
                for k in ("p90", "p99"):
                    per[k].append(r[k] - 1)
                    for key in ("all", topo, sname):
                        pooled.setdefault(key, {"p90": [], "p99": []})[k].append(r[k] - 1)
            bias = " / ".join(f"{statistics.fmean(per[k]):+.0%}" for k in ("p90", "p99"))
            mae = " / ".join(f"{statistics.median(abs(x) for x in per[k]):.0%}" for k in per)
            print(f"| {sname} | {topo} | " + " | ".join(cells) + f" | {bias} | {mae} |")
    print(
        "\n| pooled over | p90 median abs (bias) | p99 median abs (bias) | p90 / p99 median |ln| |"
    )
    print("|---|---|---|---|")
    for key, v in pooled.items():
        c = [
            f"{statistics.median(abs(x) for x in v[k]):.0%} ({statistics.fmean(v[k]):+.0%})"
            for k in ("p90", "p99")
        ]
        ln = " / ".join(
            f"{statistics.median(abs(math.log1p(x)) for x in v[k]):.3f}" for k in ("p90", "p99")
        )
        print(f"| {key} | {c[0]} | {c[1]} | {ln} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sets(ap)
    ap.add_argument("--print-table", action="store_true", help="print the table pooled over all")
    ap.add_argument(
        "--modes", default="base,in,out", help="which of base, in, out, frozen to score"
    )
    a = ap.parse_args()
    sets = []
    queues: dict[str, RampQueue] = {}
    for db, onehop, topo in a.set:
        name = Path(topo).parent.name
        prof = set_profile(db, onehop)
        sets.append((name, prof, set_docs(onehop, topo)))
        queues[name] = own_queue(prof)
    every = pooled_queue(list(queues.values()))
    probs = list(SKETCH_PROBS)
    print(f"pooled over {len(queues)} profiles at fractions {POOL_FRACTIONS}:")
    for k, p in (("p90", 0.9), ("p99", 0.99)):
        i = probs.index(p)
        print(f"  {k} requests' worth, pooled: " + " ".join(f"{x:.2f}" for x in every.queue[:, i]))
        for name, q in queues.items():
            row = [float(q.at(f, [p])[0]) for f in POOL_FRACTIONS]
            print(f"    {name}: " + " ".join(f"{x:.2f}" for x in row))
    if a.print_table:
        print("\nPOOLED_QUEUE =", repr(every.table()))
    modes = a.modes.split(",")
    if "base" in modes:
        score(BASE, sets, None)
    if "in" in modes:
        score(
            "s18-pooled-queue (in: every set's profile)", sets, {n: every.table() for n in queues}
        )
    if "frozen" in modes:  # the table registered before set 18 (sets 10–17's profiles)
        frozen = {n: POOLED_QUEUE_S10_17 for n in queues}
        score("s18-pooled-queue (frozen: sets 10–17's profiles)", sets, frozen)
    if "out" in modes:
        out = {n: pooled_queue([q for m, q in queues.items() if m != n]).table() for n in queues}
        score("s18-pooled-queue (out: the other sets' profiles)", sets, out)


if __name__ == "__main__":
    main()
