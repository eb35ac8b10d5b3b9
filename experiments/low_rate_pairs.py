"""A kept validation predicted again with each role's repeated low-rate point taken from one
pair instead of the median pair (issue #18). Measures nothing.

``.venv/bin/python experiments/low_rate_pairs.py --db PROFILES.db --profile SIDECAR
--doc OUT/sidecar/all.json OUT/node-l4/all.json OUT/waypoint/all.json``

Profiles measured with ``meshtax profile --low-rate-repeats N`` keep every differenced pair of
a low rate at or below 150/s (``cpu[].pairs_us`` of ``provenance.options.measurements`` and
``carried_measurements``) and price with the pair of median total CPU. Variants: ``median``
(the models as stored, re-predicted: the like-for-like reference), ``pairK`` (each repeated
point's samples shifted by pair K's breakdown minus the kept pair's, field by field — read,
write, IPC, notification to their components, user + other kernel time to Parsing in http/gRPC
mode and to Other in tcp mode — and the changed CPU models refitted on their samples with
their split: what a one-pair profile would have priced had it measured pair K; pair 1 is the
one-pair plan's own run, same lengths, taken first), ``no-low`` (the models refitted without
their samples below 150/s: the rate term from 300/s up, extrapolated). Negative components
are not clamped again (the profiler's ``physical`` step), so a shifted sample may differ from
what the profiler would have stored there by that clamp.

Prints each repeated point's pairs (total CPU-µs a crossing), then per case the measured CPU
and each variant's CPU prediction (error), then per architecture and variant the median
absolute CPU error (mean signed). The placement, role profiles and pod CPUs are the
validation's (the role profiles: the database's newest of each role, as the validation took).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from meshtax.app.pricing import role_profiles
from meshtax.model.components import IPC, NOTIFICATION, OTHER, PARSING, READ, WRITE, Component
from meshtax.model.costmodel import ComponentModel, CostModel
from meshtax.model.profile import ModeProfile, Profile
from meshtax.model.sidecar import Architecture, Mode, SidecarConfig
from meshtax.profile.plan import Plan
from meshtax.store.sqlite import ProfileStore
from meshtax.validate.appctl import load_topology
from meshtax.validate.prediction import predict_traces
from meshtax.validate.run import node_names

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _kept import kept_validation_parser  # noqa: E402

#: a low rate at or below this is the repeated one
REPEAT_MAX = Plan.low_rate_repeat_max
_FIELDS = {"read": READ, "write": WRITE, "ipc": IPC, "notification": NOTIFICATION}


def repeated_points(profile: Profile) -> list[tuple[Mode, str, float, dict[str, Any]]]:
    """(mode, carried protocol or "", size, CPU record) of every repeated low-rate point."""
    opts = profile.provenance.options
    out = []
    for key in ("measurements", "carried_measurements"):
        for name, rs in (opts.get(key) or {}).items():
            mode, proto = (Mode(name), "") if key == "measurements" else (Mode.TCP, name)
            for r in rs:
                for rec in r.get("cpu") or []:
                    if rec.get("pairs_us") and float(rec["rate"]) <= REPEAT_MAX:
                        out.append((mode, proto, float(r["size"]), rec))
    return out


def shifts(
    mode: Mode, kept: Mapping[str, float], pair: Mapping[str, float]
) -> dict[Component, float]:
    """Per component, pair − kept (see the module docstring)."""
    d = {c: pair[f] - kept[f] for f, c in _FIELDS.items()}
    work = (pair["user"] + pair["kernel_other"]) - (kept["user"] + kept["kernel_other"])
    d[OTHER if mode is Mode.TCP else PARSING] = work
    return d


def refit(cm: CostModel, change: Mapping[int, float] | None, drop_below: float | None) -> CostModel:
    """``cm`` fitted again on its samples, ``change`` added to samples by index, or the samples
    below ``drop_below`` requests/s left out."""
    s = cm.samples
    if s is None or s.rates is None:
        return cm
    vals = [v + (change or {}).get(i, 0.0) for i, v in enumerate(s.values)]
    keep = [i for i, r in enumerate(s.rates) if drop_below is None or r >= drop_below]
    if not keep:
        return cm
    return CostModel.fit(
        [s.sizes[i] for i in keep],
        [vals[i] for i in keep],
        rates=[s.rates[i] for i in keep],
        split_bytes=cm.split_bytes,
        note=cm.note,
    )


def _at(cm: CostModel, size: float) -> list[int]:
    s = cm.samples
    if s is None or s.rates is None:
        return []
    return [i for i, (z, r) in enumerate(zip(s.sizes, s.rates)) if z == size and r <= REPEAT_MAX]


def variant(profile: Profile, which: str) -> Profile:
    """``profile`` priced as ``which`` says (median, pairK, no-low)."""
    if which == "median":
        return profile
    k = int(which[4:]) - 1 if which.startswith("pair") else None
    by_model: dict[tuple[Mode, str], dict[tuple[Component, float], float]] = {}
    for mode, proto, size, rec in repeated_points(profile):
        pairs = rec["pairs_us"]
        if k is not None and k < len(pairs):
            for c, v in shifts(mode, rec["breakdown_us"], pairs[k]).items():
                by_model.setdefault((mode, proto), {})[(c, size)] = v
        else:
            by_model.setdefault((mode, proto), {})

    def fix(mp: ModeProfile, key: tuple[Mode, str]) -> ModeProfile:
        if key not in by_model:
            return mp
        comps: dict[Component, ComponentModel] = {}
        for c, m in mp.components.items():
            if k is None:
                comps[c] = replace(m, cpu=refit(m.cpu, None, REPEAT_MAX))
                continue
            change = {
                i: v for (cc, size), v in by_model[key].items() if cc == c for i in _at(m.cpu, size)
            }
            comps[c] = replace(m, cpu=refit(m.cpu, change, None)) if change else m
        return replace(mp, components=comps)

    modes = []
    for m, mp in profile.modes.items():
        mp = fix(mp, (m, ""))
        mp = replace(mp, carried={p: fix(c, (m, p)) for p, c in mp.carried.items()})
        modes.append(mp)
    return profile.with_modes(modes)


def describe_points(profile: Profile) -> list[str]:
    lines = []
    for mode, proto, size, rec in repeated_points(profile):
        tot = [sum(p.values()) for p in rec["pairs_us"]]
        kept = sum(rec["breakdown_us"].values())
        what = f"{mode.value}+{proto}" if proto else mode.value
        lines.append(
            f"| {profile.name} | {what} | {size:.0f} | {rec['rate']:.0f} | "
            + " / ".join(f"{t:.1f}" for t in tot)
            + f" | {kept:.1f} | {max(tot) / min(tot) if min(tot) > 0 else float('nan'):.2f} |"
        )
    return lines


def main() -> None:
    ap = kept_validation_parser(__doc__)
    ap.add_argument("--variants", default="median,pair1,pair2,pair3,no-low")
    a = ap.parse_args()
    store = ProfileStore(a.db)
    variants = a.variants.split(",")
    docs = [json.loads(Path(p).read_text()) for p in a.doc]
    archs = tuple(Architecture(d["options"]["architecture"]) for d in docs)
    got, _ = role_profiles(store, archs, accept_unclosed=True)
    base = {Architecture.SIDECAR: store.get(a.profile), **{r: store.get(n) for r, n in got.items()}}
    print("| profile | point | size | rate | pairs: total CPU-µs a crossing | kept | max/min |")
    print("|---|---|---:|---:|---|---:|---:|")
    for p in base.values():
        print("\n".join(describe_points(p)))
    priced = {v: {r: variant(p, v) for r, p in base.items()} for v in variants}
    print()
    print(
        "| architecture | case | CPU µs/request measured | as run | " + " | ".join(variants) + " |"
    )
    print("|---|---|---:|---:|" + "---:|" * len(variants))
    errs: dict[tuple[str, str], list[float]] = {}
    for path, doc in zip(a.doc, docs):
        arch = Architecture(doc["options"]["architecture"])
        ppn = int(doc["options"].get("pods_per_node", 1))
        for c in doc["cases"]:
            if c.get("error_message") or "cpu" not in c:
                continue
            topo_name, query = c["name"].split("/")
            trace = Path(path).parent / "traces" / f"{topo_name}-{query}-{c['mode']}.json"
            topo = load_topology(topo_name)
            nodes = node_names(topo.reachable(topo.query(query)), ppn)
            sidecars = {s: SidecarConfig(Mode(m)) for s, m in c["sidecar_modes"].items()}
            cpu = c["cpu"]["per_request_us"]
            measured = float(cpu["measured"])
            cells = []
            for v in variants:
                roles: dict[Architecture, Profile] = {
                    r: q for r, q in priced[v].items() if r is not Architecture.SIDECAR
                }
                got_v = predict_traces(
                    trace,
                    priced[v][Architecture.SIDECAR],
                    sidecars,
                    c["rate"],
                    pod_cpus=a.pod_cpus,
                    architecture=arch,
                    nodes=nodes if arch is not Architecture.SIDECAR else None,
                    roles=roles if arch is not Architecture.SIDECAR else None,
                )
                e = got_v.cpu_us_per_request / measured - 1
                errs.setdefault((arch.value, v), []).append(e)
                cells.append(f"{got_v.cpu_us_per_request:.0f} ({e:+.0%})")
            print(
                f"| {arch.value} | {c['name']} | {measured:.0f} | {float(cpu['predicted']):.0f} | "
                + " | ".join(cells)
                + " |"
            )
    print()
    print("| architecture | " + " | ".join(variants) + " |")
    print("|---|" + "---:|" * len(variants))
    for name in dict.fromkeys(x.value for x in archs):
        print(
            f"| {name} | " + " | ".join(_summary(errs.get((name, v), [])) for v in variants) + " |"
        )


def _summary(e: Sequence[float]) -> str:
    if not e:
        return "-"
    return f"{statistics.median(abs(x) for x in e):.1%} ({statistics.fmean(e):+.1%})"


if __name__ == "__main__":
    main()
