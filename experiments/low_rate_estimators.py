"""How much a role's price moves from sitting to sitting with each way of turning the repeated
low-rate pairs into its CPU models, and what each way does to a kept validation (issue #18).
Measures nothing.

``.venv/bin/python experiments/low_rate_estimators.py --sitting DB:SIDECAR [DB:SIDECAR ...]
[--doc OUT/sidecar/all.json OUT/node-l4/all.json OUT/waypoint/all.json]``

Each ``--sitting`` is a profile database and the sidecar profile its validation used; the
node-l4 and waypoint profiles are the database's newest of those roles (as the validation took
them). Profiles measured with ``meshtax profile --low-rate-repeats N`` keep every differenced
pair of the repeated low rate (``cpu[].pairs_us``). Variants, each refitting the changed CPU
models on their samples (``experiments/low_rate_pairs.py`` maps a pair to components):

- ``median``: as stored (the pair of median total CPU, one sample; the profiler's);
- ``all``: every pair a sample of its own (least squares: their mean, with the pairs' weight);
- ``mean``: the pairs' mean as the one sample;
- ``med3``: the median pair, weighted by the number of pairs (a sample per pair, each the
  median pair's);
- ``nomid``: as stored, without the single-pair low rates above the repeated one at the
  repeated size (300/s and 1 000/s in the quick preset).

Prints, per variant, the price inputs the validation's small graphs ride on (total CPU-µs a
crossing at 100 B): the sidecar in http mode and the node proxy carrying http at the shared-CPU
rates of the four validation cases (200, 500, 700, 1 000/s at 100/s, 2 pods a node), the
waypoint in http mode at 100/s (the rate each waypoint carries), one column per sitting and
their max/min, and the node proxy's kept 100/s pair as measured (total CPU-µs a crossing);
then, with ``--doc`` (one sitting's kept validation, priced with the last
``--sitting``), per architecture and variant the p50-latency and CPU median absolute errors
(mean signed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from low_rate_pairs import REPEAT_MAX, repeated_points, shifts  # noqa: E402

from meshtax.app.pricing import role_profiles  # noqa: E402
from meshtax.model.components import Component  # noqa: E402
from meshtax.model.costmodel import ComponentModel, CostModel  # noqa: E402
from meshtax.model.profile import ModeProfile, Profile  # noqa: E402
from meshtax.model.sidecar import Architecture, Mode  # noqa: E402
from meshtax.store.sqlite import ProfileStore  # noqa: E402
from meshtax.validate.run import kept_cases  # noqa: E402

VARIANTS = ("median", "all", "mean", "med3", "nomid")
#: the shared-CPU rates of chain/two, chain/four, Bookinfo and Online Boutique at 100/s
CASE_RATES = (200.0, 500.0, 700.0, 1000.0)
#: the single-pair low rates ``nomid`` leaves out lie above the repeated one and up to this
MID_MAX = 1100.0

Samples = tuple[list[float], list[float], list[float]]


def _edit(which: str, size: float, at: list[int], diffs: Sequence[float], s: Samples) -> None:
    """``s`` (sizes, values, rates) edited in place at the repeated point's indices ``at``;
    ``diffs``: each pair's component value minus the stored (median) pair's."""
    sz, vs, rs = s
    for i in at:
        base = vs[i]
        if which == "all":
            vs[i] = base + diffs[0]
            extra = [base + d for d in diffs[1:]]
        elif which == "mean":
            vs[i] = base + statistics.fmean(diffs)
            extra = []
        elif which == "med3":
            extra = [base] * (len(diffs) - 1)
        else:
            extra = []
        for v in extra:
            sz.append(size)
            vs.append(v)
            rs.append(rs[i])


def refit_cpu(cm: CostModel, edit: Callable[[Samples], bool]) -> CostModel:
    """``cm`` refitted on its samples after ``edit`` (which says whether it changed them)."""
    s = cm.samples
    if s is None or s.rates is None:
        return cm
    got: Samples = (list(s.sizes), list(s.values), list(s.rates))
    if not edit(got):
        return cm
    sz, vs, rs = got
    return CostModel.fit(sz, vs, rates=rs, split_bytes=cm.split_bytes, note=cm.note)


def variant(profile: Profile, which: str) -> Profile:
    """``profile`` with its repeated low-rate points taken as ``which`` says."""
    if which == "median":
        return profile
    points: dict[tuple[Mode, str], list[tuple[float, list[dict[Component, float]]]]] = {}
    for mode, proto, size, rec in repeated_points(profile):
        d = [shifts(mode, rec["breakdown_us"], p) for p in rec["pairs_us"]]
        points.setdefault((mode, proto), []).append((size, d))

    def fix(mp: ModeProfile, key: tuple[Mode, str]) -> ModeProfile:
        if key not in points:
            return mp
        comps: dict[Component, ComponentModel] = {}
        for c, m in mp.components.items():

            def edit(s: Samples, c: Component = c) -> bool:
                sz, vs, rs = s
                changed = False
                for size, d in points[key]:
                    at = [
                        i for i, (z, r) in enumerate(zip(sz, rs)) if z == size and r <= REPEAT_MAX
                    ]
                    if which == "nomid":
                        keep = [
                            i
                            for i, (z, r) in enumerate(zip(sz, rs))
                            if not (z == size and REPEAT_MAX < r <= MID_MAX)
                        ]
                        changed = changed or len(keep) < len(sz)
                        s0 = ([sz[i] for i in keep], [vs[i] for i in keep], [rs[i] for i in keep])
                        sz[:], vs[:], rs[:] = s0
                    elif at:
                        _edit(which, size, at, [x.get(c, 0.0) for x in d], s)
                        changed = True
                return changed

            comps[c] = replace(m, cpu=refit_cpu(m.cpu, edit))
        return replace(mp, components=comps)

    modes = []
    for m, mp in profile.modes.items():
        fixed = fix(mp, (m, ""))
        modes.append(replace(fixed, carried={p: fix(c, (m, p)) for p, c in mp.carried.items()}))
    return profile.with_modes(modes)


def total(mp: ModeProfile, size: float, rate: float) -> float:
    """Total CPU-µs a crossing of ``mp`` at ``size`` and ``rate``."""
    return sum(float(m.cpu.predict([size], [rate])[0]) for m in mp.components.values())


def inputs(profiles: dict[Architecture, Profile]) -> dict[str, float]:
    """The price inputs (see the module docstring), by name."""
    out: dict[str, float] = {}
    sc = profiles[Architecture.SIDECAR].modes[Mode.HTTP]
    nl = profiles[Architecture.NODE_L4].modes[Mode.TCP].carried["http"]
    wp = profiles[Architecture.WAYPOINT].modes[Mode.HTTP]
    for r in CASE_RATES:
        out[f"sidecar http {r:.0f}/s"] = total(sc, 100.0, r)
    for r in CASE_RATES:
        out[f"node-l4 carried http {r:.0f}/s"] = total(nl, 100.0, r)
    out["waypoint http 100/s"] = total(wp, 100.0, 100.0)
    # the node proxy's kept 100/s point itself (as measured; the same in every variant)
    for mode, proto, size, rec in repeated_points(profiles[Architecture.NODE_L4]):
        if (mode, proto, size) == (Mode.TCP, "http", 100.0):
            out["node-l4 carried http 100/s kept pair"] = sum(rec["breakdown_us"].values())
    return out


def load(spec: str) -> tuple[str, dict[Architecture, Profile]]:
    db, name = spec.rsplit(":", 1)
    store = ProfileStore(db)
    got, _ = role_profiles(
        store, (Architecture.NODE_L4, Architecture.WAYPOINT), accept_unclosed=True
    )
    return name, {
        Architecture.SIDECAR: store.get(name),
        **{r: store.get(n) for r, n in got.items()},
    }


def _summary(e: Sequence[float]) -> str:
    if not e:
        return "-"
    return f"{statistics.median(abs(x) for x in e):.1%} ({statistics.fmean(e):+.1%})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sitting", required=True, nargs="+", help="DB:SIDECAR_PROFILE")
    ap.add_argument("--doc", nargs="*", default=[])
    ap.add_argument("--pod-cpus", type=int, default=1)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    variants = a.variants.split(",")
    sittings = [load(s) for s in a.sitting]
    priced = {
        (name, v): {r: variant(p, v) for r, p in base.items()}
        for name, base in sittings
        for v in variants
    }
    names = [n for n, _ in sittings]
    print(
        "| price input (CPU-µs a crossing, 100 B) | variant | " + " | ".join(names) + " | max/min |"
    )
    print("|---|---|" + "---:|" * (len(names) + 1))
    got = {k: inputs(ps) for k, ps in priced.items()}
    for key in got[(names[0], variants[0])]:
        for v in variants:
            xs = [got[(n, v)][key] for n in names]
            ratio = max(xs) / min(xs) if min(xs) > 0 else float("nan")
            print(f"| {key} | {v} | " + " | ".join(f"{x:.1f}" for x in xs) + f" | {ratio:.2f} |")
    if not a.doc:
        return
    last = names[-1]
    errs: dict[tuple[str, str, str], list[float]] = {}
    print()
    print("| architecture | case | p50 / CPU measured | " + " | ".join(variants) + " |")
    print("|---|---|---:|" + "---|" * len(variants))
    for path in a.doc:
        doc = json.loads(Path(path).read_text())
        arch = Architecture(doc["options"]["architecture"])
        for case in kept_cases(path, doc):
            cells = []
            for v in variants:
                ps = priced[(last, v)]
                roles: dict[Architecture, Profile] = {
                    r: q for r, q in ps.items() if r is not Architecture.SIDECAR
                }
                side = arch is Architecture.SIDECAR
                p = case.predict(
                    ps[Architecture.SIDECAR],
                    pod_cpus=a.pod_cpus,
                    architecture=arch,
                    roles=roles if not side else {},
                )
                e_l = p.p50_us / case.p50_us - 1
                e_c = p.cpu_us_per_request / case.cpu_us - 1
                errs.setdefault((arch.value, v, "p50"), []).append(e_l)
                errs.setdefault((arch.value, v, "cpu"), []).append(e_c)
                cells.append(f"{e_l:+.0%} / {e_c:+.0%}")
            print(
                f"| {arch.value} | {case.record['name']} | {case.p50_us:.0f} / "
                f"{case.cpu_us:.0f} | " + " | ".join(cells) + " |"
            )
    print()
    print("| architecture | metric | " + " | ".join(variants) + " |")
    print("|---|---|" + "---:|" * len(variants))
    for arch_name in dict.fromkeys(k[0] for k in errs):
        for metric in ("p50", "cpu"):
            row = [_summary(errs.get((arch_name, v, metric), [])) for v in variants]
            print(f"| {arch_name} | {metric} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
