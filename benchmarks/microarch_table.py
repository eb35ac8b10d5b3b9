"""BENCHMARKS.md's tables of issue #19 from the JSON of ``benchmarks/bench_microarch.py`` (or
``experiments/microarch_agreement.py``): per item both runs' counts per request and their
difference against the bounds, the items beyond them, additivity on instructions and the
IP-tag / RBAC ratios of each run. Nothing is measured.

    .venv/bin/python benchmarks/microarch_table.py artifacts/i19/s3/tcp.json \\
        artifacts/i19/s3/http.json artifacts/i19/s3/grpc.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BOUND = {"instructions": 0.02}  # every miss count: 0.05
METRICS = ("instructions", "i1_misses", "d1_misses", "branch_misses")


def _pct(x: float | None, d: int = 2) -> str:
    return "—" if x is None else f"{100 * x:+.{d}f} %"


def _n(x: float) -> str:
    return f"{x:,.0f}".replace(",", " ") if abs(x) >= 100 else f"{x:.2f}"


def _agreement(doc: dict[str, Any]) -> dict[str, Any]:
    ag = doc["agreement"]
    got: dict[str, Any] = ag[0] if isinstance(ag, list) else ag
    return got


def items(doc: dict[str, Any]) -> list[dict[str, Any]]:
    mode = doc.get("mode")
    return [{"mode": mode, **x} for x in _agreement(doc)["items"]]


def agreement_rows(docs: Sequence[dict[str, Any]]) -> tuple[list[str], int, int, list[str]]:
    """Markdown rows (one per mode and variant), items compared, beyond, and the beyond ones."""
    out = []
    compared = beyond = 0
    bad = []
    for doc in docs:
        by: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        for x in items(doc):
            by.setdefault((x["mode"], x["variant"]), {})[x["metric"]] = x
            if x["rel"] is not None:
                compared += 1
                if not x["ok"]:
                    beyond += 1
                    bad.append(f"{x['mode']} {x['variant']} {x['metric']} {_pct(x['rel'])}")
        for (mode, variant), ms in by.items():
            i, d1 = ms.get("instructions"), ms.get("d1_misses")
            cells = [mode, variant]
            cells.append("—" if i is None else f"{_n(i['a'])}, {_n(i['b'])}")
            cells.append(_pct(None if i is None else i["rel"]))
            cells.append(_pct(ms["i1_misses"]["rel"]) if "i1_misses" in ms else "—")
            cells.append("—" if d1 is None else f"{_n(d1['a'])}, {_n(d1['b'])}")
            cells.append(_pct(None if d1 is None else d1["rel"]))
            sp = None if d1 is None else d1.get("spread")
            cells.append("—" if sp is None else f"±{100 * sp:.1f} %")
            cells.append(_pct(ms["branch_misses"]["rel"]) if "branch_misses" in ms else "—")
            flag = [m for m, x in ms.items() if not x["ok"]]
            cells.append("**" + ", ".join(flag) + "**" if flag else "")
            out.append("| " + " | ".join(cells) + " |")
    return out, compared, beyond, bad


LABEL = {
    "instructions": "instructions",
    "i1_misses": "I1",
    "d1_misses": "D1",
    "ll_misses": "LL",
    "branch_misses": "branch",
}


def _windows(rounds: list[list[int]]) -> str:
    return " → ".join(f"{n1}/{n2}" for n1, n2 in rounds) if rounds else "—"


def recount_rows(docs: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown rows for the rows counted in more than one round in either run (their
    pairs left a compared count unresolved): each round's windows per run, and every
    metric of the row that may be compared (≥ 0.5 a request, in the last round or the first)
    with both runs' counts (the first round's too, where the JSON has them), their
    difference, the pairs' spread and whether it stayed unresolved."""
    out = []
    for doc in docs:
        by: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for x in items(doc):
            by.setdefault((x["mode"], x["variant"]), []).append(x)
        for (mode, variant), xs in by.items():
            rounds = xs[0].get("rounds") or [[], []]
            unres = [x for x in xs if any(x.get("unresolved") or ())]
            if max(len(r) for r in rounds) <= 1 and not unres:
                continue
            ms = []
            for x in xs:
                first = [f for f in x.get("first") or () if f is not None]
                if max(x["a"], x["b"], *first) < 0.5 and not any(x.get("unresolved") or ()):
                    continue
                left = [f"run {i + 1}" for i, u in enumerate(x.get("unresolved") or ()) if u]
                sp = x.get("spread")
                was = x.get("first") or [None, None]
                before = (
                    ""
                    if all(f is None for f in was)
                    else "first round "
                    + ", ".join("—" if f is None else _n(f) for f in was)
                    + " → "
                )
                ms.append(
                    f"{LABEL.get(x['metric'], x['metric'])} {before}{_n(x['a'])}, {_n(x['b'])} "
                    f"({_pct(x['rel'], 1)}"
                    + ("" if sp is None else f", pairs ±{100 * sp:.1f} %")
                    + (f", unresolved in {' and '.join(left)}" if left else "")
                    + ")"
                )
            out.append(
                f"| {mode} | {variant} | {_windows(rounds[0])} | {_windows(rounds[1])} | "
                + "; ".join(ms)
                + " |"
            )
    return out


