"""Which input of a topology's ramp price moves between sittings (issue #20, after set 12):
per recorded set, the profile's capacity ramp through the sidecar (absolute and ÷ its closed
loop), the topology's levels (rate, the no-mesh tail, the apps' CPU, how busy the pods were)
and each sidecar's measured CPU against its ramp price — read at its own rate from the ramp's
runs (the model since set 11) and from one power law of the rate's fraction of the closed
loop's (``TailOptions.ramp_shape``, fitted here on the sets' pooled ramp runs). Offline.

``.venv/bin/python experiments/tail_ramp_inputs.py --set DB ONEHOP_DIR TOPOLOGY_DIR [--set …]``
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
from _tail_sets import add_sets, set_profile
from tail_cpu_audit import _batch, per_sidecar

from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode
from meshtax.predict.load_factor import SHAPE_BELOW, ramp_sidecar_us
from meshtax.predict.stations import TailOptions
from meshtax.validate.tail import TailRun

STEM = "bookinfo-http-of-mesh"


def ramp(prof: Profile, mode: Mode) -> tuple[float, float, list[tuple[float, float]]]:
    """(closed loop rate/s, its sidecar CPU-µs a request, the fixed-rate runs (rate, µs))."""
    cap = prof.modes[mode].capacity
    assert cap is not None, "a profile without a capacity ramp"
    meshed = [p for p in cap.points if p.meshed and p.achieved > 0]
    top = max((p for p in meshed if p.target <= 0), key=lambda p: p.achieved)
    runs = sorted((p.achieved, p.sidecar_cpu / p.achieved * 1e6) for p in meshed if p.target > 0)
    return top.achieved, top.sidecar_cpu / top.achieved * 1e6, runs


def pooled_shape(
    ramps: list[tuple[float, float, list[tuple[float, float]]]],
) -> tuple[float, float]:
    """Least squares of ln(µs ÷ closed loop's) on ln(rate ÷ closed loop's) over every run at
    most ``SHAPE_BELOW`` of its closed loop's rate: (coefficient, exponent)."""
    x, y = [], []
    for rc, uc, runs in ramps:
        for r, u in runs:
            if r / rc <= SHAPE_BELOW:
                x.append(np.log(r / rc))
                y.append(np.log(u / uc))
    b, a = np.polyfit(x, y, 1)
    return float(np.exp(a)), float(b)


def levels(d: Path, prof: Profile, shape: tuple[float, float]) -> list[dict[str, Any]]:
    doc = json.loads((d / f"{STEM}.json").read_text())
    mode = Mode(doc["tail"]["mode"])
    mp = prof.modes[mode]
    out = []
    for pd in doc["tail"]["points"]:
        pairs = [
            (TailRun.from_dict(r["no_mesh"]), TailRun.from_dict(r["mesh"])) for r in pd["runs"]
        ]
        med = statistics.median
        rate = float(pd["rate"])
        bt = _batch(d, STEM, doc, float(pd["fraction"]), rate)
        app = med(b.cpu_us_per_request("app") for b, _ in pairs)
        model = per_sidecar(bt, prof, TailOptions(pod_cpus=1, app_cpu_us=app, load="pairs"))
        sidecars = {}
        for name, m in model.items():
            own = np.array([m["rate"]])
            runs, shaped = ramp_sidecar_us(mp, own), ramp_sidecar_us(mp, own, shape)
            assert runs is not None and shaped is not None
            sidecars[name] = {
                "rate": m["rate"],
                "measured": med(x.cpu_us_per_request(f"sidecar:{name}") for _, x in pairs),
                "runs": m["sides"] * float(runs[0]),
                "shape": m["sides"] * float(shaped[0]),
            }
        out.append(
            {
                "fraction": float(pd["fraction"]),
                "rate": rate,
                "max_no_mesh": float(doc["tail"]["max_no_mesh"]),
                "no_mesh_p90": med(b.percentiles_us["p90"] for b, _ in pairs),
                "no_mesh_p99": med(b.percentiles_us["p99"] for b, _ in pairs),
                "app_us": app,
                "sidecars_us": med(x.cpu_us_per_request("sidecar") for _, x in pairs),
                "sidecars": sidecars,
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sets(ap)
    ap.add_argument(
        "--shape",
        nargs=2,
        type=float,
        metavar=("COEF", "EXP"),
        help="price with this shape (s13-ramp-shape's frozen: 1.377 -0.355), not the pooled fit",
    )
    a = ap.parse_args()
    sets = []
    for db, onehop, topo in a.set:
        prof = set_profile(db, onehop)
        sets.append((Path(topo), prof, ramp(prof, Mode.HTTP)))
    fit = pooled_shape([r for _, _, r in sets])
    below = f"runs ≤ {SHAPE_BELOW:g} of the closed loop's rate"
    print(f"pooled ramp shape ({below}): {fit[0]:.3f} × f^{fit[1]:.3f}")
    shape = (a.shape[0], a.shape[1]) if a.shape else fit
    print(f"sidecars priced below with {shape[0]:.3f} × f^{shape[1]:.3f}\n")
    print(
        "| set | closed loop /s | µs a request | runs: rate/s (f) µs ×closed |\n|---|---|---|---|"
    )
    for d, _, (rc, uc, runs) in sets:
        cells = "; ".join(f"{r:.0f} ({r / rc:.3f}) {u:.0f} ×{u / uc:.2f}" for r, u in runs)
        print(f"| {d.parent.name} | {rc:.0f} | {uc:.1f} | {cells} |")
    print(
        "\n| set | load | rate/s | no-mesh max/s | no-mesh p90 / p99 µs | apps µs | sidecars µs "
        "| measured ÷ runs (median, range) | measured ÷ shape (median, range) |\n"
        + "|---" * 9
        + "|"
    )
    for d, prof, _ in sets:
        every_runs, every_shape, mid_runs, mid_shape = [], [], [], []
        for lv in levels(d, prof, shape):
            sc = lv["sidecars"].values()
            by_runs = [s["measured"] / s["runs"] for s in sc]
            by_shape = [s["measured"] / s["shape"] for s in sc]
            every_runs += by_runs
            every_shape += by_shape
            if 0.25 - 1e-9 <= lv["fraction"] <= 0.75 + 1e-9:  # set 13's registered reading
                mid_runs += by_runs
                mid_shape += by_shape
            print(
                f"| {d.parent.name} | {lv['fraction']:.0%} | {lv['rate']:.0f} | {lv['max_no_mesh']:.0f} | "
                f"{lv['no_mesh_p90']:.0f} / {lv['no_mesh_p99']:.0f} | {lv['app_us']:.0f} | "
                f"{lv['sidecars_us']:.0f} | {statistics.median(by_runs):.2f} ({min(by_runs):.2f}–"
                f"{max(by_runs):.2f}) | {statistics.median(by_shape):.2f} ({min(by_shape):.2f}–"
                f"{max(by_shape):.2f}) |"
            )
        print(
            f"| {d.parent.name} | all | | | | | | {statistics.median(every_runs):.2f} | "
            f"{statistics.median(every_shape):.2f} |\n"
            f"| {d.parent.name} | 25–75 % | | | | | | {statistics.median(mid_runs):.2f} | "
            f"{statistics.median(mid_shape):.2f} |"
        )


if __name__ == "__main__":
    main()
