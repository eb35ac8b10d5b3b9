"""Does the machine-speed reference carry a profile across hours? (issue #14, Done-when 2; offline)

A suite run's cases (every set) predicted again with another profile — one taken an hour or
more before or after the cases — once at that profile's own speed and once at each case's
recorded speed (the reference sidecar scaling user space, the ping-pongs the kernel's paths).
Prints latency p50 and CPU median absolute error, bias and cases beyond 30 % over all cases,
and each case's speed reading beside the profile's. Measures nothing::

    .venv/bin/python experiments/profile_carry.py RUN/run --db RUN/profiles.db --profile NAME

The rule registered for run 10 (BENCHMARKS.md): the reference carries the profile if both
medians and both |biases| are no larger at each case's speed.
"""

from __future__ import annotations

import argparse
import statistics

from meshtax.store.sqlite import ProfileStore
from meshtax.validate.result import error_stats
from meshtax.validate.suite_run import SuiteDir, repredict


def line(label: str, errors: list[float]) -> str:
    s = error_stats(errors)
    return (
        f"{label}: {100 * float(s['median_abs_error']):.1f} % "
        f"({100 * float(s['mean_error']):+.1f} %, {s['beyond']} beyond 30 %, n={s['n']})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("run", help="a suite run's output directory (holds cases/ and traces/)")
    ap.add_argument("--db", required=True)
    ap.add_argument("--profile", required=True)
    a = ap.parse_args()
    prof = ProfileStore(a.db).get(a.profile)
    out = SuiteDir(a.run)
    ref = prof.speed.sidecar_ns if prof.speed else None
    print(f"profile {prof.name!r} ({prof.provenance.created}), reference sidecar {ref} ns")
    readings = [
        c.speed.sidecar_ns
        for cases in out.result().sets.values()
        for c in cases
        if c.speed is not None and c.speed.sidecar_ns is not None
    ]
    if readings and ref:
        below = sum(r < ref for r in readings)
        print(
            f"cases' readings: median {statistics.median(readings):.0f} ns "
            f"({min(readings):.0f}–{max(readings):.0f}), {below} of {len(readings)} below the "
            "profile's"
        )
    for label, at_case in (("the profile's speed", False), ("each case's speed", True)):
        res = repredict(out, prof, speed=at_case)
        cases = [c for cs in res.sets.values() for c in cs if c.comparisons]
        for metric in ("latency", "cpu"):
            print(line(f"{label}, {metric}", [c.comparisons[metric].error for c in cases]))


if __name__ == "__main__":
    main()
