"""Issue #20, set 8: when does fortio send? (measures; as root, under the measurement lock)

One hop's echo bed (the profile's pinning: client on CPU 0, app and sidecar on CPU 1), fortio
``-uniform`` at the given rates with its access log (each request's start time, thread and
iteration), without the sidecar and through it, one run of ``--duration`` s per side and rate.
Per run: how late each send left against its connection's even schedule (the connection's
least-late send taken as on time), how many left within 30 µs of the previous one (bunched),
and the dispersion of the sends per millisecond (variance ÷ mean; 0 for an even stream, 1 for
Poisson). The candidate it tests (``validate.tail_run.GO_NETPOLL_WAKEUP_US``): fortio's one Go
scheduler sleeps in whole milliseconds when idle, so without the mesh (responses back before
the next send is due) sends leave up to ~1 ms late and in bunches, while through the sidecar
(responses still in flight) they leave nearer their schedule.

    .venv/bin/python experiments/tail_send_times.py --rates 4561,9123 --out DIR/send-times.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from meshtax.model.sidecar import Mode
from meshtax.testbed.bed import echo_testbed
from meshtax.testbed.pinning import default_pinning
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import RealSystem

BUNCH_US = 30.0


def analyse(path: Path, rate: float, connections: int, skip_s: float = 0.2) -> dict[str, Any]:
    """The sends of one access log (fortio's JSON lines: timestamp ns, thread, iter)."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    if not rows:
        return {"sends": 0}
    t = np.array([r["timestamp"] for r in rows], dtype=np.float64) * 1e-3  # µs
    thread = np.array([r["thread"] for r in rows])
    it = np.array([r["iter"] for r in rows], dtype=np.float64)
    every = 1e6 * connections / rate  # one connection's spacing
    late = np.empty_like(t)
    for k in np.unique(thread):
        sel = thread == k
        n = it[sel].max() + 1  # fortio spreads a run's n calls so the last ends at its end
        sched = t[sel] - it[sel] * every * (1.0 + 1.0 / max(n - 1.0, 1.0))
        late[sel] = sched - sched.min()
    keep = t >= t.min() + skip_s * 1e6
    order = np.argsort(t[keep])
    ts, lt = t[keep][order], late[keep]
    gaps = np.diff(ts)
    counts = np.histogram(ts, bins=np.arange(ts[0], ts[-1], 1000.0))[0]
    q = [0.5, 0.9, 0.99, 1.0]
    return {
        "sends": int(ts.size),
        "late_us": dict(zip(["p50", "p90", "p99", "max"], np.quantile(lt, q).round(1).tolist())),
        "late_mean_us": round(float(lt.mean()), 1),
        "bunched": round(float((gaps < BUNCH_US).mean()), 3),
        "gap_us": dict(zip(["p50", "p90", "p99", "max"], np.quantile(gaps, q).round(1).tolist())),
        "spacing_us": round(1e6 / rate, 1),
        "per_ms_dispersion": round(float(counts.var() / max(counts.mean(), 1e-9)), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", required=True, help="requests/s, comma-separated")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rates = [float(x) for x in a.rates.split(",")]
    pinning = default_pinning()
    out: dict[str, Any] = {"pinning": pinning.describe(), "runs": []}
    with (
        tempfile.TemporaryDirectory(prefix="sendtimes-") as tmp,
        Testbed(RealSystem(), lock_timeout=60.0) as tb,
        echo_testbed(tb, pinning) as bed,
    ):
        envoy = bed.start_sidecar(Mode.HTTP)
        targets = {"no_mesh": bed.direct_target(Mode.HTTP), "mesh": bed.meshed_target}
        for target in targets.values():
            bed.load(target, Mode.HTTP, 100, n=500, connections=a.connections)
        for rate in rates:
            for side, target in targets.items():
                log = Path(tmp) / f"{side}-{rate:.0f}.jsonl"
                r = bed.load(
                    target,
                    Mode.HTTP,
                    100,
                    rate,
                    duration_s=a.duration,
                    connections=a.connections,
                    extra_args=("-uniform", "-access-log-file", str(log)),
                )
                got = {"side": side, "rate": rate, "achieved": r.actual_qps}
                got |= {"p50_us": r.percentiles_us.get(50.0), "p90_us": r.percentiles_us.get(90.0)}
                got |= analyse(log, rate, a.connections)
                out["runs"].append(got)
                print(json.dumps(got), flush=True)
        envoy.stop()
    Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
