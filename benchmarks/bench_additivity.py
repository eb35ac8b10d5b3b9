"""Filter costs and their additivity: the paper's five combinations and the RBAC/IP-tag mixes.

Every catalogue filter and every combination is measured against the base sidecar in one
Envoy per mode (see :mod:`meshtax.profile.filterprof`): worker-thread CPU per request
(paired runs, 95 % interval), fortio mean latency, and callgrind instructions per request.
Additivity is reported two ways, both per request through one sidecar: **total** CPU
(predicted = base + Σ single-filter increments, measured = the sidecar with the chain; the
paper's Fig. 9 comparison, also per round with each run's adjacent base, median and 95 %
interval) and **increment** (Σ increments vs the chain's increment over base).
Prints a table per mode and writes everything as JSON (``--out``). Needs root only for
nothing (loopback), but Envoy, fortio and valgrind must be installed.

    .venv/bin/python benchmarks/bench_additivity.py --modes http,grpc --out /tmp/additivity.json
    .venv/bin/python benchmarks/bench_additivity.py --quick --filters fault_injection,rate_limit,tap,lua,wasm
    # the combinations' members only, many rounds, no callgrind: the total-CPU comparison
    .venv/bin/python benchmarks/bench_additivity.py --modes http --filters combos --rounds 15 --no-callgrind --equal-time
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from meshtax.model.sidecar import Mode
from meshtax.profile.filterprof import (
    FilterRunOptions,
    additivity,
    additivity_components,
    combos_for,
    differences,
    profile_filters,
    resolve_filters,
)
from meshtax.profile.system import RealSystem


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="http,grpc")
    ap.add_argument("--filters", default="all",
                    help="'all', 'combos' (the combinations' members) or a comma list of filters/components")
    ap.add_argument("--n", type=int, help="requests per run")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--no-callgrind", action="store_true")
    ap.add_argument("--equal-time", action="store_true", help="scale n down for slow variants (equal time per run)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/meshtax-additivity.json"))
    a = ap.parse_args(argv)
    opts = FilterRunOptions.quick() if a.quick else FilterRunOptions()
    if a.rounds:
        opts = FilterRunOptions(**{**opts.__dict__, "rounds": a.rounds})
    if a.n:
        opts = FilterRunOptions(**{**opts.__dict__, "n": a.n})
    if a.equal_time:
        opts = FilterRunOptions(**{**opts.__dict__, "equal_time": True})
    if a.no_callgrind:
        opts = FilterRunOptions(**{**opts.__dict__, "callgrind": False})
    modes = [Mode(m) for m in a.modes.split(",")]
    chosen = {"all": "all", "combos": additivity_components()}.get(a.filters) or a.filters.split(",")
    wanted = resolve_filters(chosen, modes)
    doc: dict[str, object] = {
        "command": " ".join(sys.argv),
        "machine": platform.node(),
        "load_average_start": os.getloadavg(),
        "options": opts.to_dict(),
        "modes": {},
    }
    for mode in modes:
        comps = wanted[mode]
        combos = combos_for(mode, comps)
        t = time.time()
        run = profile_filters(mode, comps, opts, RealSystem(), combos=combos,
                              progress=lambda m: print("  " + m, file=sys.stderr, flush=True))  # fmt: skip
        diffs = differences(run)
        rows = additivity(run, combos)
        doc["modes"][mode.value] = {  # type: ignore[index]
            "wall_s": time.time() - t,
            "run": run.to_dict(),
            "filters": {str(s): {n: m.to_dict() for n, m in d.items()} for s, d in diffs.items()},
            "additivity": [r.to_dict() for r in rows],
        }
        for size, d in diffs.items():
            print(f"\n{mode.value}, {size} B, per request through one sidecar (CPU: worker thread, µs; 95 % CI)")
            print(f"{'variant':34s} {'CPU µs':>26s} {'%':>6s} {'latency µs':>26s} {'instr/req':>10s} {'%':>6s}")
            for n, m in d.items():
                ip = m.instructions_pct
                print(f"{n:34s} {m.cpu_us.median:8.2f} [{m.cpu_us.lo:7.2f},{m.cpu_us.hi:7.2f}] {m.cpu_pct:6.1f} "
                      f"{m.latency_us.median:8.2f} [{m.latency_us.lo:7.2f},{m.latency_us.hi:7.2f}] "
                      f"{(m.instructions or 0):10.0f} {(ip if ip is not None else float('nan')):6.1f}")  # fmt: skip
        print(f"\n{mode.value}: additivity, total CPU per request through one sidecar (µs): "
              "predicted = base + Σ increments vs measured with the chain; per-round error with 95 % CI")
        for r in rows:
            tot, tr = r.measured_total_cpu_us, r.total_error_rounds
            te = r.total_error
            if tot is None or te is None or tr is None:
                continue
            print(f"  {r.name:34s} {r.predicted_total_cpu_us:8.1f} vs {tot.median:8.1f} [{tot.lo:.1f},{tot.hi:.1f}] "
                  f"{100 * te:+6.1f}%  rounds {100 * tr.median:+6.1f}% [{100 * tr.lo:+.1f},{100 * tr.hi:+.1f}]")  # fmt: skip
        print(f"\n{mode.value}: additivity, increment over base (Σ singles vs the chain's increment)")
        for r in rows:
            ie = r.instructions_error
            print(f"  {r.name:34s} CPU {r.predicted_cpu_us:8.2f} vs {r.measured_cpu_us.median:8.2f} "
                  f"[{r.measured_cpu_us.lo:.2f},{r.measured_cpu_us.hi:.2f}] ({100 * r.cpu_error:+6.1f}%)  "
                  f"instr {r.predicted_instructions or 0:9.0f} vs {r.measured_instructions or 0:9.0f} "
                  f"({100 * ie if ie is not None else float('nan'):+6.2f}%)")  # fmt: skip
    doc["load_average_end"] = os.getloadavg()
    a.out.write_text(json.dumps(doc, indent=1))
    print(f"\nwritten {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
