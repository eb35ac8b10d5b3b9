"""Kept waypoint validations scored with the waypoint profile's CPU models counting the apps
around a waypoint call (``with``: the echo's whole CPU change on the callee's side and again
for the caller, in place of the load generator's — the profiler since the eleventh sitting of
issue #18) and without them (``without``: its user change alone, as from the eighth to the
tenth sitting). Measures nothing.

``.venv/bin/python experiments/waypoint_callers.py --db PROFILES.db --profile NAME
--doc OUT/waypoint/all.json``

A waypoint profile's measurement records say what the callers' terms add per crossing
(``caller_cpu_us``, profiles since the eleventh sitting); an older profile's are computed from
its record as the profiler does (``probe.chain_app_cpu_us`` and the load generator's change in
its kept probe windows). Either way the other variant's CPU models are refitted on their
samples shifted by that amount at that size, every rate, in Other (tcp mode, and what it
carries) or Parsing (http, gRPC): the component the profiler puts user-space work in. Prints
per case measured and predicted p50 latency and CPU overhead under both (the node proxies as
the code prices them), the waypoint calls a request and what the terms add per call, and the
median absolute errors. The placement, role profiles and pod CPUs are the validation's.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from meshtax.model.components import OTHER, PARSING, Component
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.profile import ModeProfile, Profile
from meshtax.model.sidecar import Architecture, Mode
from meshtax.profile.probed import client_cpu_us
from meshtax.store.sqlite import ProfileStore
from meshtax.validate.run import kept_cases

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _kept import error_line, kept_validation, kept_validation_parser  # noqa: E402


def callers_terms(profile: Profile) -> tuple[bool, dict[tuple[Mode, str, float], float]]:
    """(whether the models count them, per (mode, carried protocol, size) the CPU-µs a
    crossing the callers' terms add)."""
    opts = profile.provenance.options
    counted = False
    out: dict[tuple[Mode, str, float], float] = {}
    for key in ("measurements", "carried_measurements"):
        for name, rs in (opts.get(key) or {}).items():
            mode, proto = (Mode(name), "") if key == "measurements" else (Mode.TCP, name)
            for r in rs:
                if "caller_cpu_us" in r:
                    counted = True
                    out[mode, proto, float(r["size"])] = float(r["caller_cpu_us"])
                    continue
                chain = r["probe"].get("chain_app_cpu_us")
                if chain is None:
                    continue
                client = sum(client_cpu_us(r["probe"].get("windows") or []).values())
                add = chain["user"] + 2.0 * chain["kernel"] - client
                out[mode, proto, float(r["size"])] = add
    return counted, out


def _shifted(cm: CostModel, by_size: dict[float, float], sign: float) -> CostModel:
    s = cm.samples
    if s is None:
        return cm
    vals = [v + sign * by_size.get(z, 0.0) for z, v in zip(s.sizes, s.values)]
    return CostModel.fit(
        list(s.sizes), vals, rates=s.rates, split_bytes=cm.split_bytes, note=cm.note
    )


def variant(profile: Profile, with_callers: bool) -> Profile:
    """``profile`` with its waypoint's callers' terms counted or not."""
    counted, terms = callers_terms(profile)
    if counted == with_callers or not terms:
        return profile
    sign = 1.0 if with_callers else -1.0

    def fix(mp: ModeProfile, mode: Mode, proto: str) -> ModeProfile:
        by_size = {z: v for (m, p, z), v in terms.items() if m is mode and p == proto}
        if not by_size:
            return mp
        target: Component = OTHER if mode is Mode.TCP else PARSING
        comps: dict[Component, ComponentModel] = dict(mp.components)
        m = comps[target]
        comps[target] = replace(m, cpu=_shifted(m.cpu, by_size, sign))
        return replace(mp, components=comps)

    modes = []
    for mode, mp in profile.modes.items():
        mp = fix(mp, mode, "")
        mp = replace(mp, carried={p: fix(c, mode, p) for p, c in mp.carried.items()})
        modes.append(mp)
    return profile.with_modes(modes)


def main() -> None:
    ap = kept_validation_parser(__doc__, many=False, doc_help="a waypoint validation's all.json")
    a = ap.parse_args()
    store = ProfileStore(a.db)
    prof = store.get(a.profile)
    doc, arch, roles = kept_validation(store, a.doc, (Architecture.WAYPOINT,))
    way = roles[Architecture.WAYPOINT]
    counted, terms = callers_terms(way)
    print(
        f"{way.name}: callers' terms {'counted' if counted else 'not counted'} in its models; "
        "CPU-µs a crossing they add: "
        + ", ".join(
            f"{m.value}{'+' + p if p else ''} {z:.0f} B {v:+.1f}" for (m, p, z), v in terms.items()
        )
    )
    variants = {"without": variant(way, False), "with": variant(way, True)}
    errs: dict[str, list[float]] = {f"{k} {v}": [] for k in ("p50", "cpu") for v in variants}
    print()
    print("| case | p50 µs measured | without | with | CPU µs/request measured | without | with |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kc in kept_cases(a.doc, doc):
        c, p50, cpu = kc.record, kc.p50_us, kc.cpu_us
        cells: dict[str, Any] = {}
        for name, wp in variants.items():
            p = kc.predict(
                prof,
                pod_cpus=a.pod_cpus,
                architecture=arch,
                roles={**roles, Architecture.WAYPOINT: wp},
            )
            cells[name] = p
            errs[f"p50 {name}"].append(p.p50_us / p50 - 1)
            errs[f"cpu {name}"].append(p.cpu_us_per_request / cpu - 1)
        w, x = cells["without"], cells["with"]
        print(
            f"| {c['name']} | {p50:.0f} | {w.p50_us:.0f} ({w.p50_us / p50 - 1:+.0%}) "
            f"| {x.p50_us:.0f} ({x.p50_us / p50 - 1:+.0%}) | {cpu:.0f} "
            f"| {w.cpu_us_per_request:.0f} ({w.cpu_us_per_request / cpu - 1:+.0%}) "
            f"| {x.cpu_us_per_request:.0f} ({x.cpu_us_per_request / cpu - 1:+.0%}) |"
        )
    print()
    for k, v in errs.items():
        print(error_line(k, v))


if __name__ == "__main__":
    main()
