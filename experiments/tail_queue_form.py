"""A profile's own queue form (issue #20, set 21's candidate ``s21-queue-form``;
``ramp_queue.queue_form``): the constant k of k × f/(1 − f) × −ln(1 − u) requests' worth fitted
on its ramp's draws at ≥ half the closed loop, the same fit on this machine's pooled table
(``ramp_queue.POOLED_QUEUE``), each draw's own k, and the bound at p90/p99 at the validation's
load fractions under the form and under the table. Offline: nothing is measured.

``.venv/bin/python experiments/tail_queue_form.py --db DB [--db DB2 …] [--mode http]``
(each ``DB``'s newest profile)
"""

from __future__ import annotations

import argparse

import numpy as np

from meshtax.model.capacity import SKETCH_PROBS
from meshtax.model.sidecar import Mode
from meshtax.predict.ramp_queue import (
    FORM_FROM,
    POOLED_QUEUE,
    RampQueue,
    form_k,
    queue_form,
    ramp_draws,
)
from meshtax.store.sqlite import ProfileStore

PROBS = np.asarray(SKETCH_PROBS, dtype=np.float64)
AT = (0.25, 0.45, 0.5, 0.68, 0.75, 0.82, 0.9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", action="append", required=True)
    ap.add_argument("--mode", default="http")
    a = ap.parse_args()
    table = RampQueue.from_table(POOLED_QUEUE)
    rows = [(float(f), r) for f, r in zip(table.fractions, table.queue) if f >= FORM_FROM]
    print(
        f"pooled table (sets 10–17, the older VM): k {form_k(rows):.3f} over its rows ≥ {FORM_FROM}"
    )
    i90, i99 = list(SKETCH_PROBS).index(0.9), list(SKETCH_PROBS).index(0.99)
    for db in a.db:
        store = ProfileStore(db)
        name = store.list()[-1].name
        prof = store.get(name)
        assert prof is not None
        mp = prof.modes[Mode(a.mode)]
        form = queue_form(mp)
        print(f"\n{db}: profile {name}")
        if form is None:
            print("  no form (fewer than 3 draws at ≥ half the closed loop): the table bounds")
            continue
        print(f"  k {form.k:.3f} from {form.draws} draws, held beyond f = {form.top:.3f}")
        for g in ramp_draws(mp, repeats=True):
            for f, r in g:
                if f >= FORM_FROM:
                    print(
                        f"  draw at {f:.3f}: own k {form_k([(f, r)]):.3f} "
                        f"(p90 {r[i90]:.1f}, p99 {r[i99]:.1f} requests' worth)"
                    )
        rq = form.ramp()
        print("\n  | fraction | form p90 / p99 | table p90 / p99 |\n  |---|---|---|")
        for f in AT:
            fv = rq.at(f, PROBS[[i90, i99]])
            tv = table.at(f, PROBS[[i90, i99]])
            print(f"  | {f:.2f} | {fv[0]:.1f} / {fv[1]:.1f} | {tv[0]:.1f} / {tv[1]:.1f} |")


if __name__ == "__main__":
    main()
