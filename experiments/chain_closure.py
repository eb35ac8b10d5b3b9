"""A stored node-bed profile's probe windows decomposed again, wall times (``mesh_breakdown``)
against on-CPU time (``chain_breakdown``): the closure each gives per mode, offline (issue #18).

    .venv/bin/python experiments/chain_closure.py --db DB NAME [NAME ...]

The windows' records hold thread sums of the watched proxy, the app with the path's other
proxies, and the client (per-call counts included); they are rebuilt into
:class:`~meshtax.profile.decompose.Window` sums per size and both estimators run on them.
Totals are raw (no component clamped at zero, as the profile's closure does).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from meshtax.profile.decompose import Window, chain_breakdown, mesh_breakdown
from meshtax.store.sqlite import ProfileStore
from meshtax.testbed.probe_reading import OpStat, ThreadReading


def thread(d: Mapping[str, Any]) -> ThreadReading:
    def op(k: str) -> OpStat:
        return OpStat(int(d.get(f"{k}_n", 0)), int(d.get(f"{k}_ns", 0)))

    return ThreadReading(
        0,
        0,
        "",
        op("read"),
        op("write"),
        op("epoll"),
        op("notify"),
        int(d["syscalls"]),
        int(d["sys_ns"]),
        int(d["oncpu_ns"]),
        int(d["user_ns"]),
        int(d["sys_cpu_ns"]),
        0,
        int(d["switches_in"]),
        sock_ipc=op("sock_ipc"),
        errqueue=op("errqueue"),
        notify_behind_ns=int(d.get("notify_behind_ns", 0)),
    )


def window(w: Mapping[str, Any]) -> Window:
    return Window(
        int(w["requests"]),
        thread(w["sidecar"]),
        thread(w["app"]),
        int(w["ipc_ns"]),
        int(w["ipc_packets"]),
        int(w["ipc_bytes"]),
        thread(w["client"]),
    )


def pooled(ws: list[Window]) -> Window:
    out = ws[0]
    for w in ws[1:]:
        out = out + w
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("names", nargs="+")
    a = ap.parse_args()
    store = ProfileStore(a.db)
    print(
        "| profile | mode | measured µs | wall: components (error) | on-CPU: components (error) |"
    )
    print("|---|---|---:|---:|---:|")
    for name in a.names:
        opts = store.get(name).provenance.options
        groups = {
            **opts["measurements"],
            **{f"tcp+{p}": r for p, r in opts["carried_measurements"].items()},
        }
        for mode, rs in groups.items():
            ov = wall = chain = 0.0
            for r in rs:
                kept = [w for w in r["probe"]["windows"] if w["kept"]]
                m = pooled([window(w) for w in kept if w["meshed"]])
                d = pooled([window(w) for w in kept if not w["meshed"]])
                ov += r["probe"]["overhead_per_request_us"]["median"] / 2
                wall += mesh_breakdown(m, d).total()
                chain += chain_breakdown(m, d).total()
            n = len(rs)
            print(
                f"| {name} | {mode} | {ov / n:.1f} | {wall / n:.1f} ({wall / ov - 1:+.0%}) | "
                f"{chain / n:.1f} ({chain / ov - 1:+.0%}) |"
            )


if __name__ == "__main__":
    main()
