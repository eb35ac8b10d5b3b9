"""A validation suite's kept runs predicted with a schedule of each request on its one shared
CPU, instead of the engine's bound (all of a request's mesh work queues): offline, nothing is
measured. Issue #14's lead for the tcp-mode latency misses (BENCHMARKS.md, "Where a shared
CPU's mesh work hides").

Each traced request is replayed twice on one processor-sharing CPU, without and with the mesh:

* an invocation is its request crossings (the mesh's CPU, half of the call's), its body, then
  its response crossings (the other half);
* its body follows the no-mesh trace: its own time between children, then each group of
  overlapping children in parallel, in the order they started;
* its own time is CPU for the share its service's measured no-mesh CPU per request covers
  (``cpu_ns`` of the no-mesh runs, per service) and a wait (I/O, a sleep) for the rest; a wait
  leaves the CPU to whatever else is runnable.

The predicted overhead of a request is its replayed latency with the mesh minus without; the
case's is the p50 over its requests (as the engine's). Variants (fifth sitting): ``--wake`` (a
crossing's profiled latency beyond its CPU as a wait: the profile's latency is below its CPU
for every crossing, so it changes nothing), ``--tail`` (a crossing's CPU beyond its profiled
latency runs after forwarding, detached from the path, still sharing the CPU), ``--priority``
(that detached work only while nothing on the path is runnable), ``--hybrid`` (the engine's
prediction less the work the schedule hides in waits). None beats the engine over runs 4–6
(BENCHMARKS.md, "Where a shared CPU's mesh work hides"). Usage::

    .venv/bin/python experiments/shared_cpu_schedule.py RUN/run --db DB --profile NAME
"""

from __future__ import annotations

import argparse
import heapq
import statistics
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from meshtax.model.ecg import EcgBatch
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.engine import hop_costs, idle_vcpu, single_profile
from meshtax.predict.shared_cpu import shared_cpu_rates
from meshtax.store.sqlite import ProfileStore
from meshtax.traces import SpanOptions, load_traces
from meshtax.validate.result import CaseResult
from meshtax.validate.suite_run import SuiteDir, calibrate

Op = tuple[str, Any]  # ("cpu", µs) | ("wait", µs) | ("par", [generators])


@dataclass
class Task:
    gen: Generator[Op, None, None]
    parent: Task | None = None
    left: int = 0  # children still running (a "par" in progress)
    cpu: float = 0.0  # CPU µs left of the current "cpu" op
    done: bool = False
    kids: list[Task] = field(default_factory=list)
    detached: bool = False  # work after forwarding (``spawn``), off the request's path


def _nothing() -> Generator[Op, None, None]:
    """A task with no operations after its CPU work."""
    yield from ()


def replay(root: Generator[Op, None, None], capacity: float = 1.0, priority: bool = False) -> float:
    """Run ``root`` on one processor-sharing CPU of which ``capacity`` is free for it (the
    rest busy with background work); its completion time (µs). ``priority``: detached work
    runs only while nothing on the request's path is runnable."""
    now = 0.0
    running: list[Task] = []  # tasks with CPU left, sharing the CPU
    timers: list[tuple[float, int, Task]] = []
    seq = 0
    top = Task(root)

    def advance(t: Task) -> None:
        nonlocal seq
        while True:
            try:
                op, arg = next(t.gen)
            except StopIteration:
                t.done = True
                p = t.parent
                if p is not None:
                    p.left -= 1
                    if p.left == 0:
                        advance(p)
                return
            if op == "cpu":
                if arg > 0:
                    t.cpu = arg
                    running.append(t)
                    return
            elif op == "wait":
                if arg > 0:
                    seq += 1
                    heapq.heappush(timers, (now + arg, seq, t))
                    return
            elif op == "spawn":  # detached CPU work (a sidecar's after forwarding)
                if arg > 0:
                    running.append(Task(_nothing(), cpu=arg, detached=True))
            elif op == "par":
                kids = [Task(g, parent=t) for g in arg]
                if kids:
                    t.left = len(kids)
                    for k in kids:
                        advance(k)
                    if t.left > 0:
                        return

    advance(top)
    while not top.done:
        active = running
        if priority and any(not x.detached for x in running):
            active = [x for x in running if not x.detached]
        n = len(active)
        t_cpu = min(x.cpu for x in active) * n / capacity if n else np.inf  # first to finish
        t_timer = timers[0][0] - now if timers else np.inf
        dt = min(t_cpu, t_timer)
        if not np.isfinite(dt):
            raise RuntimeError("replay stuck: nothing runnable")
        now += dt
        if n:
            share = dt * capacity / n
            for x in active:
                x.cpu -= share
            finished = [x for x in running if x.cpu <= 1e-9]
            running[:] = [x for x in running if x.cpu > 1e-9]
            for x in finished:
                advance(x)
        while timers and timers[0][0] <= now + 1e-9:
            _, _, x = heapq.heappop(timers)
            advance(x)
    return now


