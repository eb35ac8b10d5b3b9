"""The measurements of a tail validation (:mod:`meshtax.validate.tail`): load levels on one hop
(the echo bed) and on a multi-service topology in pods, each predicted from its own no-mesh
side.

Per deployment (no mesh and mesh side by side, the profile's pinning: client on one CPU, apps
and sidecars on the other):

1. warm-up, then the closed-loop maximum of ``connections`` clients on each side (three runs
   each, alternating; the median) — the mesh side's is the measured saturation;
2. per load level, ``fraction`` × the no-mesh maximum asked of both sides: paired fixed-rate
   runs through the one paired-run loop, calls spread evenly over the connections (fortio
   ``-uniform``), client-side percentiles and latency quantiles, the CPU of every pod process;
   with ``LoadPlan.passes`` > 1 every level again in each later pass (after a settling run);
3. per level, the prediction (:mod:`meshtax.predict.tail`): the level's no-mesh latencies (one
   hop) or no-mesh traces (topology) as the mesh-free latency, the pods' shared CPUs, the
   applications' CPU per request measured without the mesh, at most as many requests in
   flight as the client has connections; arrivals on fortio's even schedule, for one hop with
   equal requests and the no-mesh tail's stalls drained at 1 − ρ (:func:`one_hop_options`),
   for a topology late by the lag its entry's no-mesh spans show
   (:func:`~meshtax.validate.tail_traces.arrival_lag_us`).

Every process lives in the testbed and is removed when it closes (also on errors).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.ramp_price import priced_from_ramp
from meshtax.predict.ramp_queue import bounded_by_ramp
from meshtax.predict.tail import TailOptions
from meshtax.testbed import procfs
from meshtax.testbed.bed import echo_testbed, mesh_pod
from meshtax.testbed.envoy.config import EnvoyConfig
from meshtax.testbed.envoy.process import EnvoyProcess
from meshtax.testbed.fortio import LoadResult, LoadSpec, histogram_quantiles, run_spec
from meshtax.testbed.paired import PairPolicy, paired_runs
from meshtax.testbed.pinning import Pinning
from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import System
from meshtax.testbed.tools import tool
from meshtax.validate import appctl
from meshtax.validate.run import APP_PORT, app_protocol, sidecar_modes
from meshtax.validate.tail import (
    BASE_PROBS,
    PERCENTILES,
    TOPOLOGY_SHARED_SCV,
    Predicted,
    TailPoint,
    TailRun,
    TailValidation,
    predict_one_hop,
    predict_traces_tail,
)
from meshtax.validate.tail_record import keep_counters, service_groups
from meshtax.validate.tail_traces import arrival_lag_us, traces_within

__all__ = [
    "FRACTIONS",
    "GO_NETPOLL_WAKEUP_US",
    "LoadPlan",
    "one_hop_options",
    "predict_one_hop_levels",
    "run_onehop_tail",
    "run_topology_tail",
]

Progress = Callable[[str], None]
#: load levels: shares of the no-mesh closed-loop maximum
FRACTIONS: tuple[float, ...] = (0.25, 0.5, 0.75, 0.9)
#: fortio's percentiles of every run (the validated ones and p99.9, kept in the record)
RUN_PERCENTILES = (50.0, 90.0, 99.0, 99.9)
#: Monte Carlo draws of a prediction, in all (spread over the graphs)
DRAWS = 40_000
#: how long an idle fortio sleeps before it looks at its timers again (µs): Go's netpoller
#: waits in whole milliseconds, at least one when a timer is due sooner (runtime/netpoll_epoll.go)
GO_NETPOLL_WAKEUP_US = 1000.0


@dataclass(frozen=True)
class LoadPlan:
    """The load levels (``fractions`` of the closed-loop maximum without the mesh, or with it:
    ``relative_to``), ``connections`` clients, runs of ``duration_s``, pairs per level
    (``policy``), the validated ``percentiles``, how one hop's prediction takes arrivals
    (``arrivals``: their SCV; 0, fortio's even schedule, with :func:`one_hop_options` — until
    set 6 of issue #20 it was 1, Poisson; a topology's are its schedule late by a measured lag).

    ``passes``: the levels are measured that many times over, one after another (each pass
    every level, ``policy``'s pairs each), so a level's pairs span the sitting and the passes
    are independent repeats of it within the sitting (``TailPoint.halves``). ``settle_s``: before
    each level's pairs in each pass, one unrecorded run per side at the level's rate, so the
    previous level's queue and pacing do not land in the first pair. Why (issue #20, sets
    1–5): with 5 pairs in a row per level, halves of a level's pairs differed by a median 20–40 %
    at p90/p99 and a level's tail moved 2–8× between sittings — a 20 % bar needs the
    measurement's own repeatability next to it."""

    fractions: tuple[float, ...] = FRACTIONS
    connections: int = 32
    duration_s: float = 2.0
    policy: PairPolicy = PairPolicy.fixed(3)
    percentiles: tuple[float, ...] = PERCENTILES
    arrivals: float = 0.0
    max_runs: int = 3
    relative_to: Literal["no_mesh", "mesh"] = "no_mesh"
    passes: int = 1
    settle_s: float = 0.0
    #: one hop's fixed-rate runs keep fortio's access log (:func:`onehop_load`); off: set 9
    onehop_log: bool = False

    def __post_init__(self) -> None:
        if self.passes < 1 or not self.settle_s >= 0:
            raise ValueError(f"need passes >= 1 and settle_s >= 0: {self.passes}, {self.settle_s}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "fractions": list(self.fractions),
            "connections": self.connections,
            "duration_s": self.duration_s,
            "pairs": [self.policy.min_rounds, self.policy.max_rounds],
            "percentiles": list(self.percentiles),
            "arrivals_scv": self.arrivals,
            "max_runs": self.max_runs,
            "relative_to": self.relative_to,
            **({"onehop_log": True} if self.onehop_log else {}),
            "passes": self.passes,
            "settle_s": self.settle_s,
        }


Load = Callable[[str, float, float, tuple[str, ...]], LoadResult]  # side, qps, s, extra
Cpu = Callable[[str], dict[str, int]]  # side → on-CPU ns by group


def _run(side: str, qps: float, plan: LoadPlan, load: Load, cpu: Cpu) -> TailRun:
    before = cpu(side)
    t0 = time.time()
    r = load(side, qps, plan.duration_s, ("-uniform",))
    t1 = time.time()
    after = cpu(side)
    return TailRun(
        qps,
        r.actual_qps,
        r.count,
        r.duration_s,
        {f"p{p:g}": r.percentiles_us[p] for p in RUN_PERCENTILES if p in r.percentiles_us},
        tuple(r.quantiles(BASE_PROBS)),
        {k: after.get(k, 0) - before.get(k, 0) for k in after},
        t0,
        t1,
        # the requests' own latencies sketched above: the histogram's beside them
        tuple(histogram_quantiles([r], BASE_PROBS)) if r.latencies_us.size else (),
    )


def _measure(
    plan: LoadPlan, load: Load, cpu: Cpu, say: Progress
) -> tuple[float, float, list[TailPoint]]:
    """Maxima (no mesh, mesh) and the paired runs of every level (predictions left out)."""
    tops: dict[str, list[float]] = {"no_mesh": [], "mesh": []}
    for i in range(plan.max_runs):
        for side in ("no_mesh", "mesh") if i % 2 == 0 else ("mesh", "no_mesh"):
            tops[side].append(load(side, 0.0, plan.duration_s, ()).actual_qps)
    top, top_mesh = (statistics.median(tops[s]) for s in ("no_mesh", "mesh"))
    runs = ", ".join(
        f"{s.replace('_', '-')} " + "/".join(f"{x:.0f}" for x in v) for s, v in tops.items()
    )
    say(
        f"closed-loop maximum of {plan.connections} clients: {top:.0f}/s, mesh {top_mesh:.0f}/s"
        f" (the median of runs {runs})"
    )
    ref = top if plan.relative_to == "no_mesh" else top_mesh
    got: list[list[tuple[TailRun, TailRun]]] = [[] for _ in plan.fractions]
    sizes: list[list[int]] = [[] for _ in plan.fractions]
    for k in range(plan.passes):
        for i, f in enumerate(plan.fractions):
            rate = f * ref
            say(
                f"{f:.0%} of the {plan.relative_to.replace('_', '-')} maximum: {rate:.0f}/s"
                + (f" (pass {k + 1}/{plan.passes})" if plan.passes > 1 else "")
            )
            if plan.settle_s > 0:  # the new rate's queues and pacing settle, not recorded
                for side in ("no_mesh", "mesh"):
                    load(side, rate, plan.settle_s, ("-uniform",))
            p = paired_runs(
                [("no_mesh", "mesh")],
                partial(_run, qps=rate, plan=plan, load=load, cpu=cpu),
                plan.policy,
                first_round=len(got[i]),  # a later pass continues the alternation
            )
            pairs = p.pairs("no_mesh", "mesh")
            got[i] += pairs
            sizes[i].append(len(pairs))
    points = [
        TailPoint(f, f * ref, tuple(got[i]), passes=tuple(sizes[i]) if plan.passes > 1 else ())
        for i, f in enumerate(plan.fractions)
    ]
    return top, top_mesh, points


def _options(plan: LoadPlan, pinning: Pinning, app_cpu_us: float, graphs: int) -> TailOptions:
    return TailOptions(
        percentiles=plan.percentiles,
        samples=max(20, DRAWS // max(graphs, 1)),
        arrivals=plan.arrivals,
        pod_cpus=pinning.pod_cpus(),
        app_cpu_us=app_cpu_us,
        clients=plan.connections,
    )


def one_hop_options(opts: TailOptions) -> TailOptions:
    """How one hop's queue on the pods' CPU is predicted (issue #20, set 7's model), with the
    plan's ``arrivals`` (0: fortio's even schedule): each request with the same CPU work
    (``shared_scv`` 0), and the no-mesh tail's stalls drained at 1 − ρ (``stalls``).

    Why: fortio ``-uniform`` paces each of its connections, so requests reach the pods' CPU
    evenly spaced, not as a Poisson stream; a one-hop request's work there is one crossing and
    the echo app, whose spread the profile's latency sketches put at SCV 0.07–0.16, not an
    exponential's 1. What makes one hop wait is the episodes the no-mesh side shows as its tail
    (p99 0.6–4 ms at a CPU 14–45 % busy): requests pile up while the CPU is taken and drain at
    1 − ρ, and the mesh's work lengthens each drain by (1 − ρ₀)/(1 − ρ₁). Poisson arrivals with
    an exponential request put those waits everywhere instead: on sets 1–6 (23 scored levels,
    all seen while choosing) one hop's p90 came out 38 % off (bias +46 %), 3–4× over in the
    quiet sittings; this choice 34 % (−3 %), p99 37 % → 24 %, p50 63 % → 49 %. Topologies keep
    their own arrivals (:func:`~meshtax.validate.tail_traces.arrival_lag_us`).

    Since set 8, fortio sends only when it is awake (``wakeup_us``: on a response, else
    :data:`GO_NETPOLL_WAKEUP_US` after its last wake-up): pinned to one CPU it runs one Go
    scheduler, whose idle wait for its next timer is ``epoll_wait`` in whole milliseconds, so
    at one hop's spacings (60–250 µs) a send due while nothing is in flight leaves with the
    others due in the same millisecond. A response reaches the client after the request's
    unloaded latency (the no-mesh median; with the mesh, plus the crossings), so the slower
    mesh side keeps its client awake and the no-mesh side bunches. Bookinfo's entry spans show
    the bound: their sampled spacings vary within ±1 ms, triangular — two lateness draws on
    (0, 1 ms) — in sets 4–7, not an exponential lag's tails. On sets 1–7 (one hop's scored
    levels, all seen while choosing; the quantum and latencies are not fitted) one hop's p90
    at 25 % rose from 0.3–0.6× the measured to 0.5–1.3×."""
    return bounded_by_ramp(
        replace(opts, shared_scv=0.0, stalls=True, wakeup_us=GO_NETPOLL_WAKEUP_US)
    )


def topology_options(opts: TailOptions, lag_us: float | None) -> TailOptions:
    """How a topology's level is predicted: fortio's even schedule late by ``lag_us`` (its
    entry spans' lag), a request's work on the shared CPUs with SCV
    :data:`~meshtax.validate.tail.TOPOLOGY_SHARED_SCV`, and each sidecar priced at what the
    profile's own sidecar used on the capacity ramp at its own rate — the rule ``meshtax
    predict`` uses too (:func:`~meshtax.predict.ramp_price.priced_from_ramp`)."""
    return priced_from_ramp(replace(opts, jitter_us=lag_us, shared_scv=TOPOLOGY_SHARED_SCV))


def predict_one_hop_levels(
    points: Sequence[TailPoint],
    profile: Profile,
    mode: Mode,
    size_bytes: int,
    plan: LoadPlan,
    pinning: Pinning,
) -> list[TailPoint]:
    """Each measured one-hop level with its prediction: its no-mesh latencies as the mesh-free
    distribution, its applications' CPU per request, :func:`one_hop_options`."""
    out = []
    for pt in points:
        base = [q for b, _ in pt.pairs for q in b.quantiles_us]
        opts = one_hop_options(_options(plan, pinning, _app_cpu(pt), len(base)))
        pred = predict_one_hop(profile, SidecarConfig(mode), size_bytes, pt.rate, base, opts)
        out.append(replace(pt, predicted=pred))
    return out


def _app_cpu(pt: TailPoint) -> float:
    """The applications' CPU-µs per request without the mesh (median over the pairs)."""
    return statistics.median(b.cpu_us_per_request("app") for b, _ in pt.pairs)


def run_onehop_tail(
    tb: Testbed,
    profile: Profile,
    pinning: Pinning,
    machine: Mapping[str, Any],
    *,
    mode: Mode = Mode.HTTP,
    size_bytes: int = 100,
    plan: LoadPlan = LoadPlan(),
    progress: Progress | None = None,
) -> TailValidation:
    """One hop in the open testbed ``tb``: fortio → the echo app, directly and through a
    ``mode`` sidecar, at each load level (see the module docstring)."""
    say = progress or (lambda _m: None)
    with echo_testbed(tb, pinning) as bed:
        envoy = bed.start_sidecar(mode)
        targets = {"no_mesh": bed.direct_target(mode), "mesh": bed.meshed_target}
        groups = {
            "no_mesh": {"app": [bed.app_pid]},
            "mesh": {"app": [bed.app_pid], "sidecar": [envoy.pid]},
        }

        for side in targets:
            bed.load(targets[side], mode, size_bytes, n=500, connections=plan.connections)
        with tempfile.TemporaryDirectory(prefix="tail-onehop-") as work:
            load = onehop_load(
                bed,
                targets,
                mode,
                size_bytes,
                plan.connections,
                Path(work) if plan.onehop_log else None,
            )
            top, top_mesh, points = _measure(plan, load, _cpu(groups, pinning), say)
        envoy.stop()
    out = predict_one_hop_levels(points, profile, mode, size_bytes, plan, pinning)
    return TailValidation(
        "one-hop",
        mode.value,
        tuple(out),
        plan.connections,
        top,
        top_mesh,
        profile.name,
        plan.percentiles,
        dict(machine),
        {**plan.to_dict(), "size_bytes": size_bytes, "pinning": pinning.describe()},
        _notes(
            "the echo app's latency distribution at the level, without the mesh",
            "from its histogram (with onehop_log: every fixed-rate run's access log)",
        ),
    )


def onehop_load(
    bed: Any, targets: Mapping[str, str], mode: Mode, size: int, connections: int, log: Path | None
) -> Load:
    """One hop's runs on ``bed`` (an echo bed); with ``log`` (a directory) a fixed-rate run
    keeps fortio's access log there, its percentiles the requests' own and the histogram's
    beside them (a closed loop, of which only the rate is used, keeps none). Off by default
    (``LoadPlan.onehop_log``). Why (issue #20): read as anywhere in both sides' buckets, the
    stored sets' one-hop overheads could move by a median 22 % (p90) and 44 % (p99); set 9
    measured the buckets' actual error on the same runs at 5 % (p90) and 4 % (p99), median of
    four levels, while at one hop's 90 % rate (15 728/s) the log raised the client CPU's busy
    time per request by 17 % (no mesh) and 47 % (mesh) and the no-mesh p99 by 300–400 µs."""

    def load(side: str, qps: float, secs: float, extra: tuple[str, ...]) -> LoadResult:
        path = str((log / f"{side}-access.jsonl").resolve()) if log and qps > 0 else ""
        return bed.load(  # type: ignore[no-any-return]
            targets[side],
            mode,
            size,
            qps,
            duration_s=secs,
            connections=connections,
            extra_args=extra,
            access_log=path,
        )

    return load


def _cpu(groups: Mapping[str, Mapping[str, Sequence[int]]], pinning: Pinning) -> Cpu:
    """On-CPU ns of each group's processes, their run-queue waits (``<group>_wait``), and the
    time the pods' and the client's CPUs were busy (tasks and interrupts: ``pods_busy``,
    ``client_busy``; of which interrupts and softirq: ``pods_irq``, ``client_irq``) of
    ``pods_total``/``client_total``, and the time the host ran something else on them
    (``pods_steal``, ``client_steal``: a virtual machine's steal time). Why the interrupts
    apart (issue #20, sets 1–5): one hop's tail followed how busy the client's CPU was with
    the mesh, by 2–19 µs a request more than without it in some sittings — kernel networking
    or tasks, the record now says which."""
    roles = {"pods": {*(pinning.sidecars or ()), *(pinning.app or ())}, "client": pinning.client}

    def read(side: str) -> dict[str, int]:
        pids = sorted({p for ps in groups[side].values() for p in ps})  # groups overlap
        ns, waits = procfs.cpu_ns(pids), {p: _wait(p) for p in pids}
        out = {k: sum(ns.get(p, 0) for p in ps) for k, ps in groups[side].items()}
        for k, ps in groups[side].items():
            out[f"{k}_wait"] = sum(waits[p] for p in ps)
        times = procfs.cpu_times()
        for role, cpus in roles.items():
            got = [times[c] for c in cpus or () if c in times]
            out[f"{role}_busy"] = sum(t.task_ns + t.irq_ns for t in got)
            out[f"{role}_irq"] = sum(t.irq_ns for t in got)  # of which interrupts, softirq
            out[f"{role}_total"] = sum(t.total_ns for t in got)
            out[f"{role}_steal"] = sum(t.steal_ns for t in got)  # the host took the vCPU
        return out

    return read


def _wait(pid: int) -> int:
    try:
        return procfs.runqueue_wait_ns(pid)
    except procfs.ProcError:
        return 0


def _notes(base: str, latencies: str) -> tuple[str, ...]:
    return (
        f"measured: fortio's client-side percentiles at fixed rates ({latencies}), calls spread "
        "evenly over the connections (-uniform); the percentile of all of a level's requests with the mesh − "
        "without, its 95 % interval from resampling the pairs; a level the mesh side did not "
        "sustain is not compared (its latency is set by the client's connections)",
        f"predicted: meshtax.predict.tail with {base} as the mesh-free latency, the pods' shared "
        "CPUs, the applications' CPU per request measured without the mesh, arrivals on an "
        "even schedule (one hop: equal requests, the no-mesh tail's stalls drained at 1 − ρ; a "
        "topology: late by the lag of the level's no-mesh entry spans), at most one request "
        "in flight per connection; saturation: the rate at "
        "which the first queue reaches utilisation 1 with each sidecar's share of the clients "
        "queued",
    )


def run_topology_tail(
    topology: appctl.Topology,
    query: str,
    mode: Mode,
    profile: Profile,
    system: System,
    pinning: Pinning,
    machine: Mapping[str, Any],
    workdir: Path,
    *,
    plan: LoadPlan = LoadPlan(),
    sample: int = 10,
    lock_timeout_s: float = 900.0,
    progress: Progress | None = None,
) -> TailValidation:
    """A topology's query in pods, without and with sidecars, at each load level (see the
    module docstring); each level predicted from the no-mesh traces of its own runs."""
    say = progress or (lambda _m: None)
    q = topology.query(query)
    names = topology.reachable(q)
    modes = sidecar_modes(topology, names, mode)
    proto = app_protocol(mode)
    work = workdir / f"{topology.name}-{q.name}-{mode.value}-tail"
    with Testbed(system, lock_timeout=lock_timeout_s) as tb:
        client = tb.add_pod("client")
        deps: dict[str, appctl.Deployment] = {}
        pods: dict[str, dict[str, Any]] = {}
        for tag, side in (("b", "no_mesh"), ("m", "mesh")):
            pods[side] = {s: tb.add_pod(f"{tag}{i}") for i, s in enumerate(names)}
            deps[side] = appctl.plan(
                topology,
                q.name,
                workdir=work / side,
                hosts={s: p.ip for s, p in pods[side].items()},
                ports=APP_PORT,
                binary=appctl.ensure_built(system),
                sample=sample,
                entry_protocol=proto,
                backend_protocol=proto,
            )
        envoys: dict[str, EnvoyProcess] = {}
        for s, pod in pods["mesh"].items():
            cfg = EnvoyConfig(
                mode=modes[s],
                inbound_upstream=("127.0.0.1", APP_PORT),
                circuit_breaker_max=2**32 - 1,
            )
            envoys[s] = mesh_pod(
                tb,
                pod,
                cfg,
                work / "mesh" / f"envoy-{s}",
                cpus=pinning.sidecars,
                binary=tool("envoy"),
            )
        apps = {}
        for side, d in deps.items():
            (work / side).mkdir(parents=True, exist_ok=True)
            apps[side] = appctl.start(d, appctl.testbed_spawner(tb, pods[side], cpus=pinning.app))
        sidecars = {e.pid for e in envoys.values()}
        every = {
            side: [p for pod in pods[side].values() for p in tb.pod_pids(pod)] for side in deps
        }
        groups = {
            side: {
                "app": [p for p in ps if p not in sidecars],
                "sidecar": [p for p in ps if p in sidecars],
                **service_groups({s: tb.pod_pids(pod) for s, pod in pods[side].items()}, sidecars),
            }
            for side, ps in every.items()
        }
        fmode = Mode(deps["no_mesh"].entry_mode)
        entry_bytes = topology.services[q.service].endpoints[q.endpoint].response_bytes
        place = client.place(cpus=pinning.client)
        fortio = tool("fortio")

        def load(side: str, qps: float, secs: float, extra: tuple[str, ...]) -> LoadResult:
            spec = LoadSpec(
                deps[side].entry_target,
                fmode,
                0,
                qps,
                connections=plan.connections,
                duration_s=secs,
                extra_args=extra,
                percentiles=RUN_PERCENTILES,
                response_bytes=entry_bytes,
                # every request's latency: fortio's buckets are 1 ms wide from 1 to 5 ms and
                # 10 ms wide from 10 to 50 ms, where these tails are
                access_log=str((work / f"{side}-access.jsonl").resolve()),
            )
            return run_spec(spec, system, place, fortio)

        for d in deps.values():
            spec = LoadSpec(
                d.entry_target,
                fmode,
                0,
                0.0,
                connections=plan.connections,
                n=500,
                response_bytes=entry_bytes,
            )
            run_spec(spec, system, place, fortio)
        top, top_mesh, points = _measure(plan, load, _cpu(groups, pinning), say)
        for a in apps.values():
            a.stop()  # SIGTERM: the spans are flushed
        traces = appctl.merge_traces(deps["no_mesh"].trace_files)
        keep_counters(envoys, work / "mesh" / "envoy-counters.json")
        for e in envoys.values():
            e.stop()
    out = []
    configs = {s: SidecarConfig(m) for s, m in modes.items()}
    for pt in points:
        path = work / f"no_mesh-traces-{pt.fraction:g}.json"
        windows = [(b.t_start, b.t_end) for b, _ in pt.pairs]
        level = traces_within(traces, windows)
        path.write_text(json.dumps(level))
        try:
            # the arrivals: fortio's even schedule, late by the lag the entry's spans show
            lag = arrival_lag_us(level, pt.rate)
            opts = topology_options(_options(plan, pinning, _app_cpu(pt), 1), lag)
            pred: Predicted | None = predict_traces_tail(str(path), profile, configs, pt.rate, opts)
            err = None
        except ValueError as e:
            pred, err = None, str(e)
        out.append(replace(pt, predicted=pred, error=err))
    return TailValidation(
        f"{topology.name}/{q.name}",
        mode.value,
        tuple(out),
        plan.connections,
        top,
        top_mesh,
        profile.name,
        plan.percentiles,
        dict(machine),
        {
            **plan.to_dict(),
            "sample": sample,
            "pinning": pinning.describe(),
            "sidecar_modes": {s: m.value for s, m in modes.items()},
        },
        _notes(
            "the level's no-mesh traces (one graph per traced request)",
            "every request's latency, from its access log",
        ),
    )
