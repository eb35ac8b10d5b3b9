"""A profile's own repeated capacity-ramp runs (issue #20, set 19's candidate
``s19-own-repeats``; ``Capacity.repeats``, ``ramp_queue.ramp_draws``): per repeated rate, each
draw's queue at p90/p99 in requests' worth, their median (the row ``ramp_queue(…, repeats=True)``
reads), their spread (max ÷ min, max − min) and this machine's pooled table
(``ramp_queue.POOLED_QUEUE``) at the same load fraction. Offline: nothing is measured.

``.venv/bin/python experiments/tail_own_repeats.py --db DB [--profile NAME] [--mode http]``
(without ``--profile``: the newest profile in ``DB``)
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from meshtax.model.capacity import SKETCH_PROBS
from meshtax.model.sidecar import Mode
from meshtax.predict.ramp_queue import POOLED_QUEUE, RampQueue, ramp_draws, ramp_queue
from meshtax.store.sqlite import ProfileStore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--mode", default="http")
    a = ap.parse_args()
    store = ProfileStore(a.db)
    name = a.profile or store.list()[-1].name
    prof = store.get(name)
    assert prof is not None, f"{a.db}: no profile {name}"
    mp = prof.modes[Mode(a.mode)]
    assert mp.capacity is not None, f"{name}: no capacity"
    table = RampQueue.from_table(POOLED_QUEUE)
    probs = list(SKETCH_PROBS)
    cols = {"p90": probs.index(0.9), "p99": probs.index(0.99)}
    print(
        f"profile {name}: closed loop {mp.capacity.requests_per_s:.0f}/s, "
        f"{len(mp.capacity.repeats)} repeated runs kept"
    )
    print(
        "\n| fraction | rank | draws (ramp's run first) | median | max ÷ min | max − min | table |"
    )
    print("|---|---|---|---|---|---|---|")
    for group in ramp_draws(mp, repeats=True):
        f = statistics.median(x for x, _ in group)
        for k, i in cols.items():
            vals = [float(row[i]) for _, row in group]
            lo, hi = min(vals), max(vals)
            ratio = f"{hi / lo:.2f}" if lo > 0 else "—"
            t = float(table.at(f, np.array([probs[i]]))[0])
            print(
                f"| {f:.3f} | {k} | "
                + " / ".join(f"{v:.1f}" for v in vals)
                + f" | {statistics.median(vals):.1f} | {ratio} | {hi - lo:.1f} | {t:.1f} |"
            )
    own = ramp_queue(mp, repeats=True)
    if own is not None:
        print("\nrows read (repeats=True), requests' worth:")
        for k, i in cols.items():
            print(
                f"  {k}: "
                + " ".join(f"{x:.2f}@{f:.2f}" for f, x in zip(own.fractions, own.queue[:, i]))
            )


if __name__ == "__main__":
    main()
