"""How well a tail validation's passes agree with each other (issue #20): per level and
percentile, each pass's overhead on its own (every request of the pass's runs pooled, as the
whole level is) and how far the passes are apart, ÷ the whole level's overhead; with three or
more passes, every pair of passes. Offline, on stored documents; measures nothing.

    .venv/bin/python experiments/tail_passes.py DOC.json [DOC.json ...] [--skip 0.6]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

from meshtax.validate.tail import TailRun, _pooled

PCTS = ("p50", "p90", "p99")


def pass_overheads(d: dict, key: str) -> tuple[float, list[float]]:  # type: ignore[type-arg]
    """The whole level's overhead at ``key`` and each pass's."""
    pairs = [(TailRun.from_dict(r["no_mesh"]), TailRun.from_dict(r["mesh"])) for r in d["runs"]]
    sizes = [int(x) for x in d.get("passes", ())] or [len(pairs)]
    q = float(key[1:]) / 100

    def ov(sel: list[tuple[TailRun, TailRun]]) -> float:
        return _pooled([m for _, m in sel], q) - _pooled([b for b, _ in sel], q)

    out, at = [], 0
    for n in sizes:
        out.append(ov(pairs[at : at + n]))
        at += n
    return ov(pairs), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("docs", nargs="+")
    ap.add_argument("--skip", type=float, action="append", default=[], help="a level left out")
    a = ap.parse_args()
    every: dict[str, list[float]] = {k: [] for k in PCTS}
    spread: dict[str, list[float]] = {k: [] for k in PCTS}
    for path in a.docs:
        doc = json.loads(Path(path).read_text())
        t = doc["tail"]
        print(f"## {t['topology']} ({path})")
        for d in t["points"]:
            if any(abs(float(d["fraction"]) - s) < 1e-6 for s in a.skip) or not d["runs"]:
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
