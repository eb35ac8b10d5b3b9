"""Cost of the ``istio-default`` preset per request, next to a bare Envoy sidecar.

The preset's stand-ins (:mod:`meshtax.model.presets`: Lua filters doing the per-request work
of Istio's metadata exchange and stats) are measured one by one and as the preset's chain,
each against the base sidecar in one Envoy per mode (:func:`meshtax.profile.filters.
profile_filters`: paired CPU rounds, fortio mean latency, callgrind instructions). Prints per
mode and size: the base sidecar's CPU and instructions per request, each variant's increment
(median and 95 % interval over paired rounds) and its share of the base; writes JSON.

    flock -w 5400 /run/meshtax-measure.lock nice -n 0 .venv/bin/python \
        benchmarks/bench_istio_preset.py --modes http,grpc --quick --out /tmp/istio-preset.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from meshtax.model.presets import ISTIO_DEFAULT, PRESETS
from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends
from meshtax.profile.filters import (
    FilterMeasurement,
    FilterRunOptions,
    differences,
    profile_filters,
)
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import RealSystem


def _row(name: str, d: FilterMeasurement) -> str:
    ipct = d.instructions_pct
    instr = "-" if d.instructions is None else f"{d.instructions:,.0f} ({ipct:.1f} %)"
    return (
        f"  {name:24s} CPU {d.cpu_us.median:7.2f} µs [{d.cpu_us.lo:6.2f}, {d.cpu_us.hi:6.2f}]"
        f" ({d.cpu_pct:5.1f} % of base)  latency {d.latency_us.median:7.2f} µs"
        f" [{d.latency_us.lo:6.2f}, {d.latency_us.hi:6.2f}]  Δ instr {instr}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="http,grpc")
    ap.add_argument("--sizes", default="100", help="comma list of request sizes (bytes)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--out", type=Path, required=True, help="result JSON")
    a = ap.parse_args(argv)
    opts = FilterRunOptions.quick() if a.quick else FilterRunOptions()
    opts = FilterRunOptions(
        **{
            **opts.__dict__,
            "sizes": tuple(int(s) for s in a.sizes.split(",")),
            **({"rounds": a.rounds} if a.rounds else {}),
        }
    )
    chain = PRESETS[ISTIO_DEFAULT]
    doc: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": platform.node(),
        "load_average_start": os.getloadavg(),
        "options": opts.to_dict(),
        "preset": {ISTIO_DEFAULT: list(chain)},
        "modes": {},
    }
    be = Backends()
    with Testbed(RealSystem(), lock_timeout=900.0) as tb:
        for m in a.modes.split(","):
            mode = Mode(m.strip())
            run = profile_filters(
                tb,
                be,
                mode,
                list(chain),
                opts,
                combos={ISTIO_DEFAULT: chain},
                progress=lambda msg: print("  " + msg, file=sys.stderr, flush=True),
            )
            doc["modes"][mode.value] = run.to_dict()
            for size, by in differences(run).items():
                base = next(iter(by.values()))
                instr = "-" if base.base_instructions is None else f"{base.base_instructions:,.0f}"
                print(
                    f"\n{mode.value} {size} B, per request through one sidecar: bare Envoy "
                    f"CPU {base.base_cpu_us:.2f} µs, latency {base.base_latency_us:.2f} µs, "
                    f"{instr} instructions"
                )
                for name in (*chain, ISTIO_DEFAULT):
                    print(_row(name, by[name]))
    doc["load_average_end"] = os.getloadavg()
    a.out.write_text(json.dumps(doc, indent=1, default=str))
    print(f"\nwritten {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
