"""How well a tail validation's passes agree with each other (issue #20): per level and
percentile, each pass's overhead on its own (every request of the pass's runs pooled, as the
whole level is) and how far the passes are apart, ÷ the whole level's overhead; with three or
more passes, every pair of passes. Offline, on stored documents; measures nothing.

With ``--set DB ONEHOP TOPO`` (repeatable, the sets' scored levels as ``tail_bias_saturation.py``
scores them, the 60 % level left out): how much of the model's p90/p99 error the measurement's
own noise could be — per level the two passes, the model's error against the whole level and
against each pass, the error of a predictor that is another pass (predict one pass with the
other) or the passes' mean (scored against each); the noise floor of a perfect predictor
against the mean of n passes from the passes' log-ratio d (iid noise per pass: median |d| ÷
√(2n)), and the passes n a level needs for that floor to stay under a third of the bar; and
each pass split in its halves of pairs in time order, halves within a pass against halves of
the two passes (is the noise the pairs' sampling or a drift between passes?).

    .venv/bin/python experiments/tail_passes.py DOC.json [DOC.json ...] [--skip 0.6]
    .venv/bin/python experiments/tail_passes.py --set DB ONEHOP TOPO [--set …] [--bar 0.2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _tail_sets import set_profile
from tail_bias_saturation import level_errors, set_docs

from meshtax.validate.tail import TailRun, _pooled

PCTS = ("p50", "p90", "p99")
Pair = tuple[TailRun, TailRun]


def pass_overheads(d: dict, key: str) -> tuple[float, list[float]]:  # type: ignore[type-arg]
    """The whole level's overhead at ``key`` and each pass's."""
    q = float(key[1:]) / 100
    passes = split_passes(d)
    return _ov([p for x in passes for p in x], q), [_ov(x, q) for x in passes]


def split_passes(d: dict) -> list[list[Pair]]:  # type: ignore[type-arg]
    """A level's pairs per pass, in time order (one pass when the record has no passes)."""
    pairs = [(TailRun.from_dict(r["no_mesh"]), TailRun.from_dict(r["mesh"])) for r in d["runs"]]
    sizes = [int(x) for x in d.get("passes", ())] or [len(pairs)]
    out, at = [], 0
    for n in sizes:
        out.append(pairs[at : at + n])
        at += n
    return out


def _ov(sel: Sequence[Pair], q: float) -> float:
    return _pooled([m for _, m in sel], q) - _pooled([b for b, _ in sel], q)


KEYS = ("p90", "p99")


