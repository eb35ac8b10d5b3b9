"""Is a disagreement between two stored profiles larger than their own sampling noise?

Issue #14 asks two quick profiles an hour apart to agree within 10 % on every component above
5 µs. For each such component (per mode and message size) this prints both values, their
relative difference, and a 95 % bootstrap interval of that difference over each profile's probe
window pairs (the pairs are resampled, each profile on its own), with each profile's relative
standard error. A difference whose interval includes 0 is within what the two profiles could
tell apart; one whose interval excludes 0 is a change of the machine or the sidecar between
them. The last column is the number of probe window pairs each profile would need for two
profiles of a machine that does not change to agree within 10 % at 95 % (n ≥ 2 · (1.96 · sd /
mean / 0.10)², the larger per-pair standard deviation over the larger mean), against the pairs
they took.
Offline, nothing is measured. Usage::

    .venv/bin/python experiments/profile_agreement_noise.py DB_A NAME_A DB_B NAME_B
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_profile import SIGNIFICANT_US, pair_components  # noqa: E402
from meshtax.model.profile import Profile  # noqa: E402
from meshtax.store.sqlite import ProfileStore  # noqa: E402

DRIFT = 0.10  # the bar


def per_pair(prof: Profile) -> dict[str, tuple[float, np.ndarray]]:
    """mode/size/component → (pooled value, the values of each probe window pair), µs."""
    return {
        f"{mode}/{size}/{c.key}": (v, np.array([p[c] for p in pairs]))
        for mode, sizes in pair_components(prof).items()
        for size, (pooled, pairs) in sizes.items()
        for c, v in pooled.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db_a")
    ap.add_argument("name_a")
    ap.add_argument("db_b")
    ap.add_argument("name_b")
    ap.add_argument("--resamples", type=int, default=4000)
    a_ = ap.parse_args()
    a = per_pair(ProfileStore(a_.db_a).get(a_.name_a))
    b = per_pair(ProfileStore(a_.db_b).get(a_.name_b))
    rng = np.random.default_rng(0)
    n = within = noise = 0
    needs: list[int] = []
    for k in sorted(set(a) & set(b)):
        (va, pa), (vb, pb) = a[k], b[k]
        if max(abs(va), abs(vb)) <= SIGNIFICANT_US or len(pa) < 2 or len(pb) < 2:
            continue
        n += 1
        rel = abs(va - vb) / max(abs(va), abs(vb))
        ba = pa[rng.integers(0, len(pa), (a_.resamples, len(pa)))].mean(axis=1)
        bb = pb[rng.integers(0, len(pb), (a_.resamples, len(pb)))].mean(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            d = (ba - bb) / np.maximum(np.abs(ba), np.abs(bb))
        lo, hi = np.nanpercentile(d, [2.5, 97.5])
        se = [p.std(ddof=1) / np.sqrt(len(p)) / max(abs(p.mean()), 1e-9) for p in (pa, pb)]
        need = pairs_for_the_bar(pa, pb)
        needs.append(need)
        inside = bool(lo <= 0 <= hi)
        within += rel <= DRIFT
        noise += rel > DRIFT and inside
        verdict = "" if rel <= DRIFT else ("within noise" if inside else "a real change")
        print(
            f"{k:28s} {va:8.1f} {vb:8.1f}  {100 * rel:5.1f} %  [{100 * lo:+6.1f}, {100 * hi:+6.1f}] %"
            f"  rel. SE {100 * se[0]:4.0f} / {100 * se[1]:4.0f} %  pairs {len(pa)}/{len(pb)},"
            f" for the bar {need}  {verdict}"
        )
    print(
        f"{n} components above {SIGNIFICANT_US:g} µs: {within} within {100 * DRIFT:.0f} %; of the "
        f"others, {noise} within their own sampling noise and {n - within - noise} a real change"
    )
    if needs:
        print(
            f"pairs each profile would need for the bar (no drift): median {int(np.median(needs))},"
            f" largest {max(needs)}; {sum(x <= 8 for x in needs)} of {n} need no more than 8"
        )


def pairs_for_the_bar(pa: np.ndarray, pb: np.ndarray, bar: float = DRIFT) -> int:
    """Pairs each of two profiles needs for their difference to stay within ``bar`` of the
    value at 95 % when nothing changed: n ≥ 2 · (1.96 · cv / bar)², cv the larger per-pair
    standard deviation over the larger mean (the scale the difference is taken against)."""
    cv = max(p.std(ddof=1) for p in (pa, pb)) / max(abs(pa.mean()), abs(pb.mean()), 1e-9)
    return int(np.ceil(2 * (1.96 * cv / bar) ** 2))


if __name__ == "__main__":
    main()
