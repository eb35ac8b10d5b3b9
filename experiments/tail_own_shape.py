"""A profile's own ramp shape against the pooled one (issue #20, set 20's candidate
``s20-own-shape``): per stored profile with a capacity ramp, each fixed-rate run through the
sidecar as its load fraction f = rate ÷ R and its sidecar CPU a request ÷ the closed loop's
(u ÷ u_R), what :data:`~meshtax.predict.ramp_price.RAMP_SHAPE` (sets 10–12's profiles of the
older VM) says there, and the profile's own law below R/4
(:func:`~meshtax.predict.ramp_price.own_shape`, with the repeats). Offline.

``.venv/bin/python experiments/tail_own_shape.py --db DB [--profile NAME] [--mode http]``
"""

from __future__ import annotations

import argparse

from meshtax.model.sidecar import Mode
from meshtax.predict.load_factor import SHAPE_BELOW, closed_loop
from meshtax.predict.ramp_price import RAMP_SHAPE, own_shape
from meshtax.store.sqlite import ProfileStore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--profile", default=None, help="one profile (default: every stored one)")
    ap.add_argument("--mode", default="http")
    a = ap.parse_args()
    store = ProfileStore(a.db)
    names = [a.profile] if a.profile else [p.name for p in store.list()]
    for name in names:
        prof = store.get(name)
        mp = prof.modes.get(Mode(a.mode)) if prof is not None else None
        cap = mp.capacity if mp is not None else None
        top = closed_loop(mp) if mp is not None else None
        if mp is None or cap is None or top is None:
            print(f"{name}: no capacity ramp with a closed loop for {a.mode}")
            continue
        rc, uc = top
        own = own_shape(mp)
        print(f"\n{name}: closed loop R {rc:.0f}/s, u_R {uc:.1f} CPU-µs a request")
        print("| run | f = rate ÷ R | u ÷ u_R | RAMP_SHAPE there | own shape there |")
        print("|---|---|---|---|---|")
        runs = [("ramp", p) for p in cap.points] + [("repeat", p) for p in cap.repeats]
        for kind, p in sorted(runs, key=lambda t: t[1].achieved):
            if not p.meshed or p.target <= 0 or p.achieved <= 0:
                continue
            f, u = p.achieved / rc, p.sidecar_cpu / p.achieved * 1e6 / uc
            pooled = RAMP_SHAPE[0] * f ** RAMP_SHAPE[1]
            mine = f"{own[0] * f ** own[1]:.2f}" if own else "—"
            mark = "" if f <= SHAPE_BELOW * 1.02 else " (above R/4: the runs price)"
            print(f"| {kind} | {f:.3f} | {u:.2f} | {pooled:.2f} | {mine}{mark} |")
        shown = f"{own[0]:.3f} × f^{own[1]:.3f}" if own else "none (too few runs below R/4)"
        print(f"own shape: {shown}; RAMP_SHAPE {RAMP_SHAPE[0]} × f^{RAMP_SHAPE[1]}")


if __name__ == "__main__":
    main()