def findings(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Each run's additivity and ratios, whichever script wrote ``doc``."""
    if "findings" in doc:
        return list(doc["findings"].values())
    runs = []
    for add, rat in zip(doc["additivity"], doc["ratios"]):
        runs.append(
            {
                "additivity": [
                    {"mode": doc["mode"], "chain": c, "error": e, "increment_error": ie}
                    for c, e, ie in add
                ],
                "ratios": [
                    {"published": p, "here": h, "published_ratio": pub} for p, h, pub in rat
                ],
            }
        )
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", type=Path)
    a = ap.parse_args(argv)
    docs = [json.loads(p.read_text()) for p in a.json]
    rows, compared, beyond, bad = agreement_rows(docs)
    print(
        "| mode | variant | instructions / request (run 1, run 2) | Δ | I1 misses Δ | "
        "D1 misses / request | D1 Δ | D1 pairs | branch mispredictions Δ | beyond |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    print("\n".join(rows))
    print(f"\n{compared} items compared, {beyond} beyond their bound" + (": " if bad else ""))
    for b in bad:
        print(f"- {b}")
    worst: dict[str, float] = {}
    for doc in docs:
        for x in items(doc):
            if x["rel"] is not None:
                k = f"{x['mode']} {x['metric']}"
                worst[k] = max(worst.get(k, 0.0), abs(x["rel"]))
    print("\nworst |Δ|: " + ", ".join(f"{k} {100 * v:.2f} %" for k, v in worst.items()))
    again = recount_rows(docs)
    if again:
        print(
            "\nRows counted again (windows n1/n2 of each round; counts per request, run 1, run 2):"
            "\n\n| mode | variant | run 1 rounds | run 2 rounds | counts |\n|---|---|---|---|---|"
        )
        print("\n".join(again))
    print("\n| mode | chain | error on total (run 1, run 2) | error on increment (run 1, run 2) |")
    print("|---|---|---:|---:|")
    for doc in docs:
        runs = findings(doc)
        if len(runs) < 2:
            continue
        for x, y in zip(runs[0]["additivity"], runs[1]["additivity"]):
            print(
                f"| {x['mode']} | {x['chain']} | {_pct(x['error'])}, {_pct(y['error'])} | "
                f"{_pct(x['increment_error'], 1)}, {_pct(y['increment_error'], 1)} |"
            )
    print("\n| published | variant | here (run 1, run 2) | published | here / published |")
    print("|---|---|---:|---:|---:|")
    for doc in docs:
        runs = findings(doc)
        if len(runs) < 2 or not runs[0]["ratios"]:
            continue
        for x, y in zip(runs[0]["ratios"], runs[1]["ratios"]):
            pub = x["published_ratio"]
            print(
                f"| {x['published']} | {x.get('variant', '')} | {x['here']:.3f}, {y['here']:.3f} "
                f"| {pub:.3f} | "
                f"{x['here'] / pub:.2f}, {y['here'] / pub:.2f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
