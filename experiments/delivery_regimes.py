"""Do a profile's probe windows measure one system or two? Delivery regimes per window.

Issue #14 asks two quick profiles an hour apart to agree within 10 % on every component above
5 µs. At tcp 64 KB they never did (Write, Read, Notification 20–80 % apart), and the windows
show why: in some meshed windows the echo app is woken about once per message and writes the
message in 3 sends, in others about twice and in 4 — a delivery regime that holds for a whole
window (a fresh load generator's connections) and whose share moves from profile to profile.
For each mode and size this prints, from the profile's raw windows, the app's wake-ups and
writes per message of each kept meshed window, splits the windows into regimes where their
wake-ups per message differ by half a wake-up or more, and gives each regime's share and mean
per-pair components (µs per crossing) next to the pooled value the profile stores.
Offline, nothing is measured. Usage::

    .venv/bin/python experiments/delivery_regimes.py DB NAME [DB NAME ...]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np

from meshtax.store.sqlite import ProfileStore

COMPONENTS = ("read", "write", "ipc", "notification", "user")
SPLIT = 0.5  # wake-ups per message between the regimes' windows, at least


def regimes(wakeups: Sequence[float] | np.ndarray) -> np.ndarray:
    """Each window's regime: 0, or 1 for windows above the midpoint of the smallest and the
    largest wake-ups per message when those are ``SPLIT`` or more apart (else all 0)."""
    w = np.asarray(wakeups, dtype=float)
    if w.size == 0 or w.max() - w.min() < SPLIT:
        return np.zeros(w.size, dtype=int)
    split: np.ndarray = (w > (w.min() + w.max()) / 2).astype(int)
    return split


def size_rows(
    record: dict[str, Any],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, float]]]:
    """(wake-ups, writes per message of the app, regime) of each kept meshed window — the
    i-th is the meshed window of the i-th pair — and the pairs' components."""
    probe = record["probe"]
    meshed = [w for w in probe["windows"] if w["kept"] and w["meshed"]]
    pairs = probe["per_pair_breakdown_us"]
    meshed = meshed[: len(pairs)]
    wake = np.array([w["app"]["notify_n"] / max(w["requests"], 1) for w in meshed])
    writes = np.array([w["app"]["write_n"] / max(w["requests"], 1) for w in meshed])
    return wake, writes, regimes(wake), pairs


def report(db: str, name: str) -> None:
    prof = ProfileStore(db).get(name)
    meas = prof.provenance.options["measurements"]
    print(f"== {name} ({db}), {prof.provenance.created}")
    for mode in ("tcp", "http", "grpc"):
        for r in meas.get(mode, []):
            wake, writes, reg, pairs = size_rows(r)
            if not pairs:
                continue
            head = f"{mode:4s} {r['size']:6d}: {len(pairs)} pairs"
            pooled = r["probe"]["latency_breakdown_us"]
            if reg.max(initial=0) == 0:
                print(
                    f"{head}, one regime (app woken {wake.mean():.2f}, writes {writes.mean():.2f})"
                )
                continue
            cols = []
            for c in COMPONENTS:
                v = np.array([p[c] for p in pairs])
                cols.append(
                    f"{c} {v[reg == 0].mean():5.1f}/{v[reg == 1].mean():5.1f} ({pooled[c]:5.1f})"
                )
            print(
                f"{head}, two regimes: app woken {wake[reg == 0].mean():.2f} / "
                f"{wake[reg == 1].mean():.2f} per message, writes {writes[reg == 0].mean():.2f} / "
                f"{writes[reg == 1].mean():.2f}, windows {int((reg == 0).sum())} / "
                f"{int(reg.sum())}; " + ", ".join(cols)
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="+", metavar="DB NAME")
    a = ap.parse_args()
    if len(a.profiles) % 2:
        raise SystemExit("give profiles as pairs: DB NAME [DB NAME ...]")
    for db, name in zip(a.profiles[::2], a.profiles[1::2]):
        report(db, name)


if __name__ == "__main__":
    main()
