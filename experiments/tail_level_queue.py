"""Whether a topology's measured levels queue, against how busy their CPU was (issue #20,
after set 14): per kept validation document and level, the rate asked and achieved, the pods'
CPU busy without and with the mesh, the apps' + sidecars' CPU a request, the no-mesh and mesh
latency percentiles and the mesh's p90 − p50 (its queue: a request's latency beyond the body).
With ``--combine``, the all-levels errors of ``tail_variants.py --levels`` outputs on a
topology's document joined with one hop's per-level ratios from ``tail_bias_saturation.py``'s
table (per set and variant, and pooled). Offline: nothing is measured.

``.venv/bin/python experiments/tail_level_queue.py DOC.json [DOC.json …]``
``.venv/bin/python experiments/tail_level_queue.py --combine SCORES.txt BIAS.md``
(SCORES: ``== set N`` headers before each set's ``tail_variants.py`` output)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_LEVEL = re.compile(
    r"^\s+(\d+)% (\d+)/s ρ ([\d.]+): p50 (\S+) vs (\S+), p90 (\S+) vs (\S+), p99 (\S+) vs (\S+)",
    re.M,
)


def _med(pt: Mapping[str, Any], side: str, f: Any) -> float:
    return float(statistics.median(f(r[side]) for r in pt["runs"]))


def levels(doc: Mapping[str, Any]) -> None:
    t = doc["tail"]
    print(
        f"{t['topology']}: maximum with the mesh {t['max_mesh']:.0f}/s, without {t['max_no_mesh']:.0f}/s"
    )
    print(
        "| level | rate | achieved | busy no mesh / mesh | CPU-µs a request no mesh / mesh |"
        " no mesh p50/p90/p99 | mesh p50/p90/p99 | mesh p90 − p50 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for pt in t["points"]:

        def busy(side: str, pt: Mapping[str, Any] = pt) -> float:
            return _med(pt, side, lambda r: r["cpu_ns"]["pods_busy"] / r["cpu_ns"]["pods_total"])

        def cpu(side: str, pt: Mapping[str, Any] = pt) -> float:
            return _med(
                pt,
                side,
                lambda r: (r["cpu_ns"]["app"] + r["cpu_ns"].get("sidecar", 0)) * 1e-3 / r["count"],
            )

        def q(side: str, pt: Mapping[str, Any] = pt) -> list[float]:
            keys = ("p50", "p90", "p99")
            return [_med(pt, side, lambda r, k=k: r["percentiles_us"][k]) for k in keys]

        nm, m = q("no_mesh"), q("mesh")
        print(
            f"| {pt['fraction']:.0%} | {pt['rate']:.0f} | {_med(pt, 'mesh', lambda r: r['achieved_qps']):.0f}"
            f" | {busy('no_mesh'):.2f} / {busy('mesh'):.2f} | {cpu('no_mesh'):.0f} / {cpu('mesh'):.0f}"
            f" | {' / '.join(f'{x:.0f}' for x in nm)} | {' / '.join(f'{x:.0f}' for x in m)}"
            f" | {m[1] - m[0]:.0f} |"
        )


def _onehop_ratios(bias_md: str) -> dict[int, tuple[list[float], list[float]]]:
    """Per set number, one hop's p90 and p99 predicted ÷ measured at 25/50/75/90 % from the
    first table of ``tail_bias_saturation.py``'s output (the current model's)."""
    out: dict[int, tuple[list[float], list[float]]] = {}
    for line in bias_md.split("\n## ")[1].splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) >= 6 and cells[1] == "one-hop" and cells[0].startswith("tail20-s"):
            pairs = [c.split(" / ") for c in cells[2:6]]
            out[int(cells[0].removeprefix("tail20-s"))] = (
                [float(a) for a, _ in pairs],
                [float(b) for _, b in pairs],
            )
    return out


def _cell(e: list[float]) -> str:
    return f"{statistics.median(abs(x) for x in e):.0%} ({statistics.fmean(e):+.0%})"


def combine(scores: str, bias_md: str) -> None:
    one = _onehop_ratios(bias_md)
    parts = re.split(r"^== set (\d+)\n", scores, flags=re.M)[1:]
    pool: dict[str, list[list[float]]] = {}
    for i in range(0, len(parts), 2):
        s, body = int(parts[i]), parts[i + 1]
        chunks = re.split(r"^\| (\S+) \| [^|]+ \|.*$", body, flags=re.M)
        for j in range(0, len(chunks) - 1, 2):
            lv, name = _LEVEL.findall(chunks[j]), chunks[j + 1]
            if not lv:
                continue
            t90 = [float(x[5]) / float(x[6]) - 1 for x in lv]
            t99 = [float(x[7]) / float(x[8]) - 1 for x in lv]
            a90 = [r - 1 for r in one[s][0]] + t90
            a99 = [r - 1 for r in one[s][1]] + t99
            ratios = " / ".join(f"{x + 1:.2f}" for x in t90)
            print(
                f"set {s} {name}: all p90 {_cell(a90)} p99 {_cell(a99)}; topology p90 "
                f"{_cell(t90)} p99 {_cell(t99)}; topology p90 ÷ measured {ratios}"
            )
            acc = pool.setdefault(name, [[], [], [], []])
            for k, e in enumerate((a90, a99, t90, t99)):
                acc[k] += e
    for name, (a90, a99, t90, t99) in pool.items():
        print(
            f"pooled {name}: all p90 {_cell(a90)} p99 {_cell(a99)}; topology p90 {_cell(t90)}"
            f" p99 {_cell(t99)}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("docs", nargs="*")
    ap.add_argument("--combine", nargs=2, metavar=("SCORES", "BIAS"))
    a = ap.parse_args()
    if a.combine:
        combine(Path(a.combine[0]).read_text(), Path(a.combine[1]).read_text())
    for p in a.docs:
        levels(json.loads(Path(p).read_text()))


if __name__ == "__main__":
    main()
