"""Kept node-l4 and waypoint validations scored with the node proxies' inter-node ``tls`` term
floored at 0 (``now``: pre-registered in the eleventh sitting of issue #18, failed, not applied by the
engine — this script applies it itself) and as the node-l4 profile measured it (``before``). Measures nothing.

``.venv/bin/python experiments/inter_node_floor.py --db PROFILES.db --profile NAME
--doc OUT/node-l4/all.json [OUT/waypoint/all.json]``

``--doc``: ``all.json`` of ``benchmarks/bench_validate.py --architectures node-l4|waypoint
--keep-traces`` (the no-mesh traces in ``traces`` next to it); the role profiles are the
database's newest, the placement and pod CPUs the validation's. Prints per architecture and
case: measured and predicted p50 latency and CPU overhead under both, with errors; the node
proxies' crossings a request, those with the ``tls`` term (inter-node and waypoint legs), the
shared-CPU rate they are priced at, their price a crossing without ``tls`` and the ``tls``
price a crossing before and now, against the node proxies' measured CPU a crossing and the
apps' change (the entry service's apart); the median absolute errors; and the node-l4 profile's
``tls`` at 100 B, as measured and with the warmth its inter-node path has over the intra-node
one added back (``+ c(r) − c(2r)`` of its tcp mode's rate term: a reading, not priced).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

import meshtax.predict.architecture as arch_mod
from meshtax.model.components import TLS
from meshtax.model.sidecar import Architecture, Mode
from meshtax.store.sqlite import ProfileStore
from meshtax.validate.run import kept_cases

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _kept import error_line, kept_validation, kept_validation_parser  # noqa: E402

_FLOOR = arch_mod.inter_node_floor
_HOP = arch_mod.hop_costs  # type: ignore[attr-defined]
_RATES = arch_mod.shared_cpu_rates  # type: ignore[attr-defined]
_seen: dict[str, float] = {}


def _hop(floor: bool) -> Any:
    """``hop_costs`` followed by :func:`_record` (the floor is not applied by the engine since
    the eleventh sitting: the experiment applies it itself, after the graph's hops are priced)."""
    rec, calls = _record(floor), [0]

    def wrapped(batch: Any, *a: Any, **k: Any) -> Any:
        calls[0] += 1  # the first call prices the graph's hops; a second, its waypoint legs
        costs = _HOP(batch, *a, **k)
        return rec(batch, costs) if calls[0] == 1 else costs

    return wrapped


def _record(floor: bool) -> Any:
    """An ``inter_node_floor`` that records the node proxies' prices a request into ``_seen``
    (mean over graphs, at the graph's request rate), then floors (``floor``) or not."""

    def wrapped(batch: Any, costs: Any) -> Any:
        out = _FLOOR(batch, costs) if floor else costs
        g, rate = batch.graph_of(), batch.rate
        top = float(rate.max())

        def per_request(x: Any) -> float:
            return float(np.bincount(g, weights=x * rate, minlength=batch.n_graphs).mean() / top)

        node = [
            j >= 0 and batch.specs[j].config.architecture is Architecture.NODE_L4
            for j in range(len(batch.specs))
        ]
        sides = np.zeros(batch.n_invocations)
        tls_sides = np.zeros(batch.n_invocations)
        k = costs.components.index(TLS) if TLS in costs.components else None
        for col, spec in (("caller", batch.caller_spec), ("callee", batch.callee_spec)):
            on = np.asarray([j >= 0 and node[j] for j in spec.tolist()], dtype=bool)
            sides += 2.0 * on
            if k is not None:
                tls_sides += 2.0 * (on & (getattr(costs, f"cpu_{col}")[:, k] != 0))
        total = out.cpu_caller.sum(1) + out.cpu_callee.sum(1)
        tls_now = out.cpu_caller[:, k] + out.cpu_callee[:, k] if k is not None else 0 * total
        tls_was = costs.cpu_caller[:, k] + costs.cpu_callee[:, k] if k is not None else 0 * total
        _seen["crossings"] = per_request(sides)
        _seen["tls crossings"] = per_request(tls_sides)
        _seen["price"] = per_request(total - tls_now)
        _seen["tls"] = per_request(tls_now)
        _seen["tls before"] = per_request(tls_was)
        return out

    return wrapped


def _rates(batch: Any, pod_cpus: int, *, also: Any = None) -> Any:
    """``shared_cpu_rates`` that records the rate the node proxies are priced at."""
    rates = _RATES(batch, pod_cpus, also=also)
    _seen["rate"] = float(np.median(rates))
    return rates


def _tls_reading(node: Any) -> str:
    """The node-l4 profile's ``tls`` at 100 B, and with its tcp mode's c(r) − c(2r) added."""
    tcp = node.mode(Mode.TCP)
    tls = next((m.cpu for c, m in tcp.components.items() if c == TLS), None)
    if tls is None:
        return f"{node.name}: no tls component"
    rest = [m.cpu for c, m in tcp.components.items() if c != TLS]

    def c(r: float) -> float:
        return sum(float(m.predict(100.0, r)) for m in rest)

    parts = [
        f"{r}/s {float(tls.predict(100.0, r)):+.1f} ({float(tls.predict(100.0, r)) + c(r) - c(2 * r):+.1f})"
        for r in (100, 200, 300, 500, 1000)
    ]
    return f"{node.name} tls CPU-µs a crossing at 100 B (with c(r) − c(2r)): " + ", ".join(parts)


def main() -> None:
    ap = kept_validation_parser(__doc__)
    a = ap.parse_args()
    store = ProfileStore(a.db)
    prof = store.get(a.profile)
    summary: list[str] = []
    node_prof = None
    print(
        "| architecture | case | p50 µs measured | before | now | CPU µs/request measured "
        "| before | now | node-proxy crossings a request | with tls | shared-CPU rate /s "
        "| price a crossing without tls | tls a tls crossing: before | now "
        "| node proxies measured a crossing | apps' change a request (entry) |"
    )
    print("|---|---|" + "---:|" * 14)
    for path in a.doc:
        doc, arch, roles = kept_validation(
            store, path, (Architecture.NODE_L4, Architecture.WAYPOINT)
        )
        node_prof = roles.get(Architecture.NODE_L4, node_prof)
        errs: dict[str, list[float]] = {
            k: [] for k in ("p50 before", "p50 now", "cpu before", "cpu now")
        }
        for kc in kept_cases(path, doc):
            c, p50, cpu = kc.record, kc.p50_us, kc.cpu_us
            cells: dict[str, tuple[float, float]] = {}
            for name, floor in (("before", False), ("now", True)):
                _seen.clear()
                arch_mod.hop_costs = _hop(floor)  # type: ignore[attr-defined]
                arch_mod.shared_cpu_rates = _rates  # type: ignore[attr-defined]
                try:
                    p = kc.predict(prof, pod_cpus=a.pod_cpus, architecture=arch, roles=roles)
                finally:
                    arch_mod.hop_costs = _HOP  # type: ignore[attr-defined]
                    arch_mod.shared_cpu_rates = _RATES  # type: ignore[attr-defined]
                cells[name] = (p.p50_us, p.cpu_us_per_request)
                errs[f"p50 {name}"].append(p.p50_us / p50 - 1)
                errs[f"cpu {name}"].append(p.cpu_us_per_request / cpu - 1)
            b, n = cells["before"], cells["now"]
            by = c["cpu_by_service_us_per_request"]
            nodes_m = sum(v for k, v in by.items() if k.startswith("node:"))
            apps = sum(v for k, v in by.items() if ":" not in k)
            ent = by.get(kc.services[0], float("nan"))  # the entry service: called from outside
            x, xt = _seen["crossings"], _seen["tls crossings"]
            tls_b = _seen["tls before"] / xt if xt else 0.0
            tls_n = _seen["tls"] / xt if xt else 0.0
            print(
                f"| {arch.value} | {c['name']} | {p50:.0f} | {b[0]:.0f} ({b[0] / p50 - 1:+.0%}) "
                f"| {n[0]:.0f} ({n[0] / p50 - 1:+.0%}) | {cpu:.0f} | {b[1]:.0f} "
                f"({b[1] / cpu - 1:+.0%}) | {n[1]:.0f} ({n[1] / cpu - 1:+.0%}) | {x:.0f} "
                f"| {xt:.0f} | {_seen.get('rate', float('nan')):.0f} | {_seen['price'] / x:.1f} "
                f"| {tls_b:+.1f} | {tls_n:+.1f} | {nodes_m / x:.1f} | {apps:+.0f} ({ent:+.0f}) |"
            )
        for k, v in errs.items():
            summary.append(error_line(f"{arch.value} {k}", v))
    print()
    if node_prof is not None:
        print(_tls_reading(node_prof))
    print()
    print("\n".join(summary))


if __name__ == "__main__":
    main()
