"""Where a profile's total cost turns negative, and which component models take it there: for
a profile document the store refused (``<db>.<name>.refused.json``) or a stored one (issue #18,
HAProxy's carried-gRPC CPU).

    .venv/bin/python experiments/negative_total.py DOC.json
    .venv/bin/python experiments/negative_total.py --db DB NAME

Per mode and carried protocol, per metric: the lowest total over the store check's grid
(:func:`~meshtax.model.profile_check._grid`: sizes up to 1 GiB, the models' rate ends), and at
that point every component's model (intercept a, slope b, per-unit u, rate coefficient d,
rate range, the fit's note) with its samples (size, rate, value).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from meshtax.model.profile import ModeProfile, Profile
from meshtax.model.profile_check import _grid
from meshtax.store.sqlite import ProfileStore


def report(where: str, mp: ModeProfile) -> None:
    base = {c: m for c, m in mp.components.items() if c.name == "" and c.key != "tls"}
    for metric in ("latency", "cpu"):
        models = {c.key: getattr(m, metric) for c, m in base.items()}
        sizes, rates = _grid(models.values())
        worst = None
        for r in rates:
            per = {k: m.predict(sizes, r) for k, m in models.items()}
            total = np.sum(list(per.values()), axis=0)
            i = int(np.argmin(total))
            if worst is None or total[i] < worst[0]:
                worst = (float(total[i]), sizes[i], r, {k: float(v[i]) for k, v in per.items()})
        assert worst is not None
        low, size, rate, parts = worst
        print(f"{where} {metric}: lowest total {low:.2f} at {size:.0f} B, rate {rate}")
        for k, m in models.items():
            s = m.samples
            pts = list(zip(s.sizes, s.rates or (None,) * len(s.sizes), s.values)) if s else []
            print(
                f"   {k:13s} {parts[k]:9.2f}  a={m.intercept:.3g} b={m.slope:.3g} "
                f"u={m.per_unit:.3g} d={m.rate_coef:.3g} rates=[{m.rate_lo}, {m.rate_hi}] "
                f"note={m.note!r}"
            )
            for size_, rate_, v in pts:
                print(
                    f"      {size_:8.0f} B  {rate_ if rate_ is None else round(rate_)}/s  {v:.2f}"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("doc", nargs="?")
    ap.add_argument("--db")
    ap.add_argument("--name")
    a = ap.parse_args()
    if a.doc:
        # the refused document as written: built without the checks that refused it
        p = Profile._build(json.loads(Path(a.doc).read_text()))
    else:
        p = ProfileStore(a.db).get(a.name)
    for mode, mp in p.modes.items():
        report(mode.value, mp)
        for proto, sub in mp.carried.items():
            report(f"{mode.value}+{proto}", sub)


if __name__ == "__main__":
    main()
