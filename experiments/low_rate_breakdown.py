"""The CPU breakdown of each stored profile's low-rate runs, side by side (issue #18). Measures
nothing: reads ``options.measurements`` and ``options.carried_measurements`` of profile documents.

``.venv/bin/python experiments/low_rate_breakdown.py DB:NAME [DB:NAME …] [--size 100] [--mode http]``

Per profile and mode (``tcp+http``: a tcp-mode proxy carrying http, as the node-l4 role is
measured), per run (``r100``, ``r300``, ``r1000``; ``max`` and the fractions of it): the CPU
breakdown in CPU-µs a crossing (read, write, IPC, notification, user, kernel other), their sum,
that user-space CPU per second (``user`` × 2 × rate: two crossings a request), and the probe
window's interference record (others, steal, run-queue wait, as fractions of the window). Written
for the sixth sitting's question why ``s5-nl4``'s 100/s CPU came out 2.8× the earlier sittings'.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from typing import Any


def runs(doc: dict[str, Any], size: float) -> list[tuple[str, str, dict[str, Any]]]:
    """(mode, run name, record) of every CPU run at ``size`` of a profile document."""
    opts = doc["provenance"]["options"]
    out: list[tuple[str, str, dict[str, Any]]] = []
    for key, prefix in (("measurements", ""), ("carried_measurements", "tcp+")):
        for mode, ms in (opts.get(key) or {}).items():
            for m in ms:
                if float(m["size"]) != size:
                    continue
                for rec in m.get("cpu") or []:
                    out.append((prefix + mode, str(rec["run"]), rec))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", nargs="+", help="DB:NAME")
    ap.add_argument("--size", type=float, default=100.0)
    ap.add_argument("--mode", default=None, help="only this mode (e.g. http, tcp+http)")
    a = ap.parse_args()
    comps = ("read", "write", "ipc", "notification", "user", "kernel_other")
    print(
        "| profile | mode | run | rate/s | "
        + " | ".join(comps)
        + " | sum | user ms/s | others | steal | wait |"
    )
    print("|---|---|---|---:|" + "---:|" * (len(comps) + 5))
    for spec in a.profiles:
        db, name = spec.rsplit(":", 1)
        row = (
            sqlite3.connect(db)
            .execute("select document from profiles where name=?", (name,))
            .fetchone()
        )
        if row is None:
            raise SystemExit(f"{db} has no profile {name!r}")
        doc = json.loads(row[0])
        for mode, run, rec in runs(doc, a.size):
            if a.mode and mode != a.mode:
                continue
            b = rec["breakdown_us"]
            rate = float(rec["rate"])
            inter = rec.get("interference") or {}
            cells = [f"{float(b.get(c, 0.0)):.1f}" for c in comps]
            user_ms = float(b.get("user", 0.0)) * 2 * rate / 1000
            extra = [
                f"{float(inter[k]):.3f}" if k in inter else "" for k in ("others", "steal", "wait")
            ]
            print(
                f"| {name} | {mode} | {run} | {rate:.0f} | "
                + " | ".join(cells)
                + f" | {sum(float(v) for v in b.values()):.1f} | {user_ms:.1f} | "
                + " | ".join(extra)
                + " |"
            )


if __name__ == "__main__":
    main()
