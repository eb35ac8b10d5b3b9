"""Where a tail model's p90/p99 bias sits and what moves a topology's predicted saturation
(issue #20, after set 13): over recorded sets, each level's predicted ÷ measured overhead
per topology and percentile, the signed bias per set and per (topology, level) across the
sets; then per set the closed loop's inputs — the measured maxima with and without the mesh,
the apps' CPU and the sidecars' at the highest level, the sidecars' price at the closed loop
as the model's queue factor gives it and as the shape through the profile's closed loop does
(``TailOptions.closed_shape``), the level price there, and what the measured maximum implies.
Offline: nothing is measured.

``.venv/bin/python experiments/tail_bias_saturation.py --set DB ONEHOP_DIR TOPOLOGY_DIR [--set …]
[--variants s13-ramp-shape,s14-closed-shape]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
from pathlib import Path
from typing import Any

import tail_variants as tv
from _tail_sets import add_sets, set_profile
from tail_cpu_audit import _batch

from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode
from meshtax.predict.engine import single_profile
from meshtax.predict.load_factor import closed_loop_us, ramp_sidecar_us
from meshtax.predict.ramp_price import _models_us, _sides_us
from meshtax.predict.stations import TailOptions, request_rate

STEMS = {"one-hop": "onehop-http-of-mesh", "bookinfo/productpage": "bookinfo-http-of-mesh"}
SHAPE = (1.377, -0.355)


def level_errors(
    docs: list[tuple[Path, dict[str, Any]]], prof: Profile, variant: str
) -> dict[str, dict[float, dict[str, float]]]:
    """Per topology, per scored level: p90/p99 predicted ÷ measured and the saturation error,
    as ``tail_variants.py --calibrate 0.6`` scores them (the 60 % level left out)."""
    out: dict[str, dict[float, dict[str, float]]] = {}
    for path, doc in docs:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            errs = tv.errors(path, doc, prof, tv.VARIANTS[variant], False, 0.6)
        scored = [d for d in doc["tail"]["points"] if abs(float(d["fraction"]) - 0.6) > 1e-6]
        fr = [float(d["fraction"]) for d in scored if tv._point(d).pairs and tv._point(d).sustained]
        topo = doc["tail"]["topology"]
        rows: dict[float, dict[str, float]] = {}
        for k in ("p90", "p99"):
            # tail_variants scores the sustained levels in order; a level it could not score
            # (no measured overhead) would shift the rest, so the counts must agree
            assert len(fr) == len(errs[k]), f"{path}: {len(fr)} levels, {len(errs[k])} errors"
            for f, e in zip(fr, errs[k]):
                rows.setdefault(f, {})[k] = 1.0 + e
        rows[-1.0] = {"saturation": errs["saturation"][0]}
        out[topo] = rows
    return out


def closed_loop(d: Path, prof: Profile) -> dict[str, float]:
    """The closed loop's inputs of a topology's set (µs a request unless a rate)."""
    stem = STEMS["bookinfo/productpage"]
    doc = json.loads((d / f"{stem}.json").read_text())
    t = doc["tail"]
    pt = tv._point(t["points"][-1])
    med = statistics.median
    app = med(b.cpu_us_per_request("app") for b, _ in pt.pairs)
    app_mesh = med(m.cpu_us_per_request("app") for _, m in pt.pairs)
    side = med(m.cpu_us_per_request("sidecar") for _, m in pt.pairs)
    b = _batch(d, stem, doc, pt.fraction, pt.rate)
    pl = single_profile(prof)
    opts = TailOptions(pod_cpus=1, app_cpu_us=app, clients=32, load="pairs")
    per = request_rate(b, "pairs")
    mp = prof.modes[Mode.HTTP]
    queue = _models_us(b, pl, opts, queued=True) / per
    shape_cl = _sides_us(b, pl, opts, lambda m, r: closed_loop_us(m, r, SHAPE[1]))[0] / per
    level = _sides_us(b, pl, opts, lambda m, r: ramp_sidecar_us(m, r, SHAPE))[0] / per
    assert mp is not None
    M, N = float(t["max_mesh"]), float(t["max_no_mesh"])
    return {
        "rate": pt.rate,
        "M": M,
        "N": N,
        "app": app,
        "app_change": app_mesh - app,
        "sidecars": side,
        "queue": queue,
        "closed_shape": shape_cl,
        "level": level,
        "implied": 1e6 / M - app,
    }


def set_docs(onehop: str, topo: str) -> list[tuple[Path, dict[str, Any]]]:
    """A set's two scored documents (one hop's and Bookinfo's), with their paths."""
    paths = (
        Path(onehop) / f"{STEMS['one-hop']}.json",
        Path(topo) / f"{STEMS['bookinfo/productpage']}.json",
    )
    return [(p, json.loads(p.read_text())) for p in paths]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sets(ap)
    ap.add_argument("--variants", default="s13-ramp-shape,s14-closed-shape")
    a = ap.parse_args()
    sets = []
    for db, onehop, topo in a.set:
        prof = set_profile(db, onehop)
        docs = set_docs(onehop, topo)
        sets.append((Path(topo).parent.name, prof, docs, Path(topo)))
    for variant in a.variants.split(","):
        print(f"\n## {variant}: predicted ÷ measured p90 / p99 per level (60 % not scored)\n")
        print("| set | topology | 25 % | 50 % | 75 % | 90 % | p90 / p99 bias | saturation |")
        print("|---|---|---|---|---|---|---|---|")
        across: dict[tuple[str, float, str], list[float]] = {}
        pooled: dict[str, list[float]] = {"p90": [], "p99": []}
        for name, prof, docs, _ in sets:
            got = level_errors(docs, prof, variant)
            for topo, rows in got.items():
                cells: list[str] = []
                per: dict[str, list[float]] = {"p90": [], "p99": []}
                for f in sorted(x for x in rows if x > 0):
                    r = rows[f]
                    cells.append(f"{r['p90']:.2f} / {r['p99']:.2f}")
                    for k in ("p90", "p99"):
                        per[k].append(r[k] - 1)
                        pooled[k].append(r[k] - 1)
                        across.setdefault((topo, f, k), []).append(r[k] - 1)
                bias = " / ".join(f"{statistics.fmean(per[k]):+.0%}" for k in ("p90", "p99"))
                sat = rows[-1.0]["saturation"]
                print(f"| {name} | {topo} | " + " | ".join(cells) + f" | {bias} | {sat:+.1%} |")
        print(
            "\npooled over every set and level: p90 median abs "
            f"{statistics.median(abs(x) for x in pooled['p90']):.0%} "
            f"(bias {statistics.fmean(pooled['p90']):+.0%}), p99 "
            f"{statistics.median(abs(x) for x in pooled['p99']):.0%} "
            f"(bias {statistics.fmean(pooled['p99']):+.0%})"
        )
        print("\n| topology | level | p90 mean signed (range) | p99 mean signed (range) |")
        print("|---|---|---|---|")
        for topo, f in sorted({(t, f) for t, f, _ in across}):
            c = []
            for k in ("p90", "p99"):
                v = across[(topo, f, k)]
                c.append(f"{statistics.fmean(v):+.0%} ({min(v):+.0%} … {max(v):+.0%})")
            print(f"| {topo} | {f:.0%} | {c[0]} | {c[1]} |")
    print("\n## Bookinfo's closed loop, per set (µs a request; the highest level's no-mesh apps)\n")
    print(
        "| set | measured max / no-mesh max (ratio) | apps at 90 % (change with the mesh) | "
        "sidecars measured at 90 % | implied at the max | queue-factor price | "
        "closed-shape price | level price at 90 % | measured ÷ level price |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, prof, _, topo in sets:
        cl = closed_loop(topo, prof)
        print(
            f"| {name} | {cl['M']:.0f} / {cl['N']:.0f} ({cl['M'] / cl['N']:.3f}) | "
            f"{cl['app']:.0f} ({cl['app_change']:+.0f}) | {cl['sidecars']:.0f} | "
            f"{cl['implied']:.0f} | {cl['queue']:.0f} | {cl['closed_shape']:.0f} | "
            f"{cl['level']:.0f} | {cl['sidecars'] / cl['level']:.2f} |"
        )


if __name__ == "__main__":
    main()
