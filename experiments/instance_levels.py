"""Within one profile: do its sidecar instances differ beyond their own probe windows' noise?

A profile taken with ``meshtax profile --instances N`` takes each size's probe windows in N
groups, each through a sidecar started afresh, and every window record says its ``instance``.
Per mode, size and probe field (read, write, ipc, notification, user, kernel_other; µs per
crossing, the mode's own windows, no tcp base subtracted) whose pooled value is above 5 µs, this
prints each instance's mean over its pairs, the spread across instances (coefficient of
variation) and that spread over the instances' median own relative standard error (far above 1:
the instances differ beyond what their windows tell apart, as back-to-back profiles did in run
16, `instance_spread.py`), and at the end the share of fields whose instances spread more than
twice their own SE.

Offline, nothing is measured. Usage::

    .venv/bin/python experiments/instance_levels.py DB NAME [NAME ...]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from meshtax.store.sqlite import ProfileStore

FLOOR_US = 5.0
FIELDS = ("read", "write", "ipc", "notification", "user", "kernel_other")


def by_instance(probe: Mapping[str, Any]) -> dict[int, list[Mapping[str, float]]]:
    """instance → its pairs' breakdowns: the pairs are pooled in instance order, one kept
    meshed window each."""
    tags = [
        w["instance"] for w in probe["windows"] if w["kept"] and w["meshed"] and "instance" in w
    ]
    pairs = probe["per_pair_breakdown_us"]
    if len(tags) != len(pairs):
        return {}
    out: dict[int, list[Mapping[str, float]]] = {}
    for tag, p in zip(tags, pairs):
        out.setdefault(int(tag), []).append(p)
    return out


def spread(groups: Sequence[Sequence[float]]) -> dict[str, float]:
    """The instances' means, their cv, and that over the median own relative SE."""
    means = np.array([np.mean(g) for g in groups])
    own = [
        np.std(g, ddof=1) / math.sqrt(len(g)) / max(abs(float(np.mean(g))), 1e-9)
        for g in groups
        if len(g) > 1
    ]
    cv = float(means.std(ddof=1) / max(abs(float(means.mean())), 1e-9))
    se = float(np.median(own)) if own else math.nan
    return {"cv": cv, "own_se": se, "ratio": cv / se if se > 0 else math.inf}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db")
    ap.add_argument("names", nargs="+")
    a = ap.parse_args()
    store = ProfileStore(a.db)
    n = apart = 0
    for name in a.names:
        meas = store.get(name).provenance.options["measurements"]
        for mode, rs in meas.items():
            for r in rs:
                groups = by_instance(r["probe"])
                if len(groups) < 2:
                    continue
                pooled = r["probe"]["latency_breakdown_us"]
                for f in FIELDS:
                    if abs(pooled.get(f, 0.0)) <= FLOOR_US:
                        continue
                    vals = [[p[f] for p in g] for _, g in sorted(groups.items())]
                    s = spread(vals)
                    n += 1
                    apart += s["ratio"] > 2
                    means = " ".join(f"{np.mean(v):7.2f}" for v in vals)
                    print(
                        f"{name:>8} {mode:>5} {r['size']:>6} {f:>13} pooled {pooled[f]:7.2f} "
                        f"instances [{means}] cv {100 * s['cv']:5.1f} % "
                        f"own SE {100 * s['own_se']:5.1f} % ratio {s['ratio']:5.2f}"
                    )
    if n:
        print(
            f"fields above {FLOOR_US} µs whose instances spread > 2x their own SE: {apart} of {n}"
        )
    else:
        print("no profile with instance-tagged probe windows (meshtax profile --instances N)")


if __name__ == "__main__":
    main()
