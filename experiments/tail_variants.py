"""The runs of one-hop tail validations predicted again under other assumptions of the tail
model: how requests arrive (evenly spaced, as fortio -uniform sends them, or Poisson) and how
a request's CPU work varies (constant, or like the profile's latency sketch) — to choose the
model's defaults on runs that are not the ones the benchmark reports.

``.venv/bin/python experiments/tail_variants.py --db DB --doc onehop-tcp.json [--doc …]``

Prints, per variant, the median absolute error and the bias of each percentile over the
documents' sustained levels. Offline: nothing is measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.stations import TailOptions
from meshtax.store.sqlite import ProfileStore
from meshtax.validate.tail import TailRun, predict_one_hop

PCTS = (50.0, 90.0, 99.0)


def errors(doc: dict[str, Any], prof: Any, arrivals: float, service: str) -> dict[str, list[float]]:
    t = doc["tail"]
    out: dict[str, list[float]] = {f"p{p:g}": [] for p in PCTS}
    for pt in t["points"]:
        if not pt.get("sustained"):
            continue
        base_runs = [TailRun.from_dict(r["no_mesh"]) for r in pt["runs"]]
        base = [q for r in base_runs for q in r.quantiles_us]
        app = statistics.median(r.cpu_us_per_request("app") for r in base_runs)
        opts = TailOptions(
            percentiles=PCTS,
            samples=max(20, 40_000 // len(base)),
            arrivals=arrivals,
            service=service,  # type: ignore[arg-type]
            pod_cpus=1,
            app_cpu_us=app,
        )
        size = int(doc["options"].get("size_bytes", 100))
        got = predict_one_hop(prof, SidecarConfig(Mode(t["mode"])), size, pt["rate"], base, opts)
        for k in out:
            m = pt["measured"][k]["median"]
            v = got.overhead[k][0]
            if m and v == v and abs(v) != float("inf"):
                out[k].append((v - m) / m)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--doc", action="append", required=True)
    a = ap.parse_args()
    store = ProfileStore(a.db)
    docs = [json.loads(Path(d).read_text()) for d in a.doc]
    print("| arrivals | service | " + " | ".join(f"p{p:g} median abs (bias)" for p in PCTS) + " |")
    print("|---|---|" + "---|" * len(PCTS))
    for arrivals, service in itertools.product((0.0, 1.0), ("constant", "latency")):
        errs: dict[str, list[float]] = {f"p{p:g}": [] for p in PCTS}
        for doc in docs:
            for k, v in errors(doc, store.get(doc["profile"]), arrivals, service).items():
                errs[k] += v
        cells = [
            f"{statistics.median(abs(x) for x in e):.1%} ({statistics.fmean(e):+.1%}, {len(e)})"
            if e
            else "-"
            for e in errs.values()
        ]
        name = "even" if arrivals == 0 else "poisson"
        print(f"| {name} | {service} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
