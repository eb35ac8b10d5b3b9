"""A kept waypoint validation scored with each waypoint priced at the rate it carries itself
(the code) and at the shared-CPU rate in its bed's units (``before``: the pricing until the
tenth sitting of issue #18). Measures nothing.

``.venv/bin/python experiments/waypoint_rate.py --db PROFILES.db --profile NAME
--doc OUT/waypoint/all.json``

``--doc``: ``all.json`` of ``benchmarks/bench_validate.py --architectures waypoint
--keep-traces`` (the no-mesh traces in ``traces`` next to it); the role profiles are the
database's newest, the placement and pod CPUs the validation's. Prints, per case, measured and
predicted p50 latency and CPU overhead under both pricings with their errors, the median
absolute errors, per case the waypoint processes' measured CPU-µs a request (and a call)
against what each pricing puts on the waypoint crossings, and the node proxies' CPU a
crossing, measured and priced, with the apps' CPU change, and the node-l4 profile's
inter-node ``tls`` component at 100 B (a node-l4 validation's ``all.json``
works too: no waypoint, both pricings the same).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

import meshtax.predict.architecture as arch_mod
from meshtax.model.sidecar import Architecture, Mode
from meshtax.predict.engine import hop_costs
from meshtax.predict.shared_cpu import shared_cpu_rates
from meshtax.store.sqlite import ProfileStore
from meshtax.validate.run import kept_cases

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _kept import error_line, kept_validation, kept_validation_parser  # noqa: E402

_COSTS = arch_mod.architecture_costs
#: proxies on the pods' CPU a request in the waypoint profile's bed (node proxy, waypoint,
#: node proxy): the old pricing took the shared-CPU rate ÷ 3 as that bed's request rate
_BED = 3.0
_seen: dict[str, float] = {}
_calls: dict[str, float] = {}  # waypoint calls a request, by callee


def _waypoint_cpu(arranged: Any, costs: Any) -> None:
    """Into ``_seen``: CPU-µs a request (mean over graphs) of the waypoint crossings in
    ``costs``, and the median price of one call through an http-mode waypoint."""
    w = arranged.waypoint
    per_call = costs.cpu_caller.sum(1) + costs.cpu_callee.sum(1)
    per_graph = np.bincount(w.graph_of(), weights=per_call * w.rate, minlength=w.n_graphs)
    _seen["waypoint"] = float(per_graph.mean() / w.rate.max())
    http = [k >= 0 and w.specs[k].config.mode is Mode.HTTP for k in w.callee_spec.tolist()]
    _seen["call"] = float(np.median(per_call[np.asarray(http, dtype=bool)])) if any(http) else 0.0
    calls: dict[str, float] = {}
    for k, callee in zip(w.callee_spec.tolist(), w.callee.tolist(), strict=True):
        if k >= 0:
            name = str(w.services[callee])
            calls[name] = calls.get(name, 0.0) + 1.0 / w.n_graphs
    _calls.clear()
    _calls.update(calls)


def _node_cpu(arranged: Any, costs: Any) -> None:
    """Into ``_seen``: the node proxies' crossings a request and their price a request."""
    b = arranged.batch
    g = b.graph_of()
    sides = (b.caller_spec >= 0).astype(np.float64) + (b.callee_spec >= 0)
    crossings = np.bincount(g, weights=2.0 * sides * b.rate, minlength=b.n_graphs)
    cpu = (costs.cpu_caller.sum(1) + costs.cpu_callee.sum(1)) * b.rate
    per_graph = np.bincount(g, weights=cpu, minlength=b.n_graphs)
    _seen["node crossings"] = float(crossings.mean() / b.rate.max())
    _seen["node"] = float(per_graph.mean() / b.rate.max())


def _costs(before: bool) -> Any:
    def costs(arranged: Any, profiles: Any, *, speed: Any = None, pod_cpus: Any = None) -> Any:
        rates = None
        if pod_cpus is not None:
            rates = shared_cpu_rates(arranged.batch, pod_cpus, also=arranged.waypoint)
        main = hop_costs(arranged.batch, profiles, rates=rates, speed=speed)
        _node_cpu(arranged, main)
        if arranged.waypoint is None:
            _seen["waypoint"] = _seen["call"] = 0.0
            _calls.clear()
            return main
        if before:
            way_rates = None if rates is None else rates / _BED
        else:
            way_rates = arch_mod.waypoint_rates(arranged)
        way = hop_costs(arranged.waypoint, profiles, rates=way_rates, speed=speed)
        _waypoint_cpu(arranged, way)
        return arch_mod._add(main, way)

    return costs


