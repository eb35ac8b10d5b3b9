"""Per-window, per-thread callgrind counts of one variant Envoy: where the run-to-run spread of
simulated misses per request comes from (issue #19).

    flock /run/meshtax-measure.lock .venv/bin/python experiments/microarch_windows.py \\
        --mode tcp --variants base --plan w50,c50,c250,c50,c250,i2,p250@50 --out FILE

A plan is a list of windows, each counted from the end of the one before: ``wN``/``cN`` N
closed-loop requests (one connection), ``iS`` S seconds idle, ``pN@R`` N requests at R/s,
``sN/T`` N closed-loop requests on one connection counted every T seconds while they run.
``--count PAIRS`` runs the profile's own counting instead, every window it reads logged.
Prints (and writes) one JSON line per window: its wall time and every thread's events.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from meshtax.model.microarch import metric
from meshtax.model.sidecar import Mode
from meshtax.profile.backends import Backends
from meshtax.profile.loopback import variant_envoy
from meshtax.profile.microarch import MicroarchOptions, count_mode
from meshtax.testbed.callgrind import CallgrindSpec
from meshtax.testbed.counters import Counted, CounterSource, Counts, WindowCounter
from meshtax.testbed.envoy.filters import parse_component
from meshtax.testbed.envoy.process import EnvoyProcess
from meshtax.testbed.envoy.variants import BASE, QUIET_ARGS, QUIET_TIMERS, filter_variants
from meshtax.testbed.fortio import LoadSpec, load_argv, run_spec
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import RealSystem, System
from meshtax.testbed.tools import tool

EVENTS = ("Ir", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw", "Bcm", "Bim")


@dataclass
class _Logged:
    """A window counter that writes every window it reads (time, each thread's events)."""

    inner: WindowCounter
    out: TextIO
    t_last: float = field(default_factory=time.monotonic)

    def zero(self) -> None:
        self.inner.zero()
        self.t_last = time.monotonic()

    def read(self) -> Counts:
        got = self.inner.read()
        now = time.monotonic()
        rec = {
            "wall_s": round(now - self.t_last, 3),
            "threads": {str(t): {e: ev.get(e, 0) for e in EVENTS} for t, ev in got.threads.items()},
        }
        self.t_last = now
        self.out.write(json.dumps(rec) + "\n")
        self.out.flush()
        return got

    def close(self) -> None:
        self.inner.close()


@dataclass(frozen=True)
class _LoggingSource:
    inner: CounterSource
    out: TextIO

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def callgrind(self) -> CallgrindSpec | None:
        return self.inner.callgrind

    def open(self, process: Counted, system: System, workdir: Path) -> WindowCounter:
        return _Logged(self.inner.open(process, system, workdir), self.out)

    def tool(self, system: System) -> str:
        return self.inner.tool(system)


def count(mode: Mode, comps: list[str], pairs: int, conns: int, out: TextIO) -> None:
    """The profile's own counting (quick windows, ``pairs`` pairs of ``conns`` connections
    each), every window logged."""
    be = Backends(lock_timeout=3600.0)
    opts = dataclasses.replace(MicroarchOptions.quick(), pairs=pairs, connections=conns)
    with Testbed(RealSystem(), lock_timeout=3600.0) as tb:
        src = _LoggingSource(be.counter_source(tb.system, "valgrind"), out)
        mc = count_mode(tb, be, mode, comps, src, opts)
    for r in mc.rows:
        d1 = [metric(p, "valgrind", "d1_misses") for p in r.pairs]
        print(r.variant, r.n1, r.n2, [None if x is None else round(x, 3) for x in d1])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="tcp", choices=[m.value for m in Mode])
    ap.add_argument("--variants", default=BASE, help="comma-separated; base and filters")
    ap.add_argument("--plan", default="w50,c50,c250,c50,c250")
    ap.add_argument("--repeat", type=int, default=1, help="the plan, this many times")
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--bootstrap", default="{}", help="JSON merged into Envoy's bootstrap")
    ap.add_argument(
        "--quiet",
        action="store_true",
        help="as the profile counts: its quiet timers and arguments, Envoy alone on CPU 1",
    )
    ap.add_argument("--args", default="", help="extra Envoy arguments, space-separated")
    ap.add_argument(
        "--count", type=int, metavar="PAIRS", help="the profile's own counting, PAIRS pairs"
    )
    ap.add_argument("--connections", type=int, default=1, help="--count: per window")
    a = ap.parse_args(argv)
    mode = Mode(a.mode)
    names = a.variants.split(",")
    comps = [n for n in names if n != BASE]
    for c in comps:
        parse_component(c)
    if a.count:
        if a.out is None:
            raise SystemExit("--count needs --out")
        with a.out.open("w") as f:
            count(mode, comps, a.count, a.connections, f)
        return 0
    extra = {**(QUIET_TIMERS if a.quiet else {}), **json.loads(a.bootstrap)}
    # an --args flush interval replaces the quiet one (Envoy takes an option once)
    own = "--file-flush-interval-msec" in a.args
    args = (*(QUIET_ARGS if a.quiet and not own else ()), *a.args.split())

    def envoy(system: Any, config: Any, *args: Any, **kw: Any) -> EnvoyProcess:
        return EnvoyProcess(system, {**config, **extra}, *args, **kw)

    be = Backends(lock_timeout=3600.0, envoy=envoy)
    fortio = tool("fortio")
    out = a.out.open("w") if a.out else None
    with Testbed(RealSystem(), lock_timeout=3600.0) as tb:
        src = be.counter_source(tb.system, "valgrind")

        def build(ports: Sequence[int], echo: tuple[str, int], d: Path) -> list[Any]:
            return filter_variants(mode, comps, ports, echo, outdir=d)

        with variant_envoy(
            tb,
            be,
            mode,
            build,
            len(comps) + 1,
            label="exp-windows",
            callgrind=src.callgrind or False,
            args=args,
            pin=a.quiet,
            alone=a.quiet,
        ) as ve:
            env = ve.env
            t_last = time.monotonic()
            v = names[0]

            def emit(step: str, n: int, rep: int) -> None:
                nonlocal t_last
                dumps = env.dump_threads()
                now = time.monotonic()
                rec = {
                    "variant": v,
                    "rep": rep,
                    "step": step,
                    "n": n,
                    "wall_s": round(now - t_last, 3),
                    "threads": {
                        str(t): {e: d.totals.get(e, 0) for e in EVENTS}
                        for t, d in sorted(dumps.items())
                    },
                }
                t_last = now
                line = json.dumps(rec)
                print(line, flush=True)
                if out:
                    out.write(line + "\n")
                    out.flush()

            for v in names:
                target = ve.target(v)
                env.zero()
                t_last = time.monotonic()
                for rep in range(a.repeat):
                    for step in a.plan.split(","):
                        kind, arg = step[0], step[1:]
                        n = 0
                        if kind in "wc":
                            n = int(arg)
                            ve.load(target, mode, a.size, n)
                        elif kind == "i":
                            time.sleep(float(arg))
                        elif kind == "s":
                            # one connection of N requests, dumped every T seconds while it runs
                            k, period = arg.split("/")
                            n = int(k)
                            spec = LoadSpec(target, mode, a.size, 0.0, n=n, timeout_s=30.0)
                            proc = subprocess.Popen(
                                load_argv(spec, fortio),
                                stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                            )
                            while proc.poll() is None:
                                time.sleep(float(period))
                                emit(f"{step}:part", 0, rep)
                            proc.wait()
                        elif kind == "p":
                            k, rate = arg.split("@")
                            n = int(k)
                            spec = LoadSpec(target, mode, a.size, float(rate), n=n, timeout_s=30.0)
                            run_spec(spec, tb.system, binary=fortio)
                        else:
                            raise SystemExit(f"unknown window {step!r}")
                        emit(step, n, rep)
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
