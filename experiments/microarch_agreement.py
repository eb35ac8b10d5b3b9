"""Run-to-run agreement of the microarchitectural counts for one mode and a chosen set of
filters: the profile's own counting (:func:`~meshtax.profile.microarch.count_mode` with
``MicroarchOptions.quick()``, the combinations of the filters added as ``profile --microarch``
adds them) run twice back to back, every window logged, then per item both runs' counts per
request and their difference against the issue's bounds (issue #19).

    .venv/bin/python experiments/microarch_agreement.py --mode http \\
        --variants header_mutation,rate_limit,ip_tagging_1 --out artifacts/i19/http.json

``--variants default``: the mode's share of ``profile --microarch``'s default set.
``--resolve-s S``: seconds a row may spend counted again where its pairs leave a compared
count unresolved (default: the quick profile's 200). ``--runs N`` counts N times;
``--no-pin`` leaves client, echo app and Envoy unpinned (the profile pins Envoy alone on
CPU 1); ``--cap PCT`` runs the counts inside a cgroup-v1 CPU quota
of PCT % of one CPU, with ``--cap-runs`` saying which runs (e.g. ``2``): the contention check
of gRPC's counts (a run capped by another session's quiet measurement came out up to 3 %
above an uncapped one). ``benchmarks/bench_microarch.py`` does the same through the CLI; this
one logs every window and keeps its testbed state
in ``--state-dir`` (default ``/run/meshtax-microarch``), not ``/run/meshtax``: a valgrind-only
loopback count that does not hold the machine's profiling lock for its whole length (the
machine-wide index keeps every live run's namespaces apart). Writes ``OUT`` (agreement,
additivity, ratios), ``OUT``-rows-N.json (each run's rows) and ``OUT``-windows-N.jsonl (each
window's per-thread events).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from microarch_windows import _LoggingSource

from meshtax.model.microarch import Microarch, metric
from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends
from meshtax.profile.microarch import (
    DEFAULT_FILTERS,
    MicroarchOptions,
    combos_for,
    count_mode,
    pinned,
)
from meshtax.report.microarch import additivity, agreement, published_ratios
from meshtax.testbed.envoy.filters import modes_for, parse_component
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import RealSystem


def count_once(
    mode: Mode, comps: list[str], opts: MicroarchOptions, state: Path, log: Path
) -> Microarch:
    be = Backends(state_dir=state, lock_timeout=600.0)
    with log.open("w") as f, Testbed(RealSystem(), state_dir=state, lock_timeout=600.0) as tb:
        src = _LoggingSource(be.counter_source(tb.system, "valgrind"), f)
        mc = count_mode(
            tb, be, mode, comps, src, opts, combos=combos_for(mode, comps), progress=print
        )
        tool = src.tool(tb.system)
    return Microarch("valgrind", tool, tuple(mc.rows), mc.geometry)


CGROUP = Path("/sys/fs/cgroup/cpu")


def cap(pct: float | None, name: str = "mtx-h19-cap") -> None:
    """Move this process (and what it spawns from now on) into a cgroup-v1 CPU quota of
    ``pct`` % of one CPU; None: back to the root cgroup."""
    if pct is None:
        (CGROUP / "cgroup.procs").write_text(str(os.getpid()))
        return
    d = CGROUP / name
    d.mkdir(exist_ok=True)
    (d / "cpu.cfs_period_us").write_text("100000")
    (d / "cpu.cfs_quota_us").write_text(str(int(pct * 1000)))
    (d / "cgroup.procs").write_text(str(os.getpid()))


def _row_info(m: Microarch, mode: str, variant: str, size: int, name: str) -> dict[str, Any]:
    """The row's counting rounds, whether ``name`` stayed unresolved, its first round's count
    (the median of that round's pairs, when the row was counted again)."""
    r = m.row(mode, variant, size)
    if r is None:
        return {"rounds": [], "unresolved": False, "first": None}
    first = None
    if r.earlier:
        vals = [v for p in r.earlier[0] if (v := metric(p, m.source, name)) is not None]
        first = round(float(statistics.median(vals)), 3) if vals else None
    return {
        "rounds": [list(x) for x in r.rounds],
        "unresolved": name in r.unresolved,
        "first": first,
    }


def compared(a: Microarch, b: Microarch) -> dict[str, Any]:
    """Every item of two runs, with each row's rounds (``[n1, n2]`` a round), whether the
    item stayed unresolved and its first round's count, per run."""
    items = agreement(a, b)
    info = [[_row_info(m, x.mode, x.variant, x.size, x.metric) for m in (a, b)] for x in items]
    return {
        "items": [
            {
                "variant": x.variant,
                "metric": x.metric,
                "a": round(x.a, 3),
                "b": round(x.b, 3),
                "rel": None if x.rel is None else round(x.rel, 5),
                "spread": None if x.spread is None else round(x.spread, 5),
                "ok": x.ok,
                "rounds": [i["rounds"] for i in ii],
                "unresolved": [i["unresolved"] for i in ii],
                "first": [i["first"] for i in ii],
            }
            for x, ii in zip(items, info)
        ],
        "beyond_bound": sum(not x.ok for x in items),
        "compared": sum(x.rel is not None for x in items),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="http", choices=[m.value for m in Mode])
    ap.add_argument(
        "--variants",
        required=True,
        help="comma-separated filters (base is added); default: the profile's default set",
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--state-dir", type=Path, default=Path("/run/meshtax-microarch"))
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--no-pin", action="store_true", help="leave every process unpinned")
    ap.add_argument("--cap", type=float, help="CPU quota, %% of one CPU, for --cap-runs")
    ap.add_argument("--cap-runs", default="", help="comma-separated run numbers to cap")
    ap.add_argument(
        "--resolve-s",
        type=float,
        help="seconds a row may spend counted again (default: the quick profile's)",
    )
    a = ap.parse_args(argv)
    mode = Mode(a.mode)
    if a.variants == "default":
        comps = [c for c in DEFAULT_FILTERS if mode in modes_for(parse_component(c)[0])]
    else:
        comps = [c for c in a.variants.split(",") if c]
    for c in comps:
        parse_component(c)
    opts = dataclasses.replace(MicroarchOptions.quick(), pin=not a.no_pin)
    if a.resolve_s is not None:
        opts = dataclasses.replace(opts, resolve_s=a.resolve_s)
    capped = {int(x) for x in a.cap_runs.split(",") if x}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    ms: list[Microarch] = []
    for i in range(1, a.runs + 1):
        quota = a.cap if i in capped else None
        if a.cap is not None:
            cap(quota)
        load0 = os.getloadavg()[0]
        t0 = time.monotonic()
        m = count_once(
            mode, comps, opts, a.state_dir, a.out.with_name(f"{a.out.stem}-windows-{i}.jsonl")
        )
        runs.append(
            {
                "run": i,
                "wall_s": round(time.monotonic() - t0, 1),
                "end": time.strftime("%FT%TZ", time.gmtime()),
                "pinned": pinned(opts),
                "cap_pct": quota,
                "load": [round(load0, 2), round(os.getloadavg()[0], 2)],
            }
        )
        a.out.with_name(f"{a.out.stem}-rows-{i}.json").write_text(json.dumps(m.to_dict(), indent=1))
        ms.append(m)
        print(json.dumps(runs[-1]), flush=True)
    res = {
        "mode": mode.value,
        "filters": comps,
        "options": opts.to_dict(),
        "runs": runs,
        "agreement": compared(ms[0], ms[1]) if len(ms) > 1 else None,
        "agreement_pairs": {
            f"{i}-{j}": compared(ms[i - 1], ms[j - 1])
            for i in range(1, len(ms) + 1)
            for j in range(i + 1, len(ms) + 1)
        },
        "additivity": [
            [(x.chain, round(x.error, 5), round(x.increment_error, 4)) for x in additivity(m)]
            for m in ms
        ],
        "ratios": [
            [(p, round(here, 4), pub) for p, _v, here, pub in published_ratios(m)] for m in ms
        ],
    }
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
