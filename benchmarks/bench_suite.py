"""The validation suite with a real hold-out (issue #14): a quick profile, the calibration and
hold-out sets' cases interleaved (``--order sets``: one set after the other), in one sitting;
prints the Markdown for BENCHMARKS.md: both sets with the profile's measured costs, then both
with the transfer fitted on the calibration set alone (``meshtax.model.transfer``).

Measure (root, under the measurement lock; ~55 min for the bundled suite)::

    flock /run/meshtax-measure.lock .venv/bin/python benchmarks/bench_suite.py \\
        --out artifacts/suite --db artifacts/suite/profiles.db [--suite app/suite.yaml] \\
        [--name NAME] [--profile STORED] [--accept-unclosed] [--sets calibration,holdout] \\
        [--rate R] [--duration S] [--speed now|profile] [--order interleaved|sets] \\
        [--quick] [--resume]

This is ``meshtax validate --suite`` (``meshtax.app.measure.validate_suite``): one JSON per case
in ``<out>/cases`` as soon as it is measured, the no-mesh traces in ``<out>/traces``, the summary
in ``<out>/summary.{json,md}``; a killed run keeps its cases and ``--resume`` continues it.

Re-render a finished or interrupted run without measuring: ``--report <out>``; and with
``--repredict --db DB --profile NAME`` predict its kept traces again with that profile and this
checkout's model, each case at the machine speed measured for it (``--speed profile``: at the
profile's own); the same measurements, another profile or model: e.g. a profile taken an hour
before the cases or right after them. ``--transfer`` also fits the transfer on the run's
calibration set and predicts both sets again with it (``--transfer-by mode``: one factor per
mode instead of per cost model, the alternative BENCHMARKS.md compares); latency has factors of
its own, fitted on the calibration set's latency p50 (since suite run 10; ``--latency-transfer
cpu``: latency at the CPU factors, as runs 1–9).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from meshtax.app import USER_ERRORS
from meshtax.app.measure import SuiteOptions, validate_suite
from meshtax.store.sqlite import ProfileStore
from meshtax.validate.suite import ORDERS
from meshtax.validate.suite_run import SuiteDir, SuiteResult, calibrate, repredict


def benchmarks_markdown(res: SuiteResult) -> str:
    """What BENCHMARKS.md quotes: where from, both sets side by side, per mode; the same with
    the calibration set's transfer when it was fitted."""
    out = [*res.header(), "", *res.comparison_table(), "", *res.by_mode_table()]
    if res.calibrated is not None:
        out += ["", "With the transfer fitted on the calibration set:", ""]
        out.append(benchmarks_markdown(res.calibrated))
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", help="output directory of the run (measure mode)")
    ap.add_argument("--report", metavar="DIR", help="re-render DIR instead of measuring")
    ap.add_argument("--repredict", action="store_true", help="with --report: predict again")
    ap.add_argument("--db", default=None, help="profile database (default: the user's)")
    ap.add_argument("--suite", default=None, help="suite file (default: app/suite.yaml)")
    ap.add_argument("--name", default=None, help="name of the new profile")
    ap.add_argument("--profile", default=None, help="a stored profile instead of a new one")
    ap.add_argument("--accept-unclosed", action="store_true", help="go on with an unclosed profile")
    ap.add_argument(
        "--speed",
        choices=("now", "profile"),
        default="now",
        help="now (default since suite run 9, by the rule registered before it): scale the "
        "profile to the machine's speed measured at each case (with --repredict: the speed "
        "recorded then); profile: its costs as measured",
    )
    ap.add_argument("--sets", default="calibration,holdout")
    ap.add_argument(
        "--order",
        choices=ORDERS,
        default="interleaved",
        help="the sets' cases spread evenly over the sitting (the default since suite run 12), "
        "or set after set (runs 1–11)",
    )
    ap.add_argument("--rate", type=float, default=None)
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--full", action="store_true", help="also print every set's case table")
    ap.add_argument(
        "--transfer",
        action="store_true",
        help="with --report --repredict: also predict again with the transfer fitted on the "
        "calibration set (as a measuring run does at its end)",
    )
    ap.add_argument(
        "--transfer-by",
        choices=("model", "mode"),
        default="model",
        help="with --transfer: a factor per cost model (the default, as the suite) or per mode",
    )
    ap.add_argument(
        "--latency-transfer",
        choices=("own", "cpu"),
        default="own",
        help="with --transfer: latency factors of its own, fitted on the calibration set's "
        "latency p50 (the default since suite run 10), or latency at the CPU factors (runs 1–9)",
    )
    a = ap.parse_args()
    store = ProfileStore(a.db) if a.db else ProfileStore()
    if a.report:
        out = SuiteDir(a.report)
        if a.repredict:
            if not a.profile:
                ap.error("--repredict needs --profile")
            prof = store.get(a.profile)
            res = repredict(out, prof, speed=a.speed == "now")
            if a.transfer:
                cal = calibrate(
                    out,
                    prof,
                    speed=a.speed == "now",
                    per_model=a.transfer_by == "model",
                    latency=a.latency_transfer == "own",
                )
                res = replace(res, calibrated=cal.result)
        else:
            if a.transfer:
                ap.error("--transfer needs --repredict --profile")
            res = out.result()
    elif a.out:
        t0 = time.monotonic()

        def say(msg: str) -> None:
            print(f"[{time.monotonic() - t0:6.0f}s] {msg}", file=sys.stderr, flush=True)

        try:
            opts = SuiteOptions(
                a.out,
                a.suite,
                tuple(s for s in a.sets.split(",") if s),
                a.rate,
                a.duration,
                a.quick,
                a.name,
                a.profile,
                accept_unclosed=a.accept_unclosed,
                speed=a.speed,
                resume=a.resume,
                order=a.order,
                wait_s=900.0,
            )
            res = validate_suite(opts, store, say)
        except USER_ERRORS as e:  # a bad option, an unusable profile: one line, no trace
            sys.exit(f"bench_suite: {e}")
    else:
        ap.error("give --out DIR (measure) or --report DIR (re-render)")
    print(res.markdown() if a.full else benchmarks_markdown(res))


if __name__ == "__main__":
    main()
