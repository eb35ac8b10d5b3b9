"""Do back-to-back profiles (each with its own pods and sidecar) differ beyond their own noise?

Issue #14 asks two quick profiles an hour apart to agree within 10 % on every component above
5 µs; in run 15 six of 34 differed beyond their sampling noise (the 64 KB copies above all),
and no speed reference tracked them (`speed_normalisation.py`). Either the machine drifts over
the hour, or every profile draws a sidecar instance (a fresh Envoy, fresh pods, its buffers and
memory) whose state holds for its minutes of measurement and differs from the next one's. This
takes one or more batches of stored profiles measured back to back and prints, per component
above 5 µs (per mode and message size):

- each profile's value (the pooled probe windows) and its relative standard error over its
  probe window pairs;
- per batch: the median over profiles, the spread across them (coefficient of variation), and
  that spread over the profiles' median own standard error — far above 1: the instances differ
  beyond what their windows could tell apart;
- between the first two batches: the medians' relative difference and its standard error (each
  batch median's ≈ 1.253 · sd / √n), and how many instances a profile would need to average for
  two of them to agree within 10 % at 95 % with this spread and no drift (n ≥ 2 · (1.96 · cv / 0.10)²);
  and over all choices of n = 1…4 profiles from each batch, how often their medians agree
  within 10 % on every component.

Offline, nothing is measured. Usage::

    .venv/bin/python experiments/instance_spread.py DB NAME NAME [NAME ...] [-- DB NAME NAME [NAME ...]]
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from profile_agreement_noise import per_pair  # noqa: E402

from bench_profile import SIGNIFICANT_US  # noqa: E402
from meshtax.model.profile import Profile  # noqa: E402
from meshtax.store.sqlite import ProfileStore  # noqa: E402

DRIFT = 0.10  # the bar


Vals = dict[str, tuple[float, float]]


def values(prof: Profile) -> Vals:
    """mode/size/component → (pooled value µs, relative standard error over its window pairs)."""
    out = {}
    for k, (v, xs) in per_pair(prof).items():
        se = xs.std(ddof=1) / math.sqrt(len(xs)) if len(xs) > 1 else math.nan
        out[k] = (v, se / max(abs(v), 1e-9))
    return out


def batch_stats(vals: Sequence[dict[str, tuple[float, float]]], key: str) -> dict[str, float]:
    """Median, coefficient of variation across profiles, and that over their median own SE."""
    xs = np.array([v[key][0] for v in vals])
    ses = np.array([v[key][1] for v in vals])
    med = float(np.median(xs))
    cv = float(xs.std(ddof=1) / max(abs(xs.mean()), 1e-9)) if len(xs) > 1 else math.nan
    own = float(np.nanmedian(ses))
    return {"median": med, "cv": cv, "own_se": own, "ratio": cv / own if own > 0 else math.inf}


def split_batches(argv: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``DB NAME NAME… -- DB NAME NAME…`` → [(db, names), …]."""
    out, cur = [], list[str]()
    for a in [*argv, "--"]:
        if a == "--":
            if len(cur) < 3:
                raise SystemExit("each batch: DB and at least two profile names (a spread)")
            out.append((cur[0], cur[1:]))
            cur = []
        else:
            cur.append(a)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("batches", nargs=argparse.REMAINDER, metavar="DB NAME NAME [NAME ...] [-- ...]")
    args = ap.parse_args(argv)
    batches = [
        [values(ProfileStore(db).get(n)) for n in names]
        for db, names in split_batches(args.batches)
    ]
    keys = sorted(set.intersection(*(set(v) for b in batches for v in b)))
    keys = [k for k in keys if max(abs(v[k][0]) for b in batches for v in b) > SIGNIFICANT_US]
    print(
        f"{len(keys)} components above {SIGNIFICANT_US:g} µs; batches of {[len(b) for b in batches]}"
    )
    beyond = agree = 0
    for k in keys:
        print(f"== {k}")
        stats = []
        for i, b in enumerate(batches):
            s = batch_stats(b, k)
            stats.append(s)
            each = " ".join(f"{v[k][0]:.1f}" for v in b)
            print(
                f"  batch {i + 1}: {each}  | median {s['median']:.1f}  cv {100 * s['cv']:.1f} %"
                f"  own SE {100 * s['own_se']:.1f} %  spread/own {s['ratio']:.1f}"
            )
        beyond += stats[0]["ratio"] > 2
        if len(batches) > 1:
            (sa, sb), (na, nb) = stats[:2], (len(batches[0]), len(batches[1]))
            rel = abs(sa["median"] - sb["median"]) / max(abs(sa["median"]), abs(sb["median"]))
            sd = [s["cv"] * abs(s["median"]) for s in (sa, sb)]
            se = math.hypot(1.253 * sd[0] / math.sqrt(na), 1.253 * sd[1] / math.sqrt(nb))
            se_rel = se / max(abs(sa["median"]), abs(sb["median"]))
            need = math.ceil(2 * (1.96 * max(sa["cv"], sb["cv"]) / DRIFT) ** 2)
            agree += rel <= DRIFT
            print(
                f"  batch medians {100 * rel:.1f} % apart (SE {100 * se_rel:.1f} %); "
                f"instances to average for the bar {need}"
            )
    print(
        f"first batch: {beyond} of {len(keys)} components spread across profiles > 2× their own SE"
    )
    if len(batches) > 1:
        print(f"batch medians within {100 * DRIFT:.0f} %: {agree} of {len(keys)}")
        subsets(batches[0], batches[1], keys)


def subsets(a: Sequence[Vals], b: Sequence[Vals], keys: Sequence[str]) -> None:
    """How often the medians of n profiles of one batch and n of the other agree within 10 %
    on every component, over all choices of the n (n = 1: single profiles)."""
    for n in range(1, min(len(a), len(b), 4) + 1):
        ok = [
            all(
                abs(ma - mb) / max(abs(ma), abs(mb)) <= DRIFT
                for k in keys
                for ma, mb in [(np.median([x[k][0] for x in xa]), np.median([y[k][0] for y in xb]))]
            )
            for xa in itertools.combinations(a, n)
            for xb in itertools.combinations(b, n)
        ]
        print(
            f"medians of {n} profile(s) of each batch: every component within "
            f"{100 * DRIFT:.0f} % in {sum(ok)} of {len(ok)} choices ({100 * np.mean(ok):.0f} %)"
        )


if __name__ == "__main__":
    main()
