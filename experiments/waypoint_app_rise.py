"""The apps' CPU around a waypoint (issue #18, eighth sitting): per validation case, the apps'
CPU change per request in waypoint mode minus node-l4 mode (summed over the apps, medians over
the pairs), per waypoint call (calls whose caller is an app, from the no-mesh traces), against
what a waypoint profile models for the apps per call: 4 × (user + kernel) of its echo's change
per crossing (``probe.chain_app_cpu_us``, http, smallest size), callee and caller. Measures
nothing.

``.venv/bin/python experiments/waypoint_app_rise.py OUT PROFILES.db WAYPOINT_PROFILE``

``OUT``: ``--out`` of ``benchmarks/bench_validate.py --architectures node-l4,waypoint
--keep-traces``. A profile measured before the change (338837d) has no ``chain_app_cpu_us``: it
is computed from its kept probe windows as the change does.
"""

from __future__ import annotations

import json
import sqlite3
import statistics as st
import sys
from pathlib import Path
from typing import Any

from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.traces import SpanOptions, load_traces


def chain_app(probe: dict[str, Any]) -> tuple[float, float]:
    """The echo's (user, kernel) change per crossing, recorded or from the kept windows."""
    ca = probe.get("chain_app_cpu_us")
    if ca is not None:
        return float(ca["user"]), float(ca["kernel"])
    ws = [w for w in probe["windows"] if w["kept"]]
    per: dict[bool, tuple[float, float]] = {}
    for meshed in (True, False):
        sel = [w for w in ws if w["meshed"] is meshed]
        n = sum(int(w["requests"]) for w in sel)

        def g(who: str, k: str, sel: list[dict[str, Any]] = sel, n: int = n) -> float:
            return float(sum(w.get(who, {}).get(k, 0) for w in sel)) / n / 1e3 / 2

        per[meshed] = (
            g("app", "user_ns") - g("path", "user_ns"),
            g("app", "sys_cpu_ns") - g("path", "sys_cpu_ns"),
        )
    return per[True][0] - per[False][0], per[True][1] - per[False][1]


def apps(case: dict[str, Any]) -> dict[str, float]:
    """Every app's CPU change per request (µs, median over the pairs); roles left out."""
    diffs: dict[str, list[float]] = {}
    for r in case["runs"]:
        n, m = r["no_mesh"], r["mesh"]
        for k in set(n["cpu_ns"]) | set(m["cpu_ns"]):
            if ":" in k:
                continue
            d = m["cpu_ns"].get(k, 0) / m["count"] - n["cpu_ns"].get(k, 0) / n["count"]
            diffs.setdefault(k, []).append(d / 1e3)
    return {k: st.median(v) for k, v in diffs.items()}


def main() -> None:
    out, db, name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    row = sqlite3.connect(db).execute("select document from profiles where name=?", (name,))
    doc = json.loads(row.fetchone()[0])
    http = doc["provenance"]["options"]["measurements"]["http"]
    model = {int(m["size"]): chain_app(m["probe"]) for m in http}
    size = min(model)
    per_call = 4 * sum(model[size])
    print(
        f"{name}: echo change per crossing (user, kernel) by size "
        + ", ".join(f"{k} B {u:+.1f} / {kk:+.1f}" for k, (u, kk) in sorted(model.items()))
        + f"; modelled apps per waypoint call {per_call:.1f} µs"
    )
    wp = json.loads((out / "waypoint" / "all.json").read_text())
    nl4 = {
        c["name"]: c
        for c in json.loads((out / "node-l4" / "all.json").read_text())["cases"]
        if not c.get("error")
    }
    ratios = []
    print(
        "| case | waypoint calls a request | apps' change, waypoint | node-l4 | per call | ÷ model |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for c in wp["cases"]:
        if c.get("error") or c["name"] not in nl4:
            continue
        t, q = c["name"].split("/")
        trace = out / "waypoint" / "traces" / f"{t}-{q}-{c['mode']}.json"
        opts = SpanOptions(
            rate=c["rate"],
            sidecars={s: SidecarConfig(Mode(x)) for s, x in c["sidecar_modes"].items()},
            default_sidecar=SidecarConfig(),
        )
        b = load_traces(trace, "otlp", opts).batch
        calls = float((b.caller >= 0).sum()) / b.n_graphs
        a_w, a_n = sum(apps(c).values()), sum(apps(nl4[c["name"]]).values())
        rise = (a_w - a_n) / calls
        ratios.append(rise / per_call)
        print(
            f"| {c['name']} | {calls:.1f} | {a_w:.0f} | {a_n:.0f} | {rise:.1f} | "
            f"{rise / per_call:.2f} |"
        )
    print(f"median measured ÷ model: {st.median(ratios):.2f}")


if __name__ == "__main__":
    main()
