"""Filter costs and their additivity: the paper's five combinations and the RBAC/IP-tag mixes.

Every catalogue filter and every combination is measured against the base sidecar in one
Envoy per mode (see :mod:`meshtax.profile.filters`): worker-thread CPU per request
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
    .venv/bin/python benchmarks/bench_additivity.py --modes http --filters combos --rounds 15 \
        --no-callgrind --equal-time
    # paired blocks (the current additivity design): chunks of ≤ 10 min under the lock, merged
    flock /run/meshtax-measure.lock .venv/bin/python benchmarks/bench_additivity.py --paired --modes http \
        --budget-s 540 --out /tmp/add-http.json --append
    .venv/bin/python benchmarks/bench_additivity.py --report /tmp/add-http.json /tmp/add-grpc.json

``--paired``: per round, one block per combination: base, each member and the chain run back
to back in a palindrome (:func:`meshtax.testbed.paired.group_order`), so each combination
is compared with its own singles and base measured seconds apart; error per block, median
and 95 % interval over blocks. ``--append`` adds this chunk's blocks to ``--out`` (rounds
continue the rotation); ``--report`` merges files and prints the table (no measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from meshtax.model.sidecar import Mode
from meshtax.profile.additivity import Block, additivity, block_additivity, profile_blocks
from meshtax.profile.backends import Backends
from meshtax.profile.filters import (
    FilterRunOptions,
    additivity_components,
    combos_for,
    differences,
    profile_filters,
    resolve_filters,
)
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import RealSystem


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="http,grpc")
    ap.add_argument(
        "--filters",
        default="all",
        help="'all', 'combos' (the combinations' members) or a comma list of filters/components",
    )
    ap.add_argument("--n", type=int, help="requests per run")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--no-callgrind", action="store_true")
    ap.add_argument(
        "--equal-time",
        action="store_true",
        help="scale n down for slow variants (equal time per run)",
    )
    ap.add_argument("--out", type=Path, default=Path("/tmp/meshtax-additivity.json"))
    ap.add_argument(
        "--paired", action="store_true", help="paired blocks per combination (see above)"
    )
    ap.add_argument(
        "--pin", action="store_true", help="--paired: client on CPU 0, Envoy and app on CPU 1"
    )
    ap.add_argument(
        "--budget-s", type=float, help="--paired: stop before a block would overrun this"
    )
    ap.add_argument(
        "--append", action="store_true", help="--paired: add this chunk's blocks to --out"
    )
    ap.add_argument(
        "--report", type=Path, nargs="+", help="merge these --paired outputs and print the table"
    )
    a = ap.parse_args(argv)
    if a.report:
        print(report(merge([json.loads(p.read_text()) for p in a.report])))
        return 0
    opts = FilterRunOptions.quick() if a.quick else FilterRunOptions()
    if a.rounds:
        opts = FilterRunOptions(**{**opts.__dict__, "rounds": a.rounds})
    if a.n:
        opts = FilterRunOptions(**{**opts.__dict__, "n": a.n})
    if a.equal_time:
        opts = FilterRunOptions(**{**opts.__dict__, "equal_time": True})
    if a.no_callgrind:
        opts = FilterRunOptions(**{**opts.__dict__, "callgrind": False})
    if a.pin:
        opts = FilterRunOptions(**{**opts.__dict__, "pin": True})
    modes = [Mode(m) for m in a.modes.split(",")]
    if a.paired:
        return paired(a, opts, modes)
    chosen = {"all": "all", "combos": additivity_components()}.get(a.filters) or a.filters.split(
        ","
    )
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
        with Testbed(RealSystem(), lock_timeout=900.0) as tb:
            run = profile_filters(
                tb,
                Backends(),
                mode,
                comps,
                opts,
                combos=combos,
                progress=lambda m: print("  " + m, file=sys.stderr, flush=True),
            )
        diffs = differences(run)
        rows = additivity(run, combos)
        doc["modes"][mode.value] = {  # type: ignore[index]
            "wall_s": time.time() - t,
            "run": run.to_dict(),
            "filters": {str(s): {n: m.to_dict() for n, m in d.items()} for s, d in diffs.items()},
            "additivity": [r.to_dict() for r in rows],
        }
        for size, d in diffs.items():
            print(
                f"\n{mode.value}, {size} B, per request through one sidecar (CPU: worker thread, µs; 95 % CI)"
            )
            print(
                f"{'variant':34s} {'CPU µs':>26s} {'%':>6s} {'latency µs':>26s} {'instr/req':>10s} {'%':>6s}"
            )
            for n, m in d.items():
                ip = m.instructions_pct
                print(
                    f"{n:34s} {m.cpu_us.median:8.2f} [{m.cpu_us.lo:7.2f},{m.cpu_us.hi:7.2f}] {m.cpu_pct:6.1f} "
                    f"{m.latency_us.median:8.2f} [{m.latency_us.lo:7.2f},{m.latency_us.hi:7.2f}] "
                    f"{(m.instructions or 0):10.0f} {(ip if ip is not None else float('nan')):6.1f}"
                )
        print(
            f"\n{mode.value}: additivity, total CPU per request through one sidecar (µs): "
            "predicted = base + Σ increments vs measured with the chain; per-round error with 95 % CI"
        )
        for r in rows:
            tot, tr = r.measured_total_cpu_us, r.total_error_rounds
            te = r.total_error
            if tot is None or te is None or tr is None:
                continue
            print(
                f"  {r.name:34s} {r.predicted_total_cpu_us:8.1f} vs {tot.median:8.1f} [{tot.lo:.1f},{tot.hi:.1f}] "
                f"{100 * te:+6.1f}%  rounds {100 * tr.median:+6.1f}% [{100 * tr.lo:+.1f},{100 * tr.hi:+.1f}]"
            )
        print(
            f"\n{mode.value}: additivity, increment over base (Σ singles vs the chain's increment)"
        )
        for r in rows:
            ie = r.instructions_error
            print(
                f"  {r.name:34s} CPU {r.predicted_cpu_us:8.2f} vs {r.measured_cpu_us.median:8.2f} "
                f"[{r.measured_cpu_us.lo:.2f},{r.measured_cpu_us.hi:.2f}] ({100 * r.cpu_error:+6.1f}%)  "
                f"instr {r.predicted_instructions or 0:9.0f} vs {r.measured_instructions or 0:9.0f} "
                f"({100 * ie if ie is not None else float('nan'):+6.2f}%)"
            )
    doc["load_average_end"] = os.getloadavg()
    a.out.write_text(json.dumps(doc, indent=1))
    print(f"\nwritten {a.out}")
    return 0


def paired(a: argparse.Namespace, opts: FilterRunOptions, modes: list[Mode]) -> int:
    """One chunk of paired blocks per mode, appended to ``--out`` when asked."""
    doc: dict[str, Any] = (
        json.loads(a.out.read_text())
        if a.append and a.out.exists()
        else {"kind": "paired-blocks", "modes": {}}
    )
    budget = a.budget_s / len(modes) if a.budget_s else None
    for mode in modes:
        comps = resolve_filters(additivity_components(), [mode])[mode]
        combos = combos_for(mode, comps)
        m = doc["modes"].setdefault(mode.value, {"chunks": [], "blocks": []})
        first = 1 + max((int(b["round"]) for b in m["blocks"]), default=-1)
        chunk = {
            "command": " ".join(sys.argv),
            "machine": platform.node(),
            "utc_start": _utc(),
            "load_average_start": os.getloadavg(),
            "options": opts.to_dict(),
            "budget_s": budget,
        }
        t = time.time()
        with Testbed(RealSystem(), lock_timeout=900.0) as tb:
            blocks = profile_blocks(
                tb,
                Backends(),
                mode,
                combos,
                opts,
                budget_s=budget,
                first_round=first,
                progress=lambda s: print("  " + s, file=sys.stderr, flush=True),
            )
        chunk.update(
            utc_end=_utc(),
            load_average_end=os.getloadavg(),
            wall_s=time.time() - t,
            blocks=len(blocks),
            rounds=sorted({b.round for b in blocks}),
        )
        m["chunks"].append(chunk)
        m["blocks"].extend(b.to_dict() for b in blocks)
        a.out.write_text(
            json.dumps(doc, indent=1)
        )  # after every mode: a killed run keeps what it had
    print(report(doc))
    print(f"\nwritten {a.out}")
    return 0


def _utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several ``--paired`` outputs as one (chunks and blocks concatenated per mode)."""
    out: dict[str, Any] = {"kind": "paired-blocks", "modes": {}}
    for d in docs:
        if d.get("kind") != "paired-blocks":
            raise SystemExit("--report reads --paired outputs only")
        for mode, m in d["modes"].items():
            o = out["modes"].setdefault(mode, {"chunks": [], "blocks": []})
            o["chunks"] += m["chunks"]
            o["blocks"] += m["blocks"]
    return out


