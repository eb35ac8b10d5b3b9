"""What makes the counting Envoy slow to start under valgrind (issue #19): for each group of
variants, the multi-variant Envoy is started the way ``profile --microarch`` starts it
(callgrind with the cache and branch simulators, threads apart, quiet timers) and the
seconds until admin ``/ready`` says LIVE and the instructions valgrind simulated until then
(per thread) are printed, one JSON line per group.

    /work/quiet-measure.sh env PYTHONPATH=$PWD/src .venv/bin/python \\
        experiments/microarch_startup.py --mode http --groups base wasm rbac_http_10000 \\
        --out artifacts/i19/startup.jsonl

A group is a comma-separated list of components (``base`` alone: the base variant only;
every group has it); ``+combos`` at the end of a group adds the combinations of its members
as ``profile --microarch`` does. Testbed state in ``--state-dir`` (not the machine's
profiling lock). Each Envoy is given ``--timeout`` seconds to become LIVE.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshtax.model.microarch import metric
from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends
from meshtax.profile.loopback import variant_envoy
from meshtax.profile.microarch import combos_for
from meshtax.testbed.envoy.filters import parse_component
from meshtax.testbed.envoy.process import EnvoyProcess
from meshtax.testbed.envoy.variants import BASE, QUIET_TIMERS, filter_variants
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import RealSystem


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="http", choices=[m.value for m in Mode])
    ap.add_argument("--groups", nargs="+", required=True)
    ap.add_argument("--timeout", type=float, default=1500.0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--state-dir", type=Path, default=Path("/run/meshtax-microarch"))
    a = ap.parse_args(argv)
    mode = Mode(a.mode)

    def envoy(*args: Any, **kw: Any) -> EnvoyProcess:
        return EnvoyProcess(*args, **kw, start_timeout=a.timeout)

    be = Backends(state_dir=a.state_dir, lock_timeout=600.0, envoy=envoy)
    out = a.out.open("a") if a.out else None
    for g in a.groups:
        with_combos = g.endswith("+combos")
        comps = [c for c in g.removesuffix("+combos").split(",") if c and c != BASE]
        for c in comps:
            parse_component(c)
        combos = combos_for(mode, comps) if with_combos else {}

        def build(ports: Sequence[int], echo: tuple[str, int], d: Path) -> list[Any]:
            return filter_variants(mode, comps, ports, echo, combos=combos, outdir=d)  # noqa: B023

        with Testbed(RealSystem(), state_dir=a.state_dir, lock_timeout=600.0) as tb:
            src = be.counter_source(tb.system, "valgrind")
            t0 = time.monotonic()
            with variant_envoy(
                tb,
                be,
                mode,
                build,
                1 + len(comps) + len(combos),
                label="exp-startup",
                callgrind=src.callgrind or False,
                bootstrap=QUIET_TIMERS,
            ) as ve:
                live = time.monotonic() - t0
                dumps = ve.env.dump_threads()
        threads = {
            str(t): metric(dict(d.totals), "valgrind", "instructions") for t, d in dumps.items()
        }
        total = sum(x or 0.0 for x in threads.values())
        rec = {
            "mode": mode.value,
            "group": g,
            "variants": 1 + len(comps) + len(combos),
            "live_s": round(live, 1),
            "instructions": total,
            "per_s": round(total / live),
            "threads": threads,
            "at": time.strftime("%FT%TZ", time.gmtime()),
        }
        line = json.dumps(rec)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