def noise_rows(sets: Sequence[Sequence[str]], variant: str) -> list[dict[str, Any]]:
    """Per set, topology, scored level and percentile: the two passes' overheads, the whole
    level's, the model's prediction and each pass's halves (first and second half of its pairs)."""
    rows: list[dict[str, Any]] = []
    for db, onehop, topo in sets:
        prof = set_profile(db, onehop)
        docs = set_docs(onehop, topo)
        model = level_errors(docs, prof, variant)
        for _, doc in docs:
            t = doc["tail"]
            ratios = model[t["topology"]]
            for d in t["points"]:
                f = float(d["fraction"])
                if f not in ratios or f < 0:  # not scored (the 60 % level, unsustained)
                    continue
                passes = split_passes(d)
                assert len(passes) == 2, f"{t['topology']} {f}: {len(passes)} passes"
                for k in KEYS:
                    q = float(k[1:]) / 100
                    whole = _ov([p for x in passes for p in x], q)
                    rows.append(
                        {
                            "set": Path(topo).parent.name,
                            "topology": t["topology"],
                            "level": f,
                            "key": k,
                            "passes": [_ov(x, q) for x in passes],
                            "whole": whole,
                            "model": ratios[f][k] * whole,
                            "halves": [
                                (_ov(x[: len(x) // 2], q), _ov(x[len(x) // 2 :], q)) for x in passes
                            ],
                        }
                    )
    return rows


def _rel(x: float, y: float) -> float:
    return x / y - 1 if y else math.nan


def _ln(x: float, y: float) -> float:
    return math.log(x / y) if x > 0 and y > 0 else math.nan


def _med(xs: Sequence[float]) -> float:
    v = [abs(x) for x in xs if x == x]
    return statistics.median(v) if v else math.nan


def summary(rows: Sequence[dict[str, Any]], bar: float) -> dict[str, float]:
    """A group of rows' median abs errors: the model against the whole level and each pass,
    another pass and the passes' mean against each pass; the passes' median |ln ratio| d, the
    noise floor of a perfect predictor against one pass (d ÷ √2) and the whole (d ÷ 2), the
    model's error net of that floor (in quadrature), the passes a level needs for the floor
    to stay under a third of ``bar`` and how many levels' passes are ≥ 1.5× apart."""
    model_w = [_rel(r["model"], r["whole"]) for r in rows]
    model_p = [_rel(r["model"], x) for r in rows for x in r["passes"]]
    other = [_rel(a, b) for r in rows for a, b in (r["passes"], r["passes"][::-1])]
    mean = [_rel(sum(r["passes"]) / 2, x) for r in rows for x in r["passes"]]
    lns = [_ln(*r["passes"]) for r in rows]
    d = _med(lns)
    floor = d / 2
    m = _med(model_w)
    return {
        "n": len(rows),
        "model_whole": m,
        "model_bias": statistics.fmean(x for x in model_w if x == x),
        "model_pass": _med(model_p),
        "other": _med(other),
        "mean": _med(mean),
        "d": d,
        "floor_pass": d / math.sqrt(2),
        "floor_whole": floor,
        "net": math.sqrt(max(m * m - floor * floor, 0.0)),
        "needed": math.ceil(d * d / (2 * (bar / 3) ** 2)),
        "far": sum(abs(x) > math.log(1.5) for x in lns),
    }


def halves_line(rows: Sequence[dict[str, Any]]) -> str:
    """Half-passes (the first or second half of a pass's pairs): within one pass against the
    same half of the other pass; iid pairs would make both √2 × the whole passes' d."""
    within = [_ln(*h) for r in rows for h in r["halves"]]
    between = [_ln(r["halves"][0][i], r["halves"][1][i]) for r in rows for i in (0, 1)]
    full = _med([_ln(*r["passes"]) for r in rows])
    return (
        f"median |ln ratio|: half-passes within a pass {_med(within):.1%}, the same half of "
        f"the two passes {_med(between):.1%}; whole passes {full:.1%} (iid pairs: "
        f"{full * math.sqrt(2):.1%} for half-passes)"
    )


def noise(sets: Sequence[Sequence[str]], variant: str, bar: float) -> None:
    rows = noise_rows(sets, variant)
    print(f"## passes and the model ({variant}) per level, overheads µs\n")
    print(
        "| set | topology | level | p90 passes (whole) | p90 model ÷ whole | "
        "p99 passes (whole) | p99 model ÷ whole |"
    )
    print("|---|---|---|---|---|---|---|")
    by: dict[tuple[str, str, float], dict[str, dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["set"], r["topology"], r["level"]), {})[r["key"]] = r
    for (name, topo, f), c in by.items():
        cells = []
        for k in KEYS:
            r = c[k]
            a, b = r["passes"]
            cells.append(f"{a:.0f} / {b:.0f} ({r['whole']:.0f}) | {r['model'] / r['whole']:.2f}")
        print(f"| {name} | {topo} | {f:.0%} | " + " | ".join(cells) + " |")
    cols = (
        "model vs whole (bias) | model vs a pass | other pass vs a pass | passes' mean vs a pass"
        " | passes' median abs ln ratio d | floor vs a pass (d/√2) | floor vs whole (d/2) | "
        f"model net of the floor | passes for floor ≤ {bar / 3:.1%} | passes ≥ 1.5× apart"
    )
    for k in KEYS:
        print(f"\n## {k}: median abs errors (noise floors from d, iid log-normal passes)\n")
        print(f"| group | levels | {cols} |")
        print("|---|---" + "|---" * 10 + "|")
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            if r["key"] != k:
                continue
            for g in (r["set"], r["topology"], "pooled"):
                groups.setdefault(g, []).append(r)
        order = {r["set"]: 0 for r in rows} | {r["topology"]: 1 for r in rows} | {"pooled": 2}
        for g, rs in sorted(groups.items(), key=lambda x: (order[x[0]], x[0])):
            s = summary(rs, bar)
            print(
                f"| {g} | {s['n']} | {s['model_whole']:.0%} ({s['model_bias']:+.0%}) | "
                f"{s['model_pass']:.0%} | {s['other']:.0%} | {s['mean']:.0%} | {s['d']:.0%} | "
                f"{s['floor_pass']:.0%} | {s['floor_whole']:.0%} | {s['net']:.0%} | "
                f"{s['needed']} | {s['far']} |"
            )
        of_k = [r for r in rows if r["key"] == k]
        print("\n" + halves_line(of_k))
        near = [abs(_ln(r["whole"], sum(r["passes"]) / 2)) for r in of_k]
        print(
            f"the whole level (pooled) against the passes' mean, |ln ratio|: median "
            f"{_med(near):.1%}, max {max(x for x in near if x == x):.0%}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("docs", nargs="*")
    ap.add_argument("--skip", type=float, action="append", default=[], help="a level left out")
    ap.add_argument("--set", nargs=3, action="append", default=[], metavar=("DB", "ONEHOP", "TOPO"))
    ap.add_argument("--variant", default="s13-ramp-shape", help="the model (tail_variants.py)")
    ap.add_argument("--bar", type=float, default=0.2, help="the bar's median abs error")
    a = ap.parse_args()
    if a.set:
        noise(a.set, a.variant, a.bar)
    if a.docs:
        agreement(a.docs, a.skip)
    if not a.set and not a.docs:
        ap.error("give documents or --set")


def agreement(docs: Sequence[str], skip: Sequence[float]) -> None:
    every: dict[str, list[float]] = {k: [] for k in PCTS}
    spread: dict[str, list[float]] = {k: [] for k in PCTS}
    for path in docs:
        doc = json.loads(Path(path).read_text())
        t = doc["tail"]
        print(f"## {t['topology']} ({path})")
        for d in t["points"]:
            if any(abs(float(d["fraction"]) - s) < 1e-6 for s in skip) or not d["runs"]:
                continue
            if not d.get("sustained", True):
                continue
            cells = []
            for k in PCTS:
                whole, per = pass_overheads(d, k)
                if not whole:
                    continue
                diffs = [abs(x - y) / abs(whole) for x, y in itertools.combinations(per, 2)]
                every[k] += diffs
                spread[k].append((max(per) - min(per)) / abs(whole))
                cells.append(
                    f"{k} {' / '.join(f'{x:.0f}' for x in per)} ({whole:.0f}; "
                    f"max−min {spread[k][-1]:.0%})"
                )
            print(f"  {float(d['fraction']):.0%}: " + "; ".join(cells))
    for k in PCTS:
        if every[k]:
            print(
                f"{k}: every pair of passes |difference| ÷ level, median {statistics.median(every[k]):.0%} "
                f"({len(every[k])} pairs); max−min of the passes, median "
                f"{statistics.median(spread[k]):.0%} ({len(spread[k])} levels)"
            )


if __name__ == "__main__":
    main()
