"""The runs of a validation predicted under other pricing models, to show what each part of the
engine's model does (issue 6). Analysis only: it measures nothing.

``.venv/bin/python experiments/validate_variants.py --db PROFILES.db --profile NAME --doc DIR/*/all.json``
(documents of ``benchmarks/bench_validate.py --keep-traces``; traces next to each).

Variants (the same traces and profile each time):

- ``engine``: what ``predict`` does with the validation's placement (``pod_cpus=1``: the
  shared-CPU latency bound, every message priced at the shared CPU's rate);
- ``own-rate``: the bound, each sidecar at its own rate;
- ``highest-rate``: the bound, every message at the profile's highest rate (no rate effect);
- ``critical-path``: no placement at all (critical path only, each invocation at its own rate).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

import meshtax.predict.engine as engine
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.store.sqlite import ProfileStore
from meshtax.validate.prediction import predict_traces
from meshtax.validate.result import CaseResult, ValidationResult

VARIANTS = ("engine", "own-rate", "highest-rate", "critical-path")


@contextmanager
def highest_rate(on: bool) -> Iterator[None]:
    """Price every message at the profile's highest rate (the models clamp an infinite rate)."""
    orig = engine.hop_costs

    def hop(
        batch: Any,
        profiles: Any,
        *,
        rates: Any = None,
        speed: Any = None,
        cpu_as_latency: bool = False,
    ) -> engine.Costs:
        inf = np.full(batch.n_invocations, np.inf)
        return orig(batch, profiles, rates=inf, speed=speed, cpu_as_latency=cpu_as_latency)

    if on:
        engine.hop_costs = hop
    try:
        yield
    finally:
        engine.hop_costs = orig


def own_rate(on: bool) -> AbstractContextManager[Any]:
    """Price each sidecar at its own request rate instead of the shared CPU's."""
    if not on:
        return nullcontext()
    return mock.patch.object(engine, "shared_cpu_rates", lambda batch, pod_cpus: batch.rate)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--doc", required=True, nargs="+")
    a = ap.parse_args()
    profile = ProfileStore(a.db).get(a.profile)
    docs = [(json.loads(Path(d).read_text()), Path(d).parent / "traces") for d in a.doc]
    print("| prediction | latency p50: median abs. error (bias), beyond 30 % | CPU |")
    print("|---|---:|---:|")
    for v in VARIANTS:
        cases = []
        with highest_rate(v == "highest-rate"), own_rate(v == "own-rate"):
            for doc, traces in docs:
                for c in doc["cases"]:
                    m = CaseResult.measured_from_case(c)
                    tr = traces / f"{m.topology}-{m.query}-{m.mode}.json"
                    if m.error is not None or not tr.exists():
                        continue
                    sidecars = {s: SidecarConfig(Mode(x)) for s, x in m.sidecar_modes.items()}
                    pred = predict_traces(
                        tr, profile, sidecars, m.rate, pod_cpus=None if v == "critical-path" else 1
                    )
                    cases.append(replace(m, predicted=pred))
        s = ValidationResult(v, tuple(cases), profile.name, {}, {}, ()).summary()
        cells = [
            f"{s[k]['median_abs_error']:.1%} ({s[k]['mean_error']:+.1%}), {len(s[k]['beyond_30pct'])}"
            for k in ("latency", "cpu")
        ]
        print(f"| {v} ({len(cases)} cases) | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
