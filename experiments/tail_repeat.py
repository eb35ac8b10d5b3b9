"""How well does a tail validation's measured overhead repeat? Offline, on recorded documents
(``bench_tail.py``'s ``DIR/<stem>.json``): nothing is measured.

``.venv/bin/python experiments/tail_repeat.py --set NAME=DIR [--set …] [--stem onehop-http-of-mesh]``

Per set, document and level, the overhead at p50/p90/p99 (pooled percentile with the mesh −
without, as the validation computes it) with

- the 95 % interval from resampling the pairs (what the record already says),
- the two halves of the level's pairs (its passes, or with one pass its pairs in time order;
  ``TailPoint.halves``) and the odd/even pairs, each pooled on its own: their difference ÷ the
  whole's — the within-sitting repeatability,
- the level's no-mesh and mesh percentiles (which side moved),
- the first pair left out (warm-up),
- the pods' CPU busy share, the host's steal and the client CPU's busy share,

then, per document and level, the spread between sets (max ÷ min, and the coefficient of
variation of the overhead across sets) next to the within-set interval's half width.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshtax.validate.tail import TailPoint, TailRun, _pooled

KEYS = ("p50", "p90", "p99")


def points(doc: dict[str, Any]) -> list[TailPoint]:
    out = []
    for p in doc["tail"]["points"]:
        pairs = tuple(
            (TailRun.from_dict(r["no_mesh"]), TailRun.from_dict(r["mesh"])) for r in p["runs"]
        )
        passes = tuple(int(x) for x in p.get("passes", ()))
        out.append(TailPoint(float(p["fraction"]), float(p["rate"]), pairs, passes=passes))
    return out


def overhead(pairs: Sequence[tuple[TailRun, TailRun]], key: str) -> float:
    q = float(key[1:]) / 100
    return _pooled([m for _, m in pairs], q) - _pooled([b for b, _ in pairs], q)


def side(pairs: Sequence[tuple[TailRun, TailRun]], key: str, i: int) -> float:
    return _pooled([pr[i] for pr in pairs], float(key[1:]) / 100)


def share(runs: Sequence[TailRun], what: str) -> float:
    """Busy share of the ``pods`` or ``client`` CPU (``client_irq``: its interrupts' share)."""
    role = what.split("_")[0]
    key = what if "_" in what else f"{what}_busy"
    busy = sum(r.cpu_ns.get(key, 0) for r in runs)
    total = sum(r.cpu_ns.get(f"{role}_total", 0) for r in runs)
    return busy / total if total else float("nan")


def steal(runs: Sequence[TailRun]) -> float:
    st = sum(r.cpu_ns.get("pods_steal", 0) for r in runs)
    total = sum(r.cpu_ns.get("pods_total", 0) for r in runs)
    return st / total if total else float("nan")


def _weighted(runs: Sequence[TailRun], w: Sequence[np.ndarray], q: float) -> float:
    v = np.concatenate([np.asarray(r.quantiles_us, dtype=np.float64) for r in runs])
    ww = np.concatenate(w)
    order = np.argsort(v, kind="stable")
    cw = np.cumsum(ww[order])
    return float(np.interp(q * cw[-1], cw - ww[order] / 2, v[order]))


def iid_half_width(pairs: Sequence[tuple[TailRun, TailRun]], key: str, n: int = 200) -> float:
    """The 95 % interval's half width of the pooled overhead if every request were an
    independent draw (each run's requests resampled from its own quantiles, multinomially):
    what the request count alone allows, without run-to-run (episode) variability."""
    rng = np.random.default_rng(1)
    q = float(key[1:]) / 100
    got = []
    for _ in range(n):
        ov = 0.0
        for i, sign in ((1, 1.0), (0, -1.0)):
            runs = [pr[i] for pr in pairs]
            w = [
                rng.multinomial(
                    r.count, np.full(len(r.quantiles_us), 1 / len(r.quantiles_us))
                ).astype(np.float64)
                for r in runs
            ]
            ov += sign * _weighted(runs, w, q)
        got.append(ov)
    lo, hi = np.quantile(got, [0.025, 0.975])
    return float(hi - lo) / 2


def level_stats(pt: TailPoint) -> dict[str, Any]:
    pairs = sorted(pt.pairs, key=lambda pr: pr[0].t_start)
    n = len(pairs)
    h = n // 2
    out: dict[str, Any] = {"fraction": pt.fraction, "rate": pt.rate, "pairs": n}
    for key in KEYS:
        est = pt.measured(key)
        whole = est.median
        a, b = pt.halves(key) or (overhead(pairs[:h], key), overhead(pairs[h:], key))
        odd, even = overhead(pairs[0::2], key), overhead(pairs[1::2], key)
        out[key] = {
            "overhead": whole,
            "lo": est.lo,
            "hi": est.hi,
            "half_width_rel": (est.hi - est.lo) / 2 / abs(whole) if whole else float("nan"),
            "iid_half_width_rel": iid_half_width(pairs, key) / abs(whole)
            if whole
            else float("nan"),
            "halves": (a, b),
            "halves_rel": (a - b) / whole if whole else float("nan"),
            "odd_even": (odd, even),
            "odd_even_rel": (odd - even) / whole if whole else float("nan"),
            "no_first": overhead(pairs[1:], key) if n > 1 else float("nan"),
            "no_mesh": side(pairs, key, 0),
            "mesh": side(pairs, key, 1),
            "per_pair": [overhead([pr], key) for pr in pairs],
        }
    base = [b for b, _ in pairs]
    mesh = [m for _, m in pairs]
    out["pods_busy"] = (share(base, "pods"), share(mesh, "pods"))
    out["client_busy"] = (share(base, "client"), share(mesh, "client"))
    out["steal"] = (steal(base), steal(mesh))
    out["client_irq"] = (share(base, "client_irq"), share(mesh, "client_irq"))
    # the client CPU's busy time per request (tasks + interrupts), µs: without, with the mesh
    out["client_us"] = tuple(
        statistics.median(r.cpu_ns.get("client_busy", 0) * 1e-3 / r.count for r in rs)
        for rs in (base, mesh)
    )
    return out


def fmt(x: float) -> str:
    return "nan" if x != x else f"{x:,.0f}".replace(",", " ")


def pct(x: float) -> str:
    return "nan" if x != x else f"{x:+.0%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", required=True, help="NAME=DIR")
    ap.add_argument("--stem", action="append", default=None)
    ap.add_argument("--json", default=None, help="write every number here")
    a = ap.parse_args()
    stems = a.stem or ["onehop-http-of-mesh", "bookinfo-http-of-mesh"]
    sets = dict(s.split("=", 1) for s in a.set)
    table: dict[str, dict[str, dict[float, dict[str, Any]]]] = {}
    for stem in stems:
        table[stem] = {}
        for name, d in sets.items():
            path = Path(d) / f"{stem}.json"
            if not path.exists():
                continue
            doc = json.loads(path.read_text())
            table[stem][name] = {}
            print(
                f"\n## {stem}, set {name}: max no mesh {fmt(doc['tail']['max_no_mesh'])}/s, "
                f"mesh {fmt(doc['tail']['max_mesh'])}/s"
            )
            print(
                "| level | rate | key | overhead [95 %] | ±rel | ±rel iid | halves (diff/whole) | "
                "odd/even (diff/whole) | w/o 1st pair | no mesh / mesh | per pair | "
                "pods busy b/m | client busy b/m | client irq b/m | client µs/req b/m | steal b/m |"
            )
            print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            for pt in points(doc):
                s = level_stats(pt)
                table[stem][name][pt.fraction] = s
                for key in KEYS:
                    k = s[key]
                    print(
                        f"| {pt.fraction:.0%} | {fmt(pt.rate)} | {key} | {fmt(k['overhead'])} "
                        f"[{fmt(k['lo'])}, {fmt(k['hi'])}] | {k['half_width_rel']:.0%} | "
                        f"{k['iid_half_width_rel']:.0%} | "
                        f"{fmt(k['halves'][0])} / {fmt(k['halves'][1])} ({pct(k['halves_rel'])}) | "
                        f"{fmt(k['odd_even'][0])} / {fmt(k['odd_even'][1])} "
                        f"({pct(k['odd_even_rel'])}) | {fmt(k['no_first'])} | "
                        f"{fmt(k['no_mesh'])} / {fmt(k['mesh'])} | "
                        f"{' '.join(fmt(x) for x in k['per_pair'])} | "
                        + (
                            f"{s['pods_busy'][0]:.2f} / {s['pods_busy'][1]:.2f} | "
                            f"{s['client_busy'][0]:.2f} / {s['client_busy'][1]:.2f} | "
                            f"{s['client_irq'][0]:.2f} / {s['client_irq'][1]:.2f} | "
                            f"{s['client_us'][0]:.1f} / {s['client_us'][1]:.1f} | "
                            f"{s['steal'][0]:.3f} / {s['steal'][1]:.3f} |"
                            if key == "p50"
                            else "| | | | |"
                        )
                    )
    print("\n## Between sets vs within a set")
    print(
        "| document | level | key | per set | max/min | CV across sets | median ±rel within | "
        "median |halves| within | median ±rel iid within |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    for stem, by_set in table.items():
        fracs = sorted({f for s in by_set.values() for f in s})
        for f in fracs:
            have = {n: s[f] for n, s in by_set.items() if f in s}
            if len(have) < 2:
                continue
            for key in KEYS:
                v = np.array([s[key]["overhead"] for s in have.values()])
                within = statistics.median(s[key]["half_width_rel"] for s in have.values())
                halves = statistics.median(abs(s[key]["halves_rel"]) for s in have.values())
                iid = statistics.median(s[key]["iid_half_width_rel"] for s in have.values())
                cv = float(np.std(v, ddof=1) / abs(np.mean(v))) if np.mean(v) else float("nan")
                ratio = float(v.max() / v.min()) if v.min() > 0 else float("nan")
                summary.setdefault(stem, {}).setdefault(f"{f:g}", {})[key] = {
                    "per_set": {n: float(x) for n, x in zip(have, v, strict=True)},
                    "cv_between": cv,
                    "within_half_width_rel": within,
                    "within_halves_rel": halves,
                    "within_iid_half_width_rel": iid,
                }
                print(
                    f"| {stem} | {f:.0%} | {key} | "
                    f"{' '.join(f'{n}:{fmt(x)}' for n, x in zip(have, v, strict=True))} | "
                    f"{ratio:.1f} | {cv:.0%} | {within:.0%} | {halves:.0%} | {iid:.0%} |"
                )
    if a.json:
        Path(a.json).write_text(
            json.dumps({"levels": table, "between": summary}, indent=1, default=str)
        )


if __name__ == "__main__":
    main()