def program(
    b: EcgBatch,
    row: int,
    kids: dict[int, list[int]],
    frac: np.ndarray,
    mesh: np.ndarray,
    lam: float = 1.0,
    wake: np.ndarray | None = None,
    tail: np.ndarray | None = None,
) -> Generator[Op, None, None]:
    """One invocation as operations: request crossings, body, response crossings; ``lam``
    scales the waits (the part of a service's own time its CPU does not cover); ``wake``: per
    row, the crossings' latency beyond their CPU (wake-ups), a wait on the path."""
    w = 0.0 if wake is None else float(wake[row]) / 2
    on = mesh[row] / 2 if tail is None else (mesh[row] - tail[row]) / 2
    off = 0.0 if tail is None else float(tail[row]) / 2
    yield ("cpu", on)
    yield ("spawn", off)
    yield ("wait", w)
    t0 = float(b.start_us[row])
    cursor = t0
    f = float(frac[b.callee[row]]) if b.callee[row] >= 0 else 1.0

    def own(gap: float) -> Generator[Op, None, None]:
        if gap <= 0:
            return
        yield ("cpu", f * gap / 2)
        yield ("wait", lam * (1 - f) * gap)
        yield ("cpu", f * gap / 2)

    ch = sorted(kids.get(row, []), key=lambda r: (b.start_us[r], r))
    k = 0
    while k < len(ch):
        group = [ch[k]]
        end = float(b.start_us[ch[k]] + b.duration_us[ch[k]])
        k += 1
        while k < len(ch) and b.start_us[ch[k]] < end:  # overlaps the group: parallel
            group.append(ch[k])
            end = max(end, float(b.start_us[ch[k]] + b.duration_us[ch[k]]))
            k += 1
        yield from own(float(b.start_us[group[0]]) - cursor)
        yield ("par", [program(b, r, kids, frac, mesh, lam, wake, tail) for r in group])
        cursor = max(cursor, end)
    yield from own(t0 + float(b.duration_us[row]) - cursor)
    yield ("wait", w)
    yield ("cpu", on)
    yield ("spawn", off)


def replay_graph(
    b: EcgBatch,
    roots: Sequence[int],
    kids: dict[int, list[int]],
    frac: np.ndarray,
    mesh: np.ndarray,
    lam: float,
    capacity: float,
    wake: np.ndarray | None = None,
    tail: np.ndarray | None = None,
    priority: bool = False,
) -> float:
    """One request (its root invocations in parallel) replayed on the CPU."""

    def top() -> Generator[Op, None, None]:
        yield ("par", [program(b, r, kids, frac, mesh, lam, wake, tail) for r in roots])

    return replay(top(), capacity, priority)


