"""A validation suite run's CPU, pod by pod: measured (mesh − no mesh CPU per request of each
service's pod) against predicted (that service's sidecar: its rows' CPU and its idle share),
grouped by how many messages the sidecar sees per request.

    .venv/bin/python experiments/suite_by_service.py RUN_DIR --db DB --profile NAME

RUN_DIR: a ``meshtax validate --suite`` output directory (its ``cases/`` and ``traces/``). What
it showed on suite run 5 (BENCHMARKS.md, issue #14): sidecars with ≤ 2 crossings per request
(leaves) are under-predicted 14–40 % more than those with > 5 (fronts and fan-out hubs), in
every mode and with each of three profiles — the shared CPU's rate prices a leaf's messages as
warm as a hub's.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.engine import predict_batch, single_profile
from meshtax.store.sqlite import ProfileStore
from meshtax.traces import SpanOptions, load_traces

BANDS = ((0.0, 2.5), (2.5, 5.0), (5.0, float("inf")))


def pods(run: Path, profile_name: str, db: Path) -> list[tuple[str, float, float, float]]:
    """(mode, crossings per request, measured, predicted CPU-µs per request) per service pod."""
    prof = ProfileStore(db).get(profile_name)
    out = []
    for f in sorted(run.glob("cases/*/*.json")):
        case = json.loads(f.read_text())["case"]
        stem = f"{case['name'].replace('/', '-')}-{case['mode']}"
        sidecars = {s: SidecarConfig(Mode(m)) for s, m in case["sidecar_modes"].items()}
        opts = SpanOptions(rate=case["rate"], sidecars=sidecars, default_sidecar=SidecarConfig())
        b = load_traces(run / "traces" / f"{stem}.json", "otlp", opts).batch
        bp = predict_batch(b, single_profile(prof), pod_cpus=1)
        cpu: dict[str, float] = defaultdict(float)
        cross: dict[str, float] = defaultdict(float)
        for r in range(b.n_invocations):
            for who, spec, v in (
                (b.caller[r], b.caller_spec[r], bp.row_cpu_caller_vcpu[r]),
                (b.callee[r], b.callee_spec[r], bp.row_cpu_callee_vcpu[r]),
            ):
                if who < 0 or spec < 0:
                    continue
                name = b.services[who]
                cpu[name] += float(v) / float(b.rate[r]) * 1e6 / b.n_graphs
                cross[name] += 2.0 / b.n_graphs
        idle = bp.service_idle_vcpu
        for name, measured in case["cpu_by_service_us_per_request"].items():
            if name not in cpu:
                continue
            share = (
                0.0 if idle is None else float(idle[b.services.index(name)]) * 1e6 / case["rate"]
            )
            out.append((case["mode"], cross[name], float(measured), cpu[name] + share))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--profile", required=True)
    a = ap.parse_args()
    rows = pods(a.run, a.profile, a.db)
    print("| mode | crossings per request | pods | measured ÷ predicted (median) |")
    print("|---|---|---:|---:|")
    for mode in ("tcp", "http", "grpc"):
        for lo, hi in BANDS:
            sel = [m / p for md, c, m, p in rows if md == mode and lo <= c < hi and p > 0]
            if sel:
                band = f"> {lo:g}" if hi == float("inf") else f"[{lo:g}, {hi:g})"
                print(f"| {mode} | {band} | {len(sel)} | {statistics.median(sel):.2f} |")


if __name__ == "__main__":
    main()
