"""The app a client outside the mesh calls, with and without its node proxy in front, at the
validation's low rate — and kept node-l4 validations scored with that change priced.

Why: in a node-l4 validation the entry service's CPU falls (−18…−34 CPU-µs a request in the
chain cases of the ninth to twelfth sittings of #18); no profile prices it. The client runs
on the other CPU. Without a mesh the entry's response write wakes it there (and runs the
path to it); with node-l4 the write wakes the node proxy on the entry's own CPU, and the
proxy does the rest. The node-l4 profile's bed has the same geometry (client on CPU 0, node
proxy and echo on CPU 1) but records the echo's change only in closed-loop windows (−1.5
CPU-µs of kernel time a crossing at 100 B), where the client's CPU never idles.

``measure`` (root, under the measurement lock; starts the node-l4 bed):
``sudo .venv/bin/python experiments/entry_wake.py measure --db DB --profile NAME [--rate 100]
[--pairs 8] [--duration 3] [--size 100] [--out FILE]`` — paired fixed-rate runs without and
through the node proxies (order alternating), HTTP carried, to the echo on the client's node
(``intra``: one node proxy) and on the other node (``inter``: two, the echo's the other
node's); per run the echo's and the node proxies' CPU-µs a request (schedstat); then the
echo's change a request, meshed − direct (median over the pairs). ``inter``'s is the entry's
price (its client is on another node, as the validation places it).

``score`` (measures nothing): ``experiments/entry_wake.py score --delta D [--rate 100] --db DB
--profile SIDECAR --doc NODE_L4/all.json ...`` — each kept node-l4 case predicted again by the
engine as it is (the database's newest role profiles, as the validation took them), and its
CPU price plus ``D`` CPU-µs a request (its entry, called once a request from the client at
the case's rate), against the measured; p50 unchanged (the variant prices CPU only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from _kept import error_line, kept_validation

#: where the echo runs: on the client's node (the node-l4 profile's path) and on the other one
#: (the entry service's geometry in a validation: its client on a node of its own) — the
#: variant's price is ``inter``'s
PLACES = ("intra", "inter")


def measure(a: argparse.Namespace) -> None:
    from meshtax.model.sidecar import Mode
    from meshtax.store.sqlite import ProfileStore
    from meshtax.testbed import procfs
    from meshtax.testbed.nodebed import node_testbed
    from meshtax.testbed.pinning import pinning_of
    from meshtax.testbed.pods import Testbed
    from meshtax.testbed.system import RealSystem

    pinning = pinning_of(ProfileStore(a.db).get(a.profile))
    mode = Mode.HTTP
    rows: list[dict[str, Any]] = []
    with (
        Testbed(RealSystem(), lock_timeout=900.0) as tb,
        node_testbed(tb, pinning, "node-l4") as bed,
    ):
        roles = bed.start_sidecar(Mode.TCP, app=mode)
        try:
            targets = {
                (where, side): bed.direct_target(mode, where)
                if side == "direct"
                else bed.target(where)
                for where in PLACES
                for side in ("direct", "mesh")
            }
            apps = {where: bed.apps[where].process for where in PLACES}
            for t in targets.values():
                bed.load(t, mode, a.size, n=300)
            for i in range(a.pairs):
                sides = ("direct", "mesh") if i % 2 == 0 else ("mesh", "direct")
                for where in PLACES:
                    app = apps[where]
                    assert app is not None
                    for side in sides:
                        pids = [app.pid, *roles.pids]
                        b0 = procfs.cpu_ns(pids)
                        r = bed.load(
                            targets[where, side], mode, a.size, a.rate, duration_s=a.duration
                        )
                        b1 = procfs.cpu_ns(pids)
                        n = max(r.count, 1)
                        row = {
                            "pair": i,
                            "placement": where,
                            "side": side,
                            "achieved": r.actual_qps,
                            "count": r.count,
                            "app_us": (b1[app.pid] - b0[app.pid]) * 1e-3 / n,
                            "proxies_us": sum(b1[p] - b0[p] for p in roles.pids) * 1e-3 / n,
                            "p50": r.percentiles_us.get(50.0, 0.0),
                        }
                        rows.append(row)
                        print(
                            f"pair {i} {where} {side:6s} {r.actual_qps:6.1f}/s  echo "
                            f"{row['app_us']:7.1f}  node proxies {row['proxies_us']:7.1f} "
                            f"CPU-µs/req  p50 {row['p50']:6.0f}",
                            flush=True,
                        )
        finally:
            roles.stop()
    out: dict[str, Any] = {"rows": rows, "rate": a.rate, "size": a.size}
    for where in PLACES:
        diffs = []
        for i in range(a.pairs):
            by = {r["side"]: r for r in rows if r["pair"] == i and r["placement"] == where}
            diffs.append(by["mesh"]["app_us"] - by["direct"]["app_us"])
        med = statistics.median(diffs)
        out[where] = {"diffs": diffs, "delta_us": med}
        print(
            f"{where}: echo change a request (mesh − direct) at {a.rate:g}/s, {a.size} B: median "
            f"{med:+.1f} CPU-µs, {sum(d < 0 for d in diffs)} of {len(diffs)} pairs below 0 "
            f"({', '.join(f'{d:+.1f}' for d in diffs)}); a crossing {med / 2:+.1f}"
        )
    if a.out:
        Path(a.out).write_text(json.dumps(out) + "\n")


def score(a: argparse.Namespace) -> None:
    from meshtax.model.sidecar import Architecture
    from meshtax.store.sqlite import ProfileStore
    from meshtax.validate.run import kept_cases

    store = ProfileStore(a.db)
    prof = store.get(a.profile)
    cpu_before: list[float] = []
    cpu_after: list[float] = []
    p50: list[float] = []
    print("| case | CPU µs/request measured | priced | with the entry's change | entry measured |")
    print("|---|---:|---:|---:|---:|")
    for path in a.doc:
        doc, arch, roles = kept_validation(store, path, (Architecture.NODE_L4,))
        for kc in kept_cases(path, doc):
            rate = float(kc.record["rate"])
            if abs(rate - a.rate) > 0.1 * a.rate:
                sys.exit(
                    f"{path} {kc.record['name']}: run at {rate:g}/s, the change at {a.rate:g}/s"
                )
            pr = kc.predict(prof, pod_cpus=a.pod_cpus, architecture=arch, roles=roles)
            m, p = kc.cpu_us, pr.cpu_us_per_request
            v = p + a.delta  # the entry: called once a request, from the client outside the mesh
            cpu_before.append(p / m - 1)
            cpu_after.append(v / m - 1)
            p50.append(pr.p50_us / kc.p50_us - 1)
            entry = kc.record["cpu_by_service_us_per_request"].get(kc.services[0], float("nan"))
            print(
                f"| {kc.record['name']} | {m:.0f} | {p:.0f} ({p / m - 1:+.0%}) | {v:.0f} "
                f"({v / m - 1:+.0%}) | {entry:+.0f} |"
            )
    print(error_line("node-l4 p50 (both)", p50))
    print(error_line("node-l4 cpu before", cpu_before))
    print(error_line(f"node-l4 cpu with the entry's {a.delta:+.1f}", cpu_after))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="paired runs on the node-l4 bed (root)")
    m.add_argument("--db", required=True, help="a profile database (for the CPU pinning)")
    m.add_argument("--profile", required=True)
    m.add_argument("--rate", type=float, default=100.0)
    m.add_argument("--pairs", type=int, default=8)
    m.add_argument("--duration", type=float, default=3.0)
    m.add_argument("--size", type=int, default=100)
    m.add_argument("--out", default=None)
    s = sub.add_parser("score", help="kept node-l4 validations with the entry's change priced")
    s.add_argument("--delta", type=float, required=True, help="CPU-µs a request (measure's)")
    s.add_argument("--rate", type=float, default=100.0, help="the rate the change was measured at")
    s.add_argument("--doc", nargs="+", required=True, help="node-l4 all.json (kept traces)")
    s.add_argument("--db", required=True, help="the validation's profile database")
    s.add_argument("--profile", required=True, help="the sidecar profile the validation used")
    s.add_argument("--pod-cpus", type=int, default=1)
    a = ap.parse_args()
    if a.cmd == "measure":
        measure(a)
    else:
        score(a)


if __name__ == "__main__":
    main()