def main() -> None:
    ap = kept_validation_parser(__doc__, many=False)
    a = ap.parse_args()
    store = ProfileStore(a.db)
    prof = store.get(a.profile)
    doc, arch, roles = kept_validation(store, a.doc, (Architecture.NODE_L4, Architecture.WAYPOINT))
    per_call: list[tuple[str, float, float, float]] = []
    node_rows: list[tuple[str, float, float, float, float]] = []
    errs: dict[str, list[float]] = {
        k: [] for k in ("p50 before", "p50 now", "cpu before", "cpu now")
    }
    print(
        "| case | p50 µs measured | before | now | CPU µs/request measured | before | now "
        "| waypoints measured | priced before | now |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kc in kept_cases(a.doc, doc):
        c, p50, cpu = kc.record, kc.p50_us, kc.cpu_us
        way = sum(
            v for k, v in c["cpu_by_service_us_per_request"].items() if k.startswith("waypoint:")
        )
        cells: dict[str, tuple[float, float, float, float]] = {}
        for name, before in (("before", True), ("now", False)):
            arch_mod.architecture_costs = _costs(before)
            p = kc.predict(prof, pod_cpus=a.pod_cpus, architecture=arch, roles=roles)
            cells[name] = (p.p50_us, p.cpu_us_per_request, _seen["waypoint"], _seen["call"])
            errs[f"p50 {name}"].append(p.p50_us / p50 - 1)
            errs[f"cpu {name}"].append(p.cpu_us_per_request / cpu - 1)
        arch_mod.architecture_costs = _COSTS
        b, n = cells["before"], cells["now"]
        by = c["cpu_by_service_us_per_request"]
        one = [
            by[f"waypoint:{svc}"] / k
            for svc, k in _calls.items()
            if c["sidecar_modes"].get(svc) == "http" and f"waypoint:{svc}" in by
        ]
        per_call.append((c["name"], float(np.median(one)) if one else 0.0, b[3], n[3]))
        nodes_m = sum(v for k, v in by.items() if k.startswith("node:"))
        apps = sum(v for k, v in by.items() if ":" not in k)
        n_x = _seen["node crossings"]
        node_rows.append((c["name"], n_x, nodes_m / n_x, _seen["node"] / n_x, apps))
        print(
            f"| {c['name']} | {p50:.0f} | {b[0]:.0f} ({b[0] / p50 - 1:+.0%}) | "
            f"{n[0]:.0f} ({n[0] / p50 - 1:+.0%}) | {cpu:.0f} | {b[1]:.0f} ({b[1] / cpu - 1:+.0%}) | "
            f"{n[1]:.0f} ({n[1] / cpu - 1:+.0%}) | {way:.0f} | {b[2]:.0f} | {n[2]:.0f} |"
        )
    print()
    print(
        "| case | one call through an http waypoint, CPU-µs: measured (median) | priced before | now |"
    )
    print("|---|---:|---:|---:|")
    for name, m, b1, n1 in per_call:
        print(f"| {name} | {m:.0f} | {b1:.0f} | {n1:.0f} |")
    print()
    print(
        "| case | node-proxy crossings a request | node proxies CPU-µs a crossing: measured "
        "| priced (models with their bed's app change) | apps' CPU change, CPU-µs a request |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, n_cross, m, pr, apps in node_rows:
        print(f"| {name} | {n_cross:.0f} | {m:.1f} | {pr:.1f} | {apps:+.0f} |")
    node = roles.get(Architecture.NODE_L4)
    tls = (
        [m.cpu for c, m in node.mode(Mode.TCP).components.items() if c.key == "tls"] if node else []
    )
    if node is not None and tls:  # what every inter-node (and waypoint) leg of a node proxy adds
        at = ", ".join(f"{float(tls[0].predict(100.0, r)):.1f} at {r}/s" for r in (100, 300, 1000))
        print(f"{node.name} inter-node tls, CPU-µs a crossing at 100 B: {at}")
    print()
    for k, v in errs.items():
        print(error_line(k, v))


if __name__ == "__main__":
    main()
