"""Was a profile measured on a quiet or a busy host? Host wake stalls against Notification.

Issue #14 asks two quick profiles an hour apart to agree within 10 % on every component above
5 µs. Notification never did (tcp 100 B and 4 KB 40–60 % apart in run 14), and the probe
windows' per-event wake-up histograms say why: the guest's steal time stays ≈ 0 on this VM,
but in some profiles every probed thread's wake-ups stall ≥ 130 µs tens of times a second and
the sidecar's slow (14–130 µs, a halted vCPU woken) wake-ups per crossing rise with them —
the host's other tenants, not the sidecar. For each stored profile this prints, from its raw
windows (older profiles too: the histograms were always kept), per mode and size: the median
window's host stalls a second (:func:`meshtax.testbed.interference.host_stalls`'s rule), the
sidecar's slow wake-ups per crossing in the meshed windows, the app's in the direct ones, and
the stored Notification and its value over the windows at or under ``--quiet`` stalls a second
only. Then every pair of the profiles: components above 5 µs within 10 % once normalised (as
``benchmarks/bench_profile.py --compare``), by regime (Q quiet, B busy: the median over sizes
of the median window's stalls at or over :data:`meshtax.model.speed.BUSY_HOST_STALLS`). Offline, nothing
is measured. Usage::

    .venv/bin/python experiments/host_regime.py [--quiet 25] DB NAME [DB NAME ...]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from bench_profile import DRIFT, normalized_agreement  # noqa: E402
from meshtax.model.profile import Profile  # noqa: E402
from meshtax.model.speed import BUSY_HOST_STALLS  # noqa: E402
from meshtax.store.sqlite import ProfileStore  # noqa: E402
from meshtax.testbed.interference import HOST_STALL_NS  # noqa: E402
from meshtax.testbed.probe_reading import Histogram  # noqa: E402

SLOW_NS = 13 << 10  # a wake-up from 13 bins of 1024 ns on, under a stall: a halted vCPU's
ACTORS = ("sidecar", "app", "client")


def _hist(w: dict[str, Any], actor: str) -> Histogram:
    bins = tuple((int(b), int(n), int(t)) for b, n, t in w["notify_hist"].get(actor, ()))
    return Histogram(bins, int(w.get("notify_hist_shift", 10)))


def window_stalls(w: dict[str, Any]) -> float:
    """Host stalls a second of one stored window (every probed thread's)."""
    n = sum(_hist(w, a).count_from(HOST_STALL_NS) for a in ACTORS)
    return n * 1e9 / w["duration_ns"] if w["duration_ns"] > 0 else 0.0


def slow_per_crossing(ws: list[dict[str, Any]], actor: str) -> float:
    """Slow wake-ups (a halted vCPU's, under a stall) of ``actor`` per crossing."""
    x = sum(2 * w["requests"] for w in ws)
    hs = [_hist(w, actor) for w in ws]
    n = sum(h.count_from(SLOW_NS) - h.count_from(HOST_STALL_NS) for h in hs)
    return n / x if x else float("nan")


def rows(p: Profile, quiet: float) -> list[dict[str, Any]]:
    out = []
    for mode, rs in p.provenance.options["measurements"].items():
        for r in rs:
            probe = r.get("probe") or {}
            kept = [w for w in probe.get("windows", ()) if w["kept"] and "notify_hist" in w]
            meshed = [w for w in kept if w["meshed"]]
            direct = [w for w in kept if not w["meshed"]]
            pairs = probe.get("per_pair_breakdown_us", [])
            k = min(len(meshed), len(direct), len(pairs))
            if not k:
                continue
            stalls = [max(window_stalls(meshed[i]), window_stalls(direct[i])) for i in range(k)]
            calm = [pairs[i]["notification"] for i in range(k) if stalls[i] <= quiet]
            out.append(
                {
                    "mode": mode,
                    "size": r["size"],
                    "stalls": median(stalls),
                    "sidecar_slow": slow_per_crossing(meshed[:k], "sidecar"),
                    "direct_app_slow": slow_per_crossing(direct[:k], "app"),
                    "notification": probe["latency_breakdown_us"].get("notification"),
                    "quiet_notification": sum(calm) / len(calm) if calm else None,
                    "quiet_pairs": f"{len(calm)}/{k}",
                }
            )
    return out


def regime(rs: list[dict[str, Any]]) -> str:
    """B when the median over sizes of the median window's stalls is a busy host's (as a
    profile's ``stalls_median``), else Q."""
    typical = median(r["stalls"] for r in rs) if rs else 0.0
    return "B" if typical >= BUSY_HOST_STALLS else "Q"


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quiet", type=float, default=25.0, help="stalls a second of a quiet window")
    ap.add_argument("pairs", nargs="+", metavar="DB NAME")
    args = ap.parse_args(argv)
    if len(args.pairs) % 2:
        ap.error("give DB NAME pairs")
    profiles = {n: ProfileStore(db).get(n) for db, n in zip(args.pairs[::2], args.pairs[1::2])}
    regimes = {}
    for name, p in profiles.items():
        rs = rows(p, args.quiet)
        regimes[name] = regime(rs)
        st = [r["stalls"] for r in rs]
        print(
            f"== {name} ({p.provenance.created[:16]}): {regimes[name]} (stalls a second, median "
            f"over sizes {median(st):.1f}, largest {max(st):.1f})"
        )
        for r in rs:
            qn = r["quiet_notification"]
            print(
                f"  {r['mode']:5s} {r['size']:6d}  stalls/s {r['stalls']:5.1f}  sidecar slow/x "
                f"{r['sidecar_slow']:.3f}  direct app slow/x {r['direct_app_slow']:.3f}  "
                f"Notification {r['notification']:6.2f}  quiet windows "
                f"{'   -  ' if qn is None else f'{qn:6.2f}'} ({r['quiet_pairs']})"
            )
    by: dict[str, list[float]] = {}
    print("== pairs: components above 5 µs within 10 % once normalised")
    for a, b in itertools.combinations(profiles, 2):
        d = normalized_agreement(profiles[a], profiles[b])
        if not d:
            continue
        within = sum(v <= DRIFT for v in d.values())
        kind = "".join(sorted(regimes[a] + regimes[b]))
        by.setdefault(kind, []).append(within / len(d))
        print(f"  {a:10s} {b:10s} {kind}  {within}/{len(d)}")
    for kind, shares in sorted(by.items()):
        print(
            f"  {kind}: {len(shares)} pairs, mean share within 10 % {sum(shares) / len(shares):.2f}"
        )


if __name__ == "__main__":
    main()
