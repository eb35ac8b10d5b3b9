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
all pairs. ``--mode-gauges`` adds two gauges taken beside each mode: "echo", each mode scaled
by its own no-mesh echo (the median over sizes of the ratio of the profile's direct median
latency, the mode's kernel paths without a sidecar), and "bracket", each mode's components by
the reference readings taken just before and after that mode (their mean). ``--paired``: the
profiles as consecutive pairs (first with second, third with fourth …), not all
combinations. Offline, nothing is measured. Usage::

    .venv/bin/python experiments/speed_normalisation.py [--mode-gauges] [--paired] DB NAME [DB NAME ...]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from statistics import mean

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_profile import (  # noqa: E402
    DRIFT,
    _rel_diffs,
    model_agreement,
    model_components,
    normalized_agreement,
)
from meshtax.model.components import Component  # noqa: E402
from meshtax.model.profile import Profile  # noqa: E402
from meshtax.model.sidecar import Mode  # noqa: E402
from meshtax.model.speed import Speed, speed_factor, typical  # noqa: E402
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


def echo_ms(p: Profile) -> dict[tuple[str, int], float]:
    """(mode, size) → the median latency of the no-mesh echo the profile measured beside it."""
    return {
        (m.value, size): float(np.interp(0.5, sk.probs, sk.direct_us))
        for m, mp in p.modes.items()
        for size, sk in mp.latency_sketches.items()
    }


def bracket(p: Profile) -> dict[str, Speed]:
    """mode → the mean of the reference readings taken just before and just after it (the
    profile takes one at its start and one after each mode, modes in the order it lists)."""
    ss, modes = samples(p), p.provenance.options.get("modes", [])
    return {m: combine(ss[i : i + 2], mean) for i, m in enumerate(modes) if ss[i : i + 2]}


def mode_scaled(a: Profile, b: Profile, factor: Callable[[str, Component], float]) -> float | None:
    """Share within 10 % once each of ``b``'s components is scaled by ``factor(mode, c)``."""
    cb: dict[str, dict[int, dict[str, float]]] = {}
    for mode, sizes in model_components(b).items():
        comps = {c.key: c for c in b.modes[Mode(mode)].components}
        cb[mode] = {
            z: {k: v * factor(mode, comps[k]) for k, v in vals.items()} for z, vals in sizes.items()
        }
    return within(_rel_diffs(model_components(a), cb))


def gauges(a: Profile, b: Profile) -> dict[str, float | None]:
    """The two gauges taken beside each mode (``--mode-gauges``)."""
    ea, eb = echo_ms(a), echo_ms(b)

    def echo(mode: str, c: Component) -> float:
        r = [ea[k] / eb[k] for k in ea if k[0] == mode and k in eb]
        return float(np.median(r)) if r else 1.0

    ba, bb = bracket(a), bracket(b)

    def brk(mode: str, c: Component) -> float:
        return speed_factor(c, ba[mode], bb[mode]) if mode in ba and mode in bb else 1.0

    return {"echo": mode_scaled(a, b, echo), "bracket": mode_scaled(a, b, brk)}


def pair(a: Profile, b: Profile, mode_gauges: bool = False) -> dict[str, float | None] | None:
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
        **(gauges(a, b) if mode_gauges else {}),
    }


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pairs", nargs="+", metavar="DB NAME")
    ap.add_argument("--mode-gauges", action="store_true", help="also the gauges beside each mode")
    ap.add_argument("--paired", action="store_true", help="consecutive pairs, not combinations")
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
    names = list(profiles)
    combos = zip(names[::2], names[1::2]) if args.paired else itertools.combinations(names, 2)
    for x, y in combos:
        r = pair(profiles[x], profiles[y], args.mode_gauges)
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