def replays(
    b: EcgBatch,
    mesh_cpu: np.ndarray,
    cpu_per_req: dict[str, float],
    busy: tuple[np.ndarray, np.ndarray],
    fit_waits: bool = False,
    wake: np.ndarray | None = None,
    tail: np.ndarray | None = None,
    priority: bool = False,
) -> tuple[list[float], list[float]]:
    """Per graph: replayed latency (µs) without and with the mesh; ``busy``: per graph, the
    shared CPU's load from other work (CPU-s/s) without and with the mesh."""
    base: list[float] = []
    meshed: list[float] = []
    for g in range(b.n_graphs):
        lo, hi = int(b.graph_ptr[g]), int(b.graph_ptr[g + 1])
        kids: dict[int, list[int]] = {}
        roots: list[int] = []
        for r in range(lo, hi):
            p = int(b.parent[r])
            (kids.setdefault(p, []) if p >= 0 else roots).append(r)
        # own time per service in this request: duration minus the union of its children
        own = np.zeros(len(b.services))
        for r in range(lo, hi):
            iv = sorted(
                (float(b.start_us[c]), float(b.start_us[c] + b.duration_us[c]))
                for c in kids.get(r, [])
            )
            covered, cur_s, cur_e = 0.0, 0.0, -np.inf
            for s, e in iv:  # the union of the children's intervals
                if s > cur_e:
                    covered += max(cur_e - cur_s, 0.0)
                    cur_s, cur_e = s, e
                else:
                    cur_e = max(cur_e, e)
            covered += max(cur_e - cur_s, 0.0)
            if b.callee[r] >= 0:
                own[b.callee[r]] += max(float(b.duration_us[r]) - covered, 0.0)
        cpu = np.array([cpu_per_req.get(s, 0.0) for s in b.services])
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.clip(np.where(own > 0, cpu / own, 1.0), 0.0, 1.0)

        def run(
            mesh: np.ndarray,
            load: float,
            lam: float,
            roots: list[int] = roots,
            kids: dict[int, list[int]] = kids,
            frac: np.ndarray = frac,
        ) -> float:
            on = bool(np.any(mesh))  # the meshed replay
            return replay_graph(
                b,
                roots,
                kids,
                frac,
                mesh,
                lam,
                max(1.0 - load, 0.05),
                wake if on else None,
                tail if on else None,
                priority,
            )

        zero = np.zeros_like(mesh_cpu)
        lam = 1.0
        if fit_waits:
            # the waits that make the replay without the mesh as long as the trace: own time
            # its CPU does not cover is partly the CPU's other work (parallel calls queue on
            # one CPU), not I/O; scale it to the trace's latency
            target = max(float(b.start_us[r] + b.duration_us[r]) for r in roots) - min(
                float(b.start_us[r]) for r in roots
            )
            lo_l, hi_l = 0.0, 1.0
            if run(zero, float(busy[0][g]), 1.0) > target:
                for _ in range(12):
                    mid = (lo_l + hi_l) / 2
                    if run(zero, float(busy[0][g]), mid) > target:
                        hi_l = mid
                    else:
                        lo_l = mid
                lam = (lo_l + hi_l) / 2
        base.append(run(zero, float(busy[0][g]), lam))
        meshed.append(run(mesh_cpu, float(busy[1][g]), lam))
    return base, meshed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a suite run's directory (bench_suite --out)")
    ap.add_argument("--db", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument(
        "--background",
        choices=("none", "idle", "idle-work", "load"),
        default="none",
        help="the shared CPU's other work: none; the idle sidecars' CPU (mesh only) as a "
        "background load; it as the request's own work (its share: per second ÷ the rate, as "
        "the engine's bound counts it); the idle sidecars and the other requests' CPU at the "
        "case's rate (processor sharing's mean load)",
    )
    ap.add_argument(
        "--wake",
        action="store_true",
        help="a crossing's profiled latency beyond its CPU (wake-ups, notification) is a wait "
        "on the request's path",
    )
    ap.add_argument(
        "--tail",
        action="store_true",
        help="a crossing's CPU beyond its profiled latency runs after forwarding, off the "
        "request's path (still on the shared CPU)",
    )
    ap.add_argument(
        "--hybrid",
        action="store_true",
        help="the engine's prediction less the median mesh work the schedule hides in waits",
    )
    ap.add_argument(
        "--priority",
        action="store_true",
        help="with --tail: the work after forwarding runs only when nothing on the path is "
        "runnable (a woken task preempts it, as CFS's wake-up preemption does)",
    )
    ap.add_argument(
        "--fit-waits",
        action="store_true",
        help="scale each request's waits so that its replay without the mesh is as long as its trace",
    )
    a = ap.parse_args()
    out = SuiteDir(a.run)
    cal = calibrate(out, ProfileStore(a.db).get(a.profile))
    look = single_profile(cal.profile)
    errs: dict[str, list[tuple[float, float]]] = {}
    for s, cases in cal.result.sets.items():
        for c in cases:
            if c.predicted is None:
                continue
            trace = out.traces / f"{c.topology}-{c.query}-{c.mode}.json"
            sidecars = {n: SidecarConfig(Mode(m)) for n, m in c.sidecar_modes.items()}
            batch = load_traces(trace, "otlp", SpanOptions(rate=c.rate, sidecars=sidecars)).batch
            costs = hop_costs(batch, look, rates=shared_cpu_rates(batch, 1))
            mesh = costs.cpu.sum(axis=1)
            base = per_service_cpu(c)
            G = batch.n_graphs
            idle = idle_vcpu(batch, look)[1] if a.background != "none" else None
            busy_b, busy_m = np.zeros(G), np.zeros(G) if idle is None else idle.copy()
            if a.background == "idle-work" and idle is not None:
                roots = batch.graph_ptr[:-1]
                mesh = mesh.copy()
                mesh[roots] += idle * 1e6 / batch.rate[roots]  # at the root's crossings
                busy_m = np.zeros(G)
            if a.background == "load":
                b_cpu = sum(base.values())
                w_cpu = np.bincount(batch.graph_of(), weights=mesh, minlength=G)
                busy_b = busy_b + c.rate * b_cpu * 1e-6
                busy_m = busy_m + c.rate * (b_cpu + w_cpu) * 1e-6
            wake = (
                np.maximum(costs.latency.sum(axis=1) - costs.cpu.sum(axis=1), 0.0)
                if a.wake
                else None
            )
            tail = (
                np.clip(costs.cpu.sum(axis=1) - costs.latency.sum(axis=1), 0.0, None)
                if a.tail
                else None
            )
            without, with_mesh = replays(
                batch, mesh, base, (busy_b, busy_m), a.fit_waits, wake, tail, a.priority
            )
            measured = c.comparisons["latency"].measured.median
            pred = statistics.median(with_mesh) - statistics.median(without)
            old = c.predicted.p50_us
            if a.hybrid:
                # the engine's bound less the mesh work the schedule finds hidden in waits
                work = np.bincount(batch.graph_of(), weights=mesh, minlength=G)
                hidden = [max(w - (m - n), 0.0) for w, m, n in zip(work, with_mesh, without)]
                pred = old - statistics.median(hidden)
            e_new, e_old = pred / measured - 1, old / measured - 1
            errs.setdefault(s, []).append((e_new, e_old))
            print(
                f"{s[:4]} {c.topology}/{c.query:15s} {c.mode:5s} measured {measured:7.0f}  "
                f"schedule {pred:7.0f} ({100 * e_new:+5.0f} %)  engine {old:7.0f} "
                f"({100 * e_old:+5.0f} %)"
            )
    for name, pairs in errs.items():
        print(
            f"{name}: schedule {_stats([x for x, _ in pairs])}; engine {_stats([y for _, y in pairs])}"
        )


def _stats(errors: list[float]) -> str:
    return (
        f"median |e| {100 * statistics.median(abs(x) for x in errors):.1f} % "
        f"(bias {100 * statistics.fmean(errors):+.1f} %, beyond 30 %: "
        f"{sum(abs(x) > 0.3 for x in errors)})"
    )


def per_service_cpu(c: CaseResult) -> dict[str, float]:
    """CPU-µs per request of every pod without the mesh (median over the case's pairs)."""
    names = {n for b, _ in c.pairs for n in b.cpu_ns}
    return {
        n: statistics.median(b.cpu_ns.get(n, 0) * 1e-3 / b.count for b, _ in c.pairs if b.count)
        for n in names
    }


if __name__ == "__main__":
    main()
