"""Does scaling by the measured machine speed make two profiles agree better?

Issue #14 asks two quick profiles an hour apart to agree within 10 % on every component above
5 µs "once the measured machine speed is accounted for". A profile takes the reference
workload (:mod:`meshtax.testbed.speed`: same-CPU and cross-CPU ping-pongs, the user loop, a
reference sidecar) at its start and after each mode, and stores the median of those samples;
`--speed now` scales each component by its kind's reference ratio
(:func:`meshtax.model.speed.speed_factor`). For every pair of the given stored profiles this
prints the share of components above 5 µs within 10 % (the fitted models at the measured sizes,
as ``benchmarks/bench_profile.py --compare``): as measured, scaled by the stored speeds, by the
fastest sample of each path instead of the median, and "gated" — a path's ratio applied only
when the two profiles' samples of it do not overlap (the reference moved beyond its own
scatter). Then each profile's sample scatter (largest ÷ smallest, per path) and the means over
all pairs. Offline, nothing is measured. Usage::

    .venv/bin/python experiments/speed_normalisation.py DB NAME [DB NAME ...]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_profile import DRIFT, model_agreement, normalized_agreement  # noqa: E402
from meshtax.model.profile import Profile  # noqa: E402
from meshtax.model.speed import Speed, typical  # noqa: E402
from meshtax.store.sqlite import ProfileStore  # noqa: E402

PATHS = ("local", "cross", "user", "sidecar")


def samples(p: Profile) -> list[Speed]:
    """The speed samples a profile took (start, after each mode, after retries)."""
    return [Speed.from_dict(s) for s in p.provenance.options.get("speed_samples", [])]


def _path(ss: Sequence[Speed], k: str) -> list[float]:
    return [v for s in ss if (v := getattr(s, f"{k}_ns")) is not None]


def combine(ss: Sequence[Speed], f: Callable[[list[float]], float]) -> Speed:
    """One speed from several samples, each path by ``f`` (the sidecar when any sample has it)."""
    sc = _path(ss, "sidecar")
    return Speed(
        f(_path(ss, "local")),
        f(_path(ss, "cross")),
        f(_path(ss, "user")),
        "",
        f(sc) if sc else None,
    )


def gated(sa: Sequence[Speed], sb: Sequence[Speed]) -> tuple[Speed, Speed]:
    """Both profiles' median speeds, ``b``'s set to ``a``'s on every path whose samples
    overlap (ratio 1: the reference did not move beyond its own scatter)."""
    ma, mb = typical(sa), typical(sb)
    same = {}
    for k in PATHS:
        xa, xb = _path(sa, k), _path(sb, k)
        if xa and xb and not (max(xa) < min(xb) or max(xb) < min(xa)):
            same[f"{k}_ns"] = getattr(ma, f"{k}_ns")
    return ma, replace(mb, **same)


def within(d: dict[str, float] | None) -> float | None:
    return None if not d else sum(v <= DRIFT for v in d.values()) / len(d)


def pair(a: Profile, b: Profile) -> dict[str, float | None] | None:
    """Share within 10 % for one pair, each way of accounting for speed (None: no samples)."""
    sa, sb = samples(a), samples(b)
    if not sa or not sb:
        return None

    def scaled(x: Speed, y: Speed) -> float | None:
        return within(normalized_agreement(replace(a, speed=x), replace(b, speed=y)))

    return {
        "raw": within(model_agreement(a, b)),
        "median": scaled(typical(sa), typical(sb)),
        "fastest": scaled(combine(sa, min), combine(sb, min)),
        "gated": scaled(*gated(sa, sb)),
    }


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pairs", nargs="+", metavar="DB NAME")
    args = ap.parse_args(argv)
    if len(args.pairs) % 2:
        ap.error("give DB NAME pairs")
    profiles: dict[str, Profile] = {}
    for db, n in zip(args.pairs[::2], args.pairs[1::2]):
        key = n if n not in profiles else f"{Path(db).stem}:{n}"
        profiles[key] = ProfileStore(db).get(n)
    print("== each profile's speed samples: largest ÷ smallest per path")
    for name, p in profiles.items():
        ss = samples(p)
        spread = {k: max(xs) / min(xs) for k in PATHS if (xs := _path(ss, k))}
        print(
            f"  {name:12s} {len(ss)} samples  "
            + "  ".join(f"{k} {r:.3f}" for k, r in spread.items())
        )
    print(f"== pairs: share of components above 5 µs within {DRIFT:.0%}")
    rows = []
    for x, y in itertools.combinations(profiles, 2):
        r = pair(profiles[x], profiles[y])
        if r is None:
            continue
        rows.append(r)
        print(
            f"  {x:12s} {y:12s} " + "  ".join(f"{k} {v:.2f}" for k, v in r.items() if v is not None)
        )
    if rows:
        means = {k: mean(v for r in rows if (v := r[k]) is not None) for k in rows[0]}
        print(
            f"== mean over {len(rows)} pairs: "
            + "  ".join(f"{k} {v:.3f}" for k, v in means.items())
        )


if __name__ == "__main__":
    main()
