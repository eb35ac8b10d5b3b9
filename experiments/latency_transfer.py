"""A suite run's hold-out latency with a second, latency-only transfer (issue #14; offline).

The suite's transfer (:mod:`meshtax.model.transfer`) scales the profile's per-message costs by
the factor the calibration set's measured CPU takes over the predicted; latency follows the
scaled costs. Here, on top of it, the calibration set's measured ÷ predicted latency p50 (its
median, per mode or one for all) scales the hold-out's predicted latency — does a latency term
fitted on the calibration set alone remove the tcp-mode hold-out bias? Measures nothing::

    .venv/bin/python experiments/latency_transfer.py RUN:PROFILE [RUN:PROFILE ...]

RUN: a suite run directory holding ``run/`` and ``profiles.db``; PROFILE: its profile's name.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence

from meshtax.store.sqlite import ProfileStore
from meshtax.validate.result import CaseResult
from meshtax.validate.suite_run import SuiteDir, calibrate

MODES = ("tcp", "http", "grpc")


def ratio(c: CaseResult) -> float:
    """Measured ÷ predicted latency p50 overhead of one case."""
    cmp = c.comparisons["latency"]
    return cmp.measured.median / cmp.predicted


def summary(errors: Sequence[float]) -> str:
    if not errors:
        return "-"
    med = statistics.median(abs(e) for e in errors)
    beyond = sum(abs(e) > 0.3 for e in errors)
    return f"{100 * med:5.1f} % ({100 * statistics.fmean(errors):+5.1f} %, {beyond} beyond 30 %)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="RUN:PROFILE")
    for spec in ap.parse_args().runs:
        run, _, name = spec.rpartition(":")
        prof = ProfileStore(f"{run}/profiles.db").get(name)
        res = calibrate(SuiteDir(f"{run}/run"), prof).result
        cal = [c for c in res.sets["calibration"] if c.comparisons]
        hold = [c for c in res.sets["holdout"] if c.comparisons]
        pooled = statistics.median(ratio(c) for c in cal)
        variants = {
            "CPU transfer only": dict.fromkeys(MODES, 1.0),
            "+ latency factor per mode": {
                m: statistics.median(ratio(c) for c in cal if c.mode == m) for m in MODES
            },
            "+ one latency factor": dict.fromkeys(MODES, pooled),
        }
        for label, f in variants.items():
            errs = [
                c.comparisons["latency"].predicted
                * f[c.mode]
                / c.comparisons["latency"].measured.median
                - 1
                for c in hold
            ]
            tcp = [e for e, c in zip(errs, hold, strict=True) if c.mode == "tcp"]
            factors = ", ".join(f"{m} ×{f[m]:.2f}" for m in MODES)
            print(
                f"{name}: {label} ({factors}): hold-out latency {summary(errs)}; tcp {summary(tcp)}"
            )


if __name__ == "__main__":
    main()
