"""One hop's measured tail overhead against the profile's own capacity ramp (issue #20): per
validation level, the ramp's overhead at p (its fixed-rate run through the sidecar − its run
without, from their latency quantiles) interpolated in log rate at the level's rate (held
beyond the runs), beside what the level measured and what the queueing model predicted
(the model's, as the validation recorded it). Offline, on stored documents; measures nothing.

    .venv/bin/python experiments/tail_ramp_onehop.py --db DB --doc DIR/onehop-http-of-mesh.json

Why: the validation's one-hop bed is the profile's own; if the ramp's 2 s runs show what a
level's pairs measure, the one-hop misses near ρ = 1 are the queueing model's, not the price's
or the measurement's.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from meshtax.model.capacity import SKETCH_PROBS
from meshtax.model.sidecar import Mode
from meshtax.store.sqlite import ProfileStore
from meshtax.validate.tail import TailPoint, TailRun

PCTS = ("p50", "p90", "p99")


def ramp_overheads(db: str, name: str, mode: Mode) -> list[tuple[float, dict[str, float]]]:
    """(rate, overhead per percentile) of every fixed-rate ramp run with a direct twin."""
    cap = ProfileStore(db).get(name).modes[mode].capacity
    if cap is None:
        raise SystemExit(f"{name}: no capacity ramp")
    pr = np.asarray(SKETCH_PROBS)
    direct = {p.target: p for p in cap.points if not p.meshed and p.target > 0 and p.quantiles_us}
    out = []
    for p in sorted(cap.points, key=lambda x: x.achieved):
        d = direct.get(p.target)
        if not p.meshed or d is None or not p.quantiles_us or p.achieved <= 0:
            continue
        ov = {
            k: float(np.interp(float(k[1:]) / 100, pr, p.quantiles_us))
            - float(np.interp(float(k[1:]) / 100, pr, d.quantiles_us))
            for k in PCTS
        }
        out.append((p.achieved, ov))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--doc", required=True)
    a = ap.parse_args()
    doc = json.loads(Path(a.doc).read_text())
    if doc["tail"]["topology"] != "one-hop":
        raise SystemExit(f"{a.doc}: not a one-hop validation")
    ramp = ramp_overheads(a.db, doc["profile"], Mode(doc["tail"]["mode"]))
    x = np.log([r for r, _ in ramp])
    print("| level | rate/s | " + " | ".join(f"{k} ramp / measured / model" for k in PCTS) + " |")
    print("|---|---|" + "---|" * len(PCTS))
    errs: dict[str, list[float]] = {k: [] for k in PCTS}
    for d in doc["tail"]["points"]:
        pairs = tuple(
            (TailRun.from_dict(r["no_mesh"]), TailRun.from_dict(r["mesh"])) for r in d["runs"]
        )
        pt = TailPoint(float(d["fraction"]), float(d["rate"]), pairs)
        pred = (d.get("predicted") or {}).get("overhead_us", {})
        cells = []
        for k in PCTS:
            r = float(np.interp(np.log(pt.rate), x, [ov[k] for _, ov in ramp]))
            m = pt.measured(k).median
            model = float(pred.get(k, {}).get("value", float("nan")))
            cells.append(f"{r:.0f} / {m:.0f} / {model:.0f}")
            if m:
                errs[k].append((r - m) / m)
        print(f"| {pt.fraction:.0%} | {pt.rate:.0f} | " + " | ".join(cells) + " |")
    for k, e in errs.items():
        if e:
            print(
                f"{k}: the ramp against the measured, median |error| "
                f"{statistics.median(abs(v) for v in e):.0%}, bias {statistics.median(e):+.0%} "
                f"over {len(e)} levels"
            )


if __name__ == "__main__":
    main()
