"""Re-predict kept node-l4/waypoint validations with parts of the architecture pricing switched
off, to see what each part does (issue #18). Measures nothing.

``.venv/bin/python experiments/architecture_variants.py --db PROFILES.db --profile NAME
--doc OUT/node-l4/all.json [OUT/waypoint/all.json …] [--variants fix,own-rate,no-idle]``

``--role-db``: a role (node-l4, waypoint) that database has a profile of is priced from its
newest (default: ``--db``'s newest, as the validation did).

``--doc``: ``all.json`` of ``benchmarks/bench_validate.py --architectures … --keep-traces`` (the
no-mesh traces in ``traces`` next to it). Variants (``+`` combines them): ``fix`` the code as
it is; ``own-rate`` node proxies and waypoints at each call's own rate, not the shared-CPU rate;
``no-idle`` no idle proxy CPU at all; ``carried`` every proxy priced at the rate it carries itself
(:func:`carried_rates`: a node proxy the traversals of every pod of its node, both legs of an
inter-node call counted once on each node, a waypoint its service's, a sidecar its pod's; the
sixth sitting's test of "a proxy's cost per message follows its own traffic"); ``rate-x<K>``
every shared-CPU rate times K (sidecars too: a sensitivity check of how warm the pods' CPU
is taken to be, not a pricing). Prints, per case, the measured CPU µs per request and each
variant's prediction (error). The placement, role profiles and pod CPUs are the validation's.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import meshtax.predict.architecture as arch_mod
import meshtax.predict.engine as engine_mod
from meshtax.app.pricing import role_profiles
from meshtax.model.sidecar import Architecture
from meshtax.store.sqlite import ProfileStore
from meshtax.validate.run import kept_cases

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _kept import kept_validation_parser  # noqa: E402

_RATES = arch_mod.shared_cpu_rates  # type: ignore[attr-defined]
_IDLE = arch_mod.architecture_idle
_COSTS = arch_mod.architecture_costs


def _own_rates(batch: Any, pod_cpus: int, *, also: Any = None) -> Any:
    return np.asarray(batch.rate, dtype=np.float64)


def _no_idle(arranged: Any, profiles: Callable[..., Any]) -> tuple[None, None]:
    return None, None


def _times(k: float) -> Callable[..., Any]:
    def rates(batch: Any, pod_cpus: int, *, also: Any = None) -> Any:
        return k * _RATES(batch, pod_cpus, also=also)

    return rates


def carried_rates(arranged: Any) -> tuple[tuple[Any, Any], Any]:
    """Per row, the rate the proxy on each side carries (in a one-proxy bed's units: one
    traversal per request at rate r is r), and the callee's waypoint's; per graph. A proxy is
    a node's (node-l4, waypoint services: ``node:<node>``), a waypoint (``wp:<service>``) or a
    sidecar (``svc:<service>``); it carries the sum of the rates of the rows that cross it."""
    b = arranged.batch
    g = b.graph_of()

    def proxy(si: int) -> str:
        name = str(b.services[si])
        proxied = arranged.architectures[name] in arch_mod._PROXIED
        return "node:" + str(arranged.nodes[name]) if proxied else "svc:" + name

    total: dict[tuple[int, str], float] = {}
    keys: list[list[tuple[int, str] | None]] = []
    sides = [(b.caller, b.caller_spec, proxy), (b.callee, b.callee_spec, proxy)]
    if arranged.waypoint is not None:
        w = arranged.waypoint
        sides.append((w.callee, w.callee_spec, lambda si: "wp:" + b.services[si]))
    for who, spec, name in sides:
        ks = [
            (int(gi), name(int(s))) if s >= 0 and sp >= 0 else None
            for s, sp, gi in zip(who.tolist(), spec.tolist(), g.tolist(), strict=True)
        ]
        for k, r in zip(ks, b.rate.tolist(), strict=True):
            if k is not None:
                total[k] = total.get(k, 0.0) + r
        keys.append(ks)

    def rates(ks: list[tuple[int, str] | None]) -> Any:
        own = b.rate.tolist()
        return np.asarray([total[k] if k else r for k, r in zip(ks, own, strict=True)])

    way = rates(keys[2]) if len(keys) > 2 else None
    return (rates(keys[0]), rates(keys[1])), way


def _carried_costs(
    arranged: Any, profiles: Any, *, speed: Any = None, pod_cpus: int | None = None
) -> Any:
    if pod_cpus is None:
        return _COSTS(arranged, profiles, speed=speed, pod_cpus=None)
    main, way = carried_rates(arranged)
    costs = engine_mod.hop_costs(arranged.batch, profiles, rates=main, speed=speed)
    if arranged.waypoint is not None:
        way_costs = engine_mod.hop_costs(arranged.waypoint, profiles, rates=(way, way), speed=speed)
        costs = arch_mod._add(costs, way_costs)
    return costs


def use(variant: str) -> None:
    """Switch the module's parts as ``variant`` says (``+``-joined names)."""
    parts = set(variant.split("+"))
    k = [float(p[len("rate-x") :]) for p in parts if p.startswith("rate-x")]
    rates = _own_rates if "own-rate" in parts else _times(k[0]) if k else _RATES
    arch_mod.shared_cpu_rates = rates  # type: ignore[attr-defined]
    engine_mod.shared_cpu_rates = rates  # type: ignore[attr-defined]
    arch_mod.architecture_idle = _no_idle if "no-idle" in parts else _IDLE
    arch_mod.architecture_costs = _carried_costs if "carried" in parts else _COSTS


def main() -> None:
    ap = kept_validation_parser(__doc__)
    ap.add_argument("--variants", default="fix,own-rate,no-idle")
    ap.add_argument(
        "--role-db", default=None, help="take the role profiles from this database's newest"
    )
    a = ap.parse_args()
    store = ProfileStore(a.db)
    role_store = ProfileStore(a.role_db) if a.role_db else store
    prof = store.get(a.profile)
    variants = a.variants.split(",")
    print("| architecture | case | CPU µs/request measured | " + " | ".join(variants) + " |")
    print("|---|---|---:|" + "---:|" * len(variants))
    for path in a.doc:
        doc = json.loads(Path(path).read_text())
        opts = doc["options"]
        arch = Architecture(opts["architecture"])
        got, _ = role_profiles(store, (arch,), accept_unclosed=True)
        roles = {r: store.get(n) for r, n in got.items()}
        # a role the other database measured wins
        mine, _ = role_profiles(role_store, (arch,), accept_unclosed=True)
        roles.update({r: role_store.get(n) for r, n in mine.items()})
        for kc in kept_cases(path, doc):
            c, measured = kc.record, kc.cpu_us
            cells = []
            for v in variants:
                use(v)
                p = kc.predict(prof, pod_cpus=a.pod_cpus, architecture=arch, roles=roles)
                cells.append(
                    f"{p.cpu_us_per_request:.0f} ({p.cpu_us_per_request / measured - 1:+.0%})"
                )
            print(f"| {arch.value} | {c['name']} | {measured:.0f} | " + " | ".join(cells) + " |")
    use("fix")


if __name__ == "__main__":
    main()
