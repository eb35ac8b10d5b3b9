"""Large messages: the base sidecar at sizes up to 1 MiB, the small-size line vs the split model.

Per request through one sidecar: worker CPU and fortio mean latency per size (rounds),
halved per crossing; the line through sizes <= 4 KiB (the paper's linear model) and the split
model (split chosen among 16/32/64/128 KiB) are compared with measurement at 16 KiB, 64 KiB,
256 KiB and 1 MiB. JSON to ``--out``.

    .venv/bin/python benchmarks/bench_large_messages.py --modes http,tcp --out artifacts/large.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends
from meshtax.profile.filters import FilterRunOptions
from meshtax.profile.large import LARGE_SIZES, fit_large, measure_large
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import RealSystem


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="http,tcp")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, required=True, help="result JSON")
    a = ap.parse_args(argv)
    opts = FilterRunOptions.quick() if a.quick else FilterRunOptions()
    doc: dict[str, object] = {
        "command": " ".join(sys.argv),
        "machine": platform.node(),
        "load_average_start": os.getloadavg(),
    }
    with Testbed(RealSystem(), lock_timeout=900.0) as tb:
        for m in a.modes.split(","):
            mode = Mode(m)
            lr = measure_large(tb, Backends(), mode, LARGE_SIZES, opts)
            fits = {k: fit_large(v, k) for k, v in (("cpu", lr.cpu_us), ("latency", lr.latency_us))}
            doc[mode.value] = {
                "measured": lr.to_dict(),
                **{k: f.to_dict() for k, f in fits.items()},
            }
            for k, f in fits.items():
                print(
                    f"\n{mode.value} {k} per crossing (µs): split model split={f.split.split_bytes} "
                    f"a={f.split.intercept:.2f} b={f.split.slope * 1e3:.4f}/KB u={f.split.per_unit:.2f}; "
                    f"R² {f.split.stats.r2 if f.split.stats else None}"
                )
                print(
                    f"  {'size':>8s} {'measured':>10s} {'line':>10s} {'err':>7s} {'split':>10s} {'err':>7s}"
                )
                for r in f.rows():
                    print(
                        f"  {r['size']:8.0f} {r['measured']:10.1f} {r['line']:10.1f} {100 * r['line_error']:+6.1f}% "
                        f"{r['split_model']:10.1f} {100 * r['split_error']:+6.1f}%"
                    )
    doc["load_average_end"] = os.getloadavg()
    a.out.write_text(json.dumps(doc, indent=1))
    print(f"\nwritten {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
