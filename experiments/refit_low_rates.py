"""Diagnostic (issue #14): a finished suite run predicted again with a profile whose CPU models
are refitted without their lowest-rate runs, next to the profile as stored.

Suite run 3's gRPC cases were over-predicted on CPU (hold-out bias +32 %). The profile's gRPC
CPU run at 100/s came out at 3.8× its cost at 300/s (http's: 1.5×), and the ln-rate term
carries that one run to every sidecar whose shared CPU sees few messages. This refits the
models of ``--modes`` from their stored samples with rate ≥ ``--min-rate`` (``CostModel.fit``,
as the profiler fits them) and re-predicts every measured case with both profiles (at the
profile's own speed). It measures nothing; it was looked at after the hold-out, so it is a
diagnosis, not an accuracy claim (BENCHMARKS.md, "Validation suite with a hold-out", run 3).

    .venv/bin/python experiments/refit_low_rates.py --run RUN/run --db RUN/profiles.db \\
        --profile suite-3 --modes grpc --min-rate 150
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from meshtax.model.costmodel import CostModel
from meshtax.model.profile import ModeProfile, Profile
from meshtax.store.sqlite import ProfileStore
from meshtax.validate.suite_run import SuiteDir, SuiteResult, repredict


def refit(cm: CostModel, min_rate: float) -> CostModel:
    """``cm`` fitted again on its samples at ``min_rate`` or more (as is without rated samples)."""
    s = cm.samples
    if s is None or s.rates is None:
        return cm
    keep = [i for i, r in enumerate(s.rates) if r >= min_rate]
    if len(keep) == len(s.rates) or not keep:
        return cm
    return CostModel.fit(
        [s.sizes[i] for i in keep],
        [s.values[i] for i in keep],
        rates=[s.rates[i] for i in keep],
        split_bytes=cm.split_bytes,
    )


def without_low_rates(profile: Profile, modes: set[str], min_rate: float) -> Profile:
    """``profile`` with the CPU models of ``modes`` (``carried``: every carried protocol's)
    refitted without their runs below ``min_rate``."""

    def fix(mp: ModeProfile) -> ModeProfile:
        comps = {c: replace(m, cpu=refit(m.cpu, min_rate)) for c, m in mp.components.items()}
        return replace(mp, components=comps)

    out = []
    for m in profile.modes:
        mp = profile.mode(m)
        if m.value in modes:
            mp = fix(mp)
        if "carried" in modes:
            mp = replace(mp, carried={k: fix(v) for k, v in mp.carried.items()})
        out.append(mp)
    return profile.with_modes(out)


def describe(label: str, res: SuiteResult) -> list[str]:
    lines = []
    for name, cases in res.sets.items():
        rows = [c for c in cases if c.error is None and c.predicted is not None]
        if not rows:
            continue
        lat = np.array([c.comparisons["latency"].error for c in rows])
        cpu = np.array([c.comparisons["cpu"].error for c in rows])

        def stats(e: np.ndarray, sel: list[int]) -> str:
            x = e[sel]
            return (
                f"{np.median(np.abs(x)):.1%} (bias {x.mean():+.1%}, >30 %: {(abs(x) > 0.3).sum()})"
            )

        every = list(range(len(rows)))
        lines.append(
            f"{label} | {name} ({len(rows)}) | latency {stats(lat, every)} | CPU {stats(cpu, every)}"
        )
        for mode in ("tcp", "http", "grpc"):
            sel = [i for i, c in enumerate(rows) if c.mode == mode]
            if sel:
                lines.append(f"    {mode}: latency {stats(lat, sel)} | CPU {stats(cpu, sel)}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--run", required=True, help="a suite run's directory (bench_suite --out)")
    ap.add_argument("--db", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--modes", default="grpc", help="modes to refit; 'carried' for carried ones")
    ap.add_argument("--min-rate", type=float, default=150.0)
    a = ap.parse_args()
    prof = ProfileStore(a.db).get(a.profile)
    refitted = without_low_rates(prof, set(a.modes.split(",")), a.min_rate)
    for label, p in (
        ("as stored", prof),
        (f"{a.modes} runs < {a.min_rate:g}/s left out", refitted),
    ):
        print("\n".join(describe(label, repredict(SuiteDir(a.run), p, speed=False))))


if __name__ == "__main__":
    main()
