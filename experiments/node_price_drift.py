"""What node-l4's price a crossing moves with from sitting to sitting, and whether scaling it by
a speed the profiles measured makes it steadier without worsening the kept validations (issue
#18). Measures nothing.

``.venv/bin/python experiments/node_price_drift.py --sitting DB:SIDECAR:DOC [DB:SIDECAR:DOC ...]``

Each ``--sitting`` is a profile database, the sidecar profile its validation used and that
validation's kept node-l4 ``all.json`` (``benchmarks/bench_validate.py --keep-traces``); the
node-l4 profile is the database's newest (as the validation took it). Per sitting it prints
what the node-l4 profile measured that could move its price: the total CPU-µs a carried-http
crossing at 100 B priced at 200 / 1 000/s (chain/two's and Online Boutique's shared-CPU rates),
the kept 100/s pair and every pair, the 300/s and 1 000/s single pairs, the closed-loop point
(CPU-µs a crossing and its rate), the 100/s run's perf ÷ schedstat and its window's other
tenants and wait, and the speed (reference workload and reference sidecar, ns) stored in the
node-l4 and in the sidecar profile; then the validation's node proxies measured a crossing
(median over its cases). Then the correlation (Pearson, over the sittings) of the 200/s price
and of the measured crossing with each of those.

Variants, each re-predicting the kept node-l4 cases (CPU and p50 median absolute error) and
giving the 200/s price's max/min over the sittings:

- ``as-run``: the engine as it is;
- ``kinds``: the node-l4 profile's costs scaled to the sidecar profile's speed by kind (kernel
  path by the same-CPU ping-pong, wake-ups by the cross-CPU one, user space by the reference
  sidecar: the engine's ``speed_factor`` with "now" = the sidecar profile's speed);
- ``refsc``: every node-l4 cost scaled by the sidecar profile's reference sidecar ÷ the
  node-l4 profile's;
- ``perf``: every node-l4 cost scaled by ``PERF_REF`` ÷ the node-l4 profile's 100/s carried-http
  run's perf ÷ schedstat (how much of the run perf sampled; the price follows it on s9–s13).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from low_rate_pairs import repeated_points  # noqa: E402

from meshtax.app.pricing import role_profiles  # noqa: E402
from meshtax.model.profile import ModeProfile, Profile  # noqa: E402
from meshtax.model.sidecar import Architecture, Mode  # noqa: E402
from meshtax.model.speed import Speed, speed_factor  # noqa: E402
from meshtax.store.sqlite import ProfileStore  # noqa: E402
from meshtax.validate.prediction import predict_traces  # noqa: E402
from meshtax.validate.run import kept_cases  # noqa: E402

VARIANTS = ("as-run", "kinds", "refsc", "perf")
#: ``perf``'s reference perf ÷ schedstat of the 100/s run (the median of s9–s13's node-l4
#: profiles, 0.663 / 0.543 / 0.660 / 0.701 / 0.618: chosen on seen data)
PERF_REF = 0.66
FIELDS = ("read", "write", "ipc", "notification", "user", "kernel_other")


def total(mp: ModeProfile, size: float, rate: float) -> float:
    """Total CPU-µs a crossing of ``mp`` at ``size`` and ``rate``."""
    return sum(float(m.cpu.predict([size], [rate])[0]) for m in mp.components.values())


def _tot(breakdown: dict[str, float]) -> float:
    return sum(float(breakdown[f]) for f in FIELDS)


def now_speed(variant: str, sidecar: Profile, node: Profile) -> Speed | None:
    """The "now" speed a variant predicts with (None: as measured)."""
    s, n = sidecar.speed, node.speed
    if variant == "as-run" or s is None or n is None:
        return None
    if variant == "kinds":
        return s
    if variant == "perf":
        r = PERF_REF / readings(sidecar, node)["r100 perf/schedstat"]
    elif s.sidecar_ns is None or n.sidecar_ns is None:
        raise SystemExit("refsc needs both profiles' reference sidecar")
    else:
        r = s.sidecar_ns / n.sidecar_ns
    sc = None if n.sidecar_ns is None else n.sidecar_ns * r
    return Speed(n.local_ns * r, n.cross_ns * r, n.user_ns * r, s.measured, sc)


def readings(sidecar: Profile, node: Profile) -> dict[str, float]:
    """What the node-l4 profile (and the sidecar profile's speed) measured, by name."""
    out: dict[str, float] = {}
    nl = node.modes[Mode.TCP].carried["http"]
    out["price 200/s"] = total(nl, 100.0, 200.0)
    out["price 1000/s"] = total(nl, 100.0, 1000.0)
    recs = next(
        r
        for r in node.provenance.options["carried_measurements"]["http"]
        if float(r["size"]) == 100.0
    )
    for rec in recs["cpu"]:
        out[f"{rec['run']} pair"] = _tot(rec["breakdown_us"])
        if rec["run"] == "max":
            out["max rate"] = float(rec["rate"])
        if rec["run"] == "r100":
            out["r100 perf/schedstat"] = float(rec.get("perf_over_schedstat") or float("nan"))
            inter = rec.get("interference") or {}
            out["r100 others"] = float(inter.get("others") or 0.0)
            out["r100 wait"] = float(inter.get("wait") or 0.0)
    for mode, proto, size, rec in repeated_points(node):
        if (mode, proto, size) == (Mode.TCP, "http", 100.0):
            pairs = sorted(_tot(p) for p in rec["pairs_us"])
            out["r100 pairs min"], out["r100 pairs max"] = pairs[0], pairs[-1]
    for who, p in (("node", node), ("sidecar", sidecar)):
        if p.speed is not None:
            out[f"{who} local ns"] = p.speed.local_ns
            out[f"{who} cross ns"] = p.speed.cross_ns
            out[f"{who} user ns"] = p.speed.user_ns
            out[f"{who} refsidecar µs"] = (p.speed.sidecar_ns or float("nan")) / 1e3
    return out


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    try:
        return statistics.correlation(list(x), list(y))
    except statistics.StatisticsError:
        return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sitting", nargs="+", required=True, help="DB:SIDECAR:DOC")
    a = ap.parse_args()
    rows: dict[str, dict[str, float]] = {}
    errs: dict[str, dict[str, tuple[float, float, list[float]]]] = {v: {} for v in VARIANTS}
    for spec in a.sitting:
        db, name, doc_path = spec.split(":")
        store = ProfileStore(db)
        sidecar = store.get(name)
        got, _ = role_profiles(store, (Architecture.NODE_L4,), accept_unclosed=True)
        node = store.get(got[Architecture.NODE_L4])
        label = Path(db).parent.name
        rows[label] = readings(sidecar, node)
        doc = json.loads(Path(doc_path).read_text())
        for v in VARIANTS:
            speed = now_speed(v, sidecar, node)
            p50e, cpue = [], []
            for kc in kept_cases(doc_path, doc):
                p = predict_traces(
                    kc.trace,
                    sidecar,
                    kc.sidecars,
                    float(kc.record["rate"]),
                    pod_cpus=1,
                    architecture=Architecture.NODE_L4,
                    nodes=kc.nodes,
                    roles={Architecture.NODE_L4: node},
                    speed=speed,
                )
                p50e.append(p.p50_us / kc.p50_us - 1)
                cpue.append(p.cpu_us_per_request / kc.cpu_us - 1)
            med = statistics.median
            errs[v][label] = (med(abs(e) for e in p50e), med(abs(e) for e in cpue), cpue)
            if speed is not None and node.speed is not None:
                nl = node.modes[Mode.TCP].carried["http"]
                f200 = sum(
                    float(m.cpu.predict([100.0], [200.0])[0]) * speed_factor(c, speed, node.speed)
                    for c, m in nl.components.items()
                )
                rows[label][f"price 200/s {v}"] = f200
            else:
                rows[label][f"price 200/s {v}"] = rows[label]["price 200/s"]
    labels = list(rows)
    keys = sorted(
        {k for r in rows.values() for k in r}, key=lambda k: (not k.startswith("price"), k)
    )
    print("| reading | " + " | ".join(labels) + " | max/min | r with price 200/s |")
    print("|---|" + "---:|" * (len(labels) + 2))
    price = [rows[s]["price 200/s"] for s in labels]
    for k in keys:
        xs = [rows[s].get(k, float("nan")) for s in labels]
        ok = all(x == x for x in xs)
        mm = max(xs) / min(xs) if ok and min(xs) > 0 else float("nan")
        r = pearson(xs, price) if ok else float("nan")
        print(f"| {k} | " + " | ".join(f"{x:.3g}" for x in xs) + f" | {mm:.2f} | {r:+.2f} |")
    print()
    print("| variant | " + " | ".join(f"{s} p50 / CPU" for s in labels) + " |")
    print("|---|" + "---:|" * len(labels))
    for v in VARIANTS:
        print(
            f"| {v} | "
            + " | ".join(f"{errs[v][s][0]:.1%} / {errs[v][s][1]:.1%}" for s in labels)
            + " |"
        )
    for v in VARIANTS:
        print(
            f"{v} per case CPU errors: "
            + "; ".join(f"{s} " + " ".join(f"{e:+.0%}" for e in errs[v][s][2]) for s in labels)
        )


if __name__ == "__main__":
    main()
