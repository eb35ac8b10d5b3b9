"""Predict the runs of a validation again: another profile, or another placement model, on the
very same measurements (issue 6).

``.venv/bin/python experiments/validate_repredict.py --doc artifacts/validation/all.json [more.json …]
[--db PROFILES.db] [--profile NAME] [--pod-cpus N|none]``

``--doc``: one or more ``all.json`` of ``benchmarks/bench_validate.py --keep-traces``; the no-mesh
traces are read from the ``traces`` directory next to each. A validation in another architecture
(``--architectures``: node-l4, waypoint) is predicted in it, services on the nodes it placed them
on, node proxies and waypoints priced from this machine's newest profile of their role in the
database, as the validation did. ``--pod-cpus none`` predicts as if every pod
had CPUs of its own (the critical path alone); the default is the placement the validation
ran with. Prints the per-case table and the summary; measures nothing.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from meshtax.app.pricing import role_profiles
from meshtax.model.sidecar import Architecture, Mode, SidecarConfig
from meshtax.store.sqlite import ProfileStore
from meshtax.testbed.pinning import Pinning
from meshtax.validate.appctl import load_topology
from meshtax.validate.prediction import predict_traces
from meshtax.validate.result import CaseResult, ValidationResult
from meshtax.validate.run import node_names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--doc", required=True, nargs="+")
    ap.add_argument("--db", default=None)
    ap.add_argument("--profile", default=None, help="default: the profile the validation used")
    ap.add_argument(
        "--pod-cpus",
        default="auto",
        help="N, 'none' (own CPUs), or 'auto' (the validation's placement)",
    )
    ap.add_argument(
        "--role-db", default=None, help="node-l4/waypoint profiles: this database's newest"
    )
    a = ap.parse_args()
    docs = [(json.loads(Path(d).read_text()), Path(d).parent / "traces") for d in a.doc]
    store = ProfileStore(a.db) if a.db else ProfileStore()
    role_store = ProfileStore(a.role_db) if a.role_db else store
    profile = store.get(a.profile or docs[0][0]["profile"])
    if a.pod_cpus == "auto":
        pinning = Pinning.from_dict(profile.provenance.options.get("pinning") or {})
        pod_cpus: int | None = pinning.pod_cpus()
    else:
        pod_cpus = None if a.pod_cpus == "none" else int(a.pod_cpus)
    cases: list[CaseResult] = []
    for c, traces, opts in ((c, t, doc["options"]) for doc, t in docs for c in doc["cases"]):
        measured = CaseResult.measured_from_case(c)
        trace = traces / f"{measured.topology}-{measured.query}-{measured.mode}.json"
        if measured.error is not None or not trace.exists():
            cases.append(replace(measured, error=measured.error or f"no kept traces at {trace}"))
            continue
        sidecars = {s: SidecarConfig(Mode(m)) for s, m in measured.sidecar_modes.items()}
        arch = Architecture(opts.get("architecture", "sidecar"))
        nodes, roles = None, None
        if arch is not Architecture.SIDECAR:
            topo = load_topology(measured.topology)
            names = topo.reachable(topo.query(measured.query))
            ppn = int(opts.get("pods_per_node", 1))
            nodes = node_names(names, ppn)
            got, _ = role_profiles(store, (arch,), accept_unclosed=True)
            roles = {r: store.get(n) for r, n in got.items()}
            # a role the other database measured wins
            mine, _ = role_profiles(role_store, (arch,), accept_unclosed=True)
            roles.update({r: role_store.get(n) for r, n in mine.items()})
        pred = predict_traces(
            trace,
            profile,
            sidecars,
            measured.rate,
            pod_cpus=pod_cpus,
            architecture=arch,
            nodes=nodes,
            roles=roles,
        )
        cases.append(replace(measured, predicted=pred))
    res = ValidationResult(
        "repredicted",
        tuple(cases),
        profile.name,
        docs[0][0].get("machine", {}),
        {"pod_cpus": pod_cpus},
        (),
    )
    print(f"profile {profile.name}, pod_cpus {pod_cpus}")
    print(res.table())
    s = res.summary()
    for m in ("latency", "p90", "cpu"):
        x = s[m]
        print(
            f"{m}: median abs error {x['median_abs_error']:.1%}, bias {x['mean_error']:+.1%}, "
            f"beyond 30 %: {len(x['beyond_30pct'])}"
        )
    for mode in ("tcp", "http", "grpc"):
        sub = ValidationResult(
            mode, tuple(c for c in cases if c.mode == mode), profile.name, {}, {}, ()
        ).summary()
        print(
            f"  {mode}: latency {sub['latency']['median_abs_error']:.1%} (bias {sub['latency']['mean_error']:+.1%}), "
            f"cpu {sub['cpu']['median_abs_error']:.1%} (bias {sub['cpu']['mean_error']:+.1%})"
        )


if __name__ == "__main__":
    main()
