"""One-hop sweeps, predicted vs measured (issue 6 item 4; the paper's Figures 10 and 11).

Run as root: ``.venv/bin/python benchmarks/bench_sweeps.py [--db PROFILES.db] [--profile NAME]
[--modes http] [--kinds size,rate] [--rate 200] [--duration 2] [--out artifacts/validation]``.

Client (no mesh) → fortio echo, without and with a sidecar, paired runs. ``size``: request =
response = 100 B … 64 KB at a fixed rate. ``rate``: 100 B at 25 … 100 % of the no-mesh
maximum (closed loop, one connection). Writes ``<out>/sweep-<kind>-<mode>.json``
(``meshtax-validation/1`` with a ``sweep`` key), ``<out>/sweeps.svg`` (latency and CPU per
request vs x, measured with intervals and predicted) and prints a table. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from meshtax.app.data import write_document
from meshtax.app.measure import SweepOptions, sweep
from meshtax.model.sidecar import Mode
from meshtax.store.sqlite import ProfileStore
from meshtax.validate.sweep import SweepResult


def plot(results: list[SweepResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(len(results), 2, figsize=(9, 3.2 * len(results)), squeeze=False)
    for row, r in zip(axs, results):
        cases = r.cases()
        xs = [p.x for p in r.points]
        for ax, metric, label in (
            (row[0], "latency", "latency overhead p50 (µs)"),
            (row[1], "cpu", "CPU overhead (CPU-µs per request)"),
        ):
            k = [c.comparisons[metric] for c in cases]
            med = [c.measured.median for c in k]
            ax.errorbar(
                xs,
                med,
                yerr=[
                    [m - c.measured.lo for m, c in zip(med, k)],
                    [c.measured.hi - m for m, c in zip(med, k)],
                ],
                marker="o",
                capsize=3,
                label="measured",
            )
            ax.plot(xs, [c.predicted for c in k], marker="s", label="predicted")
            ax.set_ylabel(label, fontsize=8)
            ax.set_xlabel(
                "message size (B)" if r.kind == "size" else "rate (fraction of no-mesh max)",
                fontsize=8,
            )
            if r.kind == "size":
                ax.set_xscale("log", base=2)
            ax.set_title(f"{r.mode}, {r.kind} sweep", fontsize=9)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=None)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--modes", default="http")
    ap.add_argument("--kinds", default="size,rate")
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--out", default="artifacts/validation")
    a = ap.parse_args()
    store = ProfileStore(a.db) if a.db else ProfileStore()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results: list[SweepResult] = []
    t0 = time.monotonic()
    for mode in a.modes.split(","):
        for kind in a.kinds.split(","):
            assert kind in ("size", "rate")
            opts = SweepOptions(
                kind,
                Mode(mode),
                a.duration,
                a.profile,
                rate=a.rate,
                pairs=(a.pairs, a.pairs),
            )
            r = sweep(
                opts,
                store,
                lambda m: print(f"[{time.monotonic() - t0:5.0f}s] {m}", flush=True),
            )
            write_document(r.to_document(), str(out / f"sweep-{kind}-{mode}.json"), store)
            results.append(r)
            print(f"\n{mode} {kind} sweep (no-mesh max {r.max_qps_no_mesh:.0f}/s):")
            print(
                "| x | rate/s | latency measured [CI] | predicted | error | CPU µs/req measured "
                "[CI] | predicted | error |"
            )
            print("|---|---|---|---|---|---|---|---|")
            for c in r.cases():
                k = c.comparisons
                lat, cpu = k["latency"], k["cpu"]
                print(
                    f"| {c.query} | {c.rate:.0f} | {lat.measured.median:.0f} "
                    f"[{lat.measured.lo:.0f}, {lat.measured.hi:.0f}] | {lat.predicted:.0f} | {lat.error:+.0%} "
                    f"| {cpu.measured.median:.1f} [{cpu.measured.lo:.1f}, {cpu.measured.hi:.1f}] | "
                    f"{cpu.predicted:.1f} | {cpu.error:+.0%} |"
                )
    plot(results, out / "sweeps.svg")
    print(
        f"\nload average {os.getloadavg()}; wall {time.monotonic() - t0:.0f} s; plots in {out / 'sweeps.svg'}"
    )


if __name__ == "__main__":
    main()