def report(doc: dict[str, Any]) -> str:
    """A markdown table per mode: every combination, predicted vs measured, error and its CI."""
    lines = []
    for mode, m in doc["modes"].items():
        rows = block_additivity([Block.from_dict(b) for b in m["blocks"]])
        lines.append(
            f"\n{mode}: {len(m['blocks'])} blocks in {len(m['chunks'])} chunks; "
            + "; ".join(
                f"{c['utc_start']}–{c['utc_end']} load {c['load_average_start'][0]:.2f}→{c['load_average_end'][0]:.2f}"
                for c in m["chunks"]
            )
        )
        lines.append(
            "| combination | blocks | base µs | predicted total µs [95 % CI] | measured total µs [95 % CI] "
            "| **error per block** [95 % CI] | increment Σ vs measured µs |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            p, c, e = r.predicted_us, r.chain_us, r.error
            lines.append(
                f"| {r.name} | {r.blocks} | {r.base_us.median:.0f} | {p.median:.0f} [{p.lo:.0f}, {p.hi:.0f}] "
                f"| {c.median:.0f} [{c.lo:.0f}, {c.hi:.0f}] | **{100 * e.median:+.1f} %** "
                f"[{100 * e.lo:+.1f}, {100 * e.hi:+.1f}] | {r.increment_predicted_us:.1f} vs "
                f"{r.increment_measured_us:.1f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
