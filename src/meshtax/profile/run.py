"""``run_profile``: measure this machine's sidecar and store a :class:`Profile`.

Testbed (one run)::

    pod client  (fortio load, no sidecar, CPU pinning.client)
       │ veth/bridge
    pod server  (meshed)  :8080 ──iptables──► Envoy :15006 (uid 1337, pinning.sidecars)
                                                 └─ 127.0.0.1:<app port> ─► fortio echo (pinning.app)
                          :<app port> (excluded from interception) ─► the same fortio echo

So "with sidecar" targets ``server:8080`` and "without" targets the app port directly — the
same echo process, in the same run, alternating. The whole run is niced (``Plan.nice``) so
other work on a shared machine does not preempt it mid-request. For each mode (TCP first, so
HTTP/gRPC parsing can subtract it) and size:

1. paired latency runs without probes → the overhead (meshed − direct mean) with a 95 %
   interval (:func:`measure_overhead`);
2. paired probe windows, meshed and direct, the probe on sidecar and app → the components
   (:mod:`~meshtax.profile.decompose`) and the overhead *in those same windows*, which the
   closure compares them with; probed − un-probed overhead is the probe's perturbation
   (:func:`~meshtax.profile.instances.probe_instances`: over one sidecar, or several started
   afresh);
3. the max-rate run and fixed-rate runs under perf → CPU per component (:func:`sidecar_cpu`):
   fractions of the max rate and absolute low rates (``Plan.low_rates``; per-message CPU
   rises at low rates, where applications run).

In tcp mode, then, for each protocol of ``Plan.carried`` (gRPC): a tcp-mode sidecar forwarding
to the app's server of that protocol, driven by that protocol's client — probe windows and CPU
runs as above → ``ModeProfile.carried[protocol]`` (one gRPC call is several TCP writes each
way, which a TCP echo does not show). Then :mod:`~meshtax.profile.fit` fits models and checks
closure.

The one-hop measurements are :mod:`meshtax.profile.onehop`; the assembly into a profile is
:mod:`meshtax.profile.build`. Every side effect goes through the testbed and the injectable
:class:`~meshtax.profile.backends.Backends`, so the orchestration runs against fakes in tests.
"""

from __future__ import annotations

import datetime as _dt
import functools
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import Any

from meshtax.model.capacity import Capacity
from meshtax.model.profile import Profile
from meshtax.model.proxy import ProxyChoice
from meshtax.model.sidecar import Architecture, Mode
from meshtax.model.speed import Speed
from meshtax.profile.architecture import InternodeResult, measure_internode, one_hop_bed, role_plan
from meshtax.profile.backends import Backends
from meshtax.profile.build import (
    CpuRun,
    ProfileSink,
    SizeResult,
    build_profile,
    median_run,
)
from meshtax.profile.capacity import measure_capacity
from meshtax.profile.closure import retry_unclosed
from meshtax.profile.decompose import Breakdown, steady_breakdown
from meshtax.profile.instances import Sidecar, early_rounds, idle_cpu_us_per_s, probe_instances
from meshtax.profile.onehop import measure_overhead, sidecar_cpu
from meshtax.profile.plan import Plan, Step, full_plan, quick_plan, resolving, window_policy
from meshtax.profile.probed import ProbedPairs
from meshtax.testbed.bed import OneHop
from meshtax.testbed.fortio import LoadResult, fortio_version
from meshtax.testbed.interference import Interference, Meter, Thresholds
from meshtax.testbed.nodebed import NodeBed
from meshtax.testbed.proxy import PROXIES, Proxy
from meshtax.testbed.system import System
from meshtax.testbed.tools import tool

__all__ = ["ProfileOptions", "Progress", "run_profile"]


@dataclass(frozen=True)
class ProfileOptions:
    """What ``meshtax profile`` asks for (the CLI maps argv onto this, nothing else).

    ``modes``/``sizes``/``duration_s``/``carried``/``low_rates`` override the preset
    (``quick`` or full; ``()`` turns carried protocols or low-rate runs off);
    ``low_rate_repeats``: each low rate at or below ``Plan.low_rate_repeat_max`` measured as
    that many differenced pairs of the preset's full length, the median pair kept (None: the
    preset's: three in the quick one, one in the full);
    ``resolve_s``: probe windows until every component is known within ±5 %, at most that
    many seconds per size (:func:`~meshtax.profile.plan.resolving`); ``instances``: each
    size's probe windows over that many sidecars started afresh (``Plan.probe_instances``);
    ``rounds``: each mode's probe windows in that many rounds over the run (``probe_rounds``),
    ``round_beds``: each early round on a bed built afresh (``Plan.round_beds``);
    ``plan``, if given, replaces the preset entirely. ``name`` defaults to ``<hostname>-<UTC time>``.
    ``proxy``: the sidecar measured (Envoy; or the reference sidecar, tcp mode only) and its
    IPC/write variant.
    """

    name: str | None = None
    quick: bool = False
    modes: tuple[Mode | str, ...] | None = None
    sizes: tuple[int, ...] | None = None
    duration_s: float | None = None
    replace: bool = False
    plan: Plan | None = None
    carried: tuple[str, ...] | None = None
    low_rates: tuple[float, ...] | None = None
    capacity: bool | None = None  # measure each mode's capacity (None: the preset's)
    low_rate_repeats: int | None = None
    resolve_s: float | None = None
    instances: int | None = None
    rounds: int | None = None
    round_beds: bool | None = None
    proxy: ProxyChoice = ProxyChoice()
    architecture: Architecture = Architecture.SIDECAR  # node-l4, waypoint: on the node bed

    def resolve_plan(self) -> Plan:
        p = self.plan or (quick_plan() if self.quick else full_plan())
        changes: dict[str, Any] = {}
        if self.modes:
            changes["modes"] = tuple(Mode(m) for m in self.modes)
        if self.sizes:
            changes["sizes"] = tuple(self.sizes)
        if self.carried is not None:
            changes["carried"] = tuple(self.carried)
        if self.low_rates is not None:
            changes["low_rates"] = tuple(self.low_rates)
        if self.capacity is not None:
            changes["capacity"] = self.capacity
        changes = role_plan(p, changes, self.architecture, self.proxy, self.carried is None)
        if changes:
            p = Plan(**{**_plan_fields(p), **changes})
        if self.duration_s is not None:
            p = p.with_duration(self.duration_s)
        if self.low_rate_repeats is not None:
            # full-length pairs: three of half the length scattered more than one
            # (BENCHMARKS.md, issue #18, seventh sitting)
            p = replace(
                p, low_rate_repeats=self.low_rate_repeats, low_rate_repeat_run_s=p.low_rate_run_s
            )
        if self.resolve_s is not None:
            p = resolving(p, self.resolve_s)
        if self.instances or self.rounds or self.round_beds is not None:
            p = replace(
                p,
                probe_instances=self.instances or p.probe_instances,
                probe_rounds=self.rounds or p.probe_rounds,
                round_beds=p.round_beds if self.round_beds is None else self.round_beds,
            )
        self.proxy.check_modes(p.modes)
        return p

    def resolve_name(self, now: _dt.datetime) -> str:
        return self.name or f"{socket.gethostname()}-{now.strftime('%Y%m%d-%H%M%S')}"


def _plan_fields(p: Plan) -> dict[str, Any]:
    return {f: getattr(p, f) for f in p.__dataclass_fields__}


@dataclass(frozen=True)
class Progress:
    """Where a run is: step ``index`` of ``total`` (1-based), seconds elapsed and an ETA."""

    index: int
    total: int
    step: Step
    elapsed_s: float
    eta_s: float
    fraction: float

    @property
    def description(self) -> str:
        return self.step.describe()


class _Clocked:
    """Progress bookkeeping: expected seconds of each step, scaled by how the run is going."""

    def __init__(
        self,
        steps: list[Step],
        progress: Callable[[Progress], None] | None,
        clock: Callable[[], float],
    ) -> None:
        self.steps = steps
        self.total_expected = sum(s.expected_s for s in steps) or 1.0
        self.progress = progress
        self.clock = clock
        self.t0 = clock()
        self.i = 0
        self.done_expected = 0.0

    def next(
        self,
        kind: str,
        mode: Mode,
        size: int = 0,
        fraction: float = 0.0,
        *,
        rate: float = 0.0,
        protocol: str = "",
    ) -> None:
        # steps are announced in plan order; find this one (robust if the plan skips some)
        want = (kind, mode, size, fraction, rate, protocol)
        while self.i < len(self.steps):
            st = self.steps[self.i]
            self.i += 1
            if (st.kind, st.mode, st.size, st.rate_fraction, st.rate, st.protocol) == want:
                break
            self.done_expected += st.expected_s
        else:
            return
        elapsed = self.clock() - self.t0
        frac = self.done_expected / self.total_expected
        pace = elapsed / self.done_expected if self.done_expected > 0 else 1.0
        remaining = self.total_expected - self.done_expected
        if self.progress is not None:
            self.progress(
                Progress(self.i, len(self.steps), st, elapsed, remaining * max(pace, 0.5), frac)
            )
        self.done_expected += st.expected_s


def run_profile(
    options: ProfileOptions,
    system: System,
    store: ProfileSink | None,
    progress: Callable[[Progress], None] | None = None,
    *,
    backends: Backends | None = None,
) -> Profile:
    """Measure, decompose, fit, check closure, and save (when ``store`` is given).

    Raises whatever a tool raises (``LoadFailed``, ``EnvoyError``, ``ProbeError`` …) after the
    testbed is torn down; a profile that does not close is still returned and saved, with a
    provenance note and a :class:`ClosureWarning`.
    """
    be = backends or Backends()
    plan = options.resolve_plan()
    created = be.now()
    name = options.resolve_name(created)
    px = options.proxy
    envoy_bin = be.envoy_binary or (tool("envoy") if px.kind == "envoy" else None)
    kind = PROXIES[px.kind]
    proxy_bin = envoy_bin if px.kind == "envoy" else be.proxy_binary or kind.binary(px)
    fortio_bin = be.fortio_binary or tool("fortio")
    versions = {
        px.kind: kind.version(system, proxy_bin),
        "fortio": fortio_version(system, fortio_bin),
    }
    be = replace(be, envoy_binary=envoy_bin, fortio_binary=fortio_bin, proxy_binary=proxy_bin)
    ticker = _Clocked(plan.steps(), progress, be.clock)
    t_start = be.clock()
    results: dict[Mode, list[SizeResult]] = {}
    carried: dict[str, list[SizeResult]] = {}
    speeds: list[Speed] = []
    attempts: dict[Mode, list[dict[str, Any]]] = {}
    arch = Architecture(options.architecture)
    internode: InternodeResult | None = None

    @contextmanager
    def new_bed() -> Iterator[OneHop]:  # the profile's; with round_beds also each early round's
        with (
            be.testbed(system) as tb,
            one_hop_bed(
                tb,
                plan.pinning,
                arch,
                envoy_bin=envoy_bin,
                fortio_bin=fortio_bin,
                proxy=px,
                proxy_bin=proxy_bin,
            ) as bed,
        ):
            _speed(be, bed, plan, speeds)
            yield bed

    rounds = functools.partial(early_rounds, plan, tick=ticker.next, probe=be.probe, meter=be.meter)
    with be.niceness(plan.nice):
        early = rounds(new_bed) if plan.round_beds else None
        with new_bed() as bed:
            if early is None:  # the early rounds on the profile's own bed
                early = rounds(lambda: nullcontext(bed))
            for mode in plan.modes:
                ticker.next("setup", mode)
                results[mode] = _measure_mode(mode, plan, bed, be, ticker, early[mode])
                if mode is Mode.TCP:
                    for proto in plan.carried:
                        carried[proto] = _measure_carried(proto, plan, bed, be, ticker)
                _speed(be, bed, plan, speeds)
            # a mode that does not close is measured again (the attempt closest to closing stays)
            for _ in range(plan.closure_retries):
                if retry_unclosed(
                    plan,
                    results,
                    attempts,
                    lambda m: _measure_mode(m, plan, bed, be, _Clocked([], None, be.clock)),
                ):
                    _speed(be, bed, plan, speeds)
            capacities = {
                m: _capacity(m, plan, bed, be, ticker) for m in plan.modes if plan.capacity
            }
            if isinstance(bed, NodeBed) and arch is Architecture.NODE_L4:
                internode = measure_internode(bed, plan, be.schedstat)
    wall_s = be.clock() - t_start
    return build_profile(
        name,
        created,
        plan,
        results,
        versions,
        wall_s,
        store,
        options.replace,
        carried=carried,
        speeds=speeds,
        attempts=attempts,
        capacities=capacities,
        proxy=px,
        architecture=arch,
        internode=internode,
    )


def _capacity(mode: Mode, plan: Plan, bed: OneHop, be: Backends, ticker: _Clocked) -> Capacity:
    """The mode's capacity through a sidecar of its own, the bed's proxy
    (:mod:`meshtax.profile.capacity`)."""
    ticker.next("capacity", mode, plan.capacity_policy.size)
    proxy = bed.start_sidecar(mode)
    try:
        return measure_capacity(
            bed,
            mode,
            proxy.pid,
            plan.capacity_policy,
            # Envoy says how many workers it runs; the other proxies here run one
            workers=int(getattr(proxy, "concurrency", 1)),
            cpus=plan.pinning.pod_cpus(),
            cpu_ns=lambda pids: {p: sum(be.schedstat(p).values()) for p in pids},
        )
    finally:
        proxy.stop()


def _speed(be: Backends, bed: OneHop, plan: Plan, into: list[Speed]) -> None:
    """The reference workload once, on the client's and the sidecar's CPUs (when the run has
    a speed gauge)."""
    if be.speed is None:
        return
    a = plan.pinning.client[0] if plan.pinning.client else None
    b = plan.pinning.sidecars[0] if plan.pinning.sidecars else None
    into.append(be.speed(bed.system, a, b))


def _cpu_runs(
    bed: OneHop,
    load_mode: Mode,
    size: int,
    pid: int,
    plan: Plan,
    be: Backends,
    ticker: _Clocked,
    *,
    fractions: Sequence[float],
    step_mode: Mode,
    protocol: str = "",
) -> tuple[float, list[CpuRun]]:
    """The max-rate run, the fixed-rate runs at ``fractions`` of it, and the plan's low rates
    (at the sizes it gives them) → (max rate, CPU runs). ``load_mode``: the protocol the
    client speaks; ``step_mode``/``protocol``: the sidecar's mode and the carried protocol
    (progress steps)."""
    runs: list[CpuRun] = []

    def measure(qps: float, run_s: float) -> tuple[LoadResult, Breakdown, float]:
        return sidecar_cpu(
            bed, load_mode, size, qps, pid, run_s=run_s, perf=be.perf, schedstat_of=be.schedstat
        )

    def cpu(qps: float, run_s: float) -> tuple[float, Breakdown, float]:
        res, bd, ratio = measure(qps, run_s)
        return res.actual_qps, bd, ratio

    ticker.next("maxqps", step_mode, size, protocol=protocol)
    if 1.0 in fractions:
        max_run = CpuRun("max", *cpu(0.0, plan.maxqps_run_s))
        max_qps = max_run.rate
    else:
        max_qps = bed.load(
            bed.meshed_target, load_mode, size, duration_s=plan.maxqps_run_s
        ).actual_qps
    for f in fractions:
        if f >= 1.0:
            runs.append(max_run)
            continue
        ticker.next("cpu", step_mode, size, f, protocol=protocol)
        runs.append(CpuRun(f"f{f:g}", *cpu(max(f * max_qps, 1.0), plan.cpu_run_s)))
    if size in plan.low_rate_size_list():
        gauge = be.meter(bed.cpus, [pid, bed.app_pid]) if be.meter is not None else None
        for rate in plan.low_rates:
            # a fixed rate near the maximum is not a low rate (and may not be sustained)
            if rate >= LOW_RATE_MAX_SHARE * max_qps:
                continue
            ticker.next("lowrate", step_mode, size, rate=rate, protocol=protocol)
            runs.append(_low_rate(rate, plan, measure, gauge))
    return max_qps, runs


def _low_rate(
    rate: float,
    plan: Plan,
    measure: Callable[[float, float], tuple[LoadResult, Breakdown, float]],
    gauge: Meter | None,
) -> CpuRun:
    """CPU at one low rate: ``Plan.low_rate_pairs`` differenced pairs, each taken again while
    other work disturbs it (:func:`_quiet`), the pair of median CPU kept (:func:`median_run`)."""
    n, run_s = plan.low_rate_pairs(rate)
    once = functools.partial(_steady_run, f"r{rate:g}", rate, run_s, measure)
    return median_run(
        [_quiet(once, gauge, plan.low_rate_interference, plan.low_rate_tries) for _ in range(n)]
    )


def _quiet(
    run: Callable[[], CpuRun], gauge: Meter | None, limits: Thresholds, tries: int
) -> CpuRun:
    """``run`` until what else ran on the testbed's CPUs stays within ``limits``, at most
    ``tries`` times; the least disturbed run otherwise. A sidecar at a low rate is idle
    between messages: whatever runs there meanwhile leaves its caches cold, so a low-rate
    run is the measurement other work changes most (BENCHMARKS.md, issue #14)."""
    if gauge is None:
        return run()
    best: tuple[float, CpuRun] | None = None
    n = 0
    while n < max(tries, 1):
        n += 1
        before = gauge.snapshot()
        r = run()
        noise = Interference.between(before, gauge.snapshot())
        if best is None or noise.excess(limits) < best[0]:
            best = (noise.excess(limits), replace(r, noise=noise))
        if not noise.contaminated(limits):
            break
    assert best is not None
    return replace(best[1], tries=n)


def _steady_run(
    label: str,
    qps: float,
    run_s: float,
    measure: Callable[[float, float], tuple[LoadResult, Breakdown, float]],
) -> CpuRun:
    """CPU at a low fixed rate: runs of ``run_s`` and ``2·run_s``, differenced
    (:func:`~meshtax.profile.decompose.steady_breakdown`), at the rate the longer run added
    its requests. Where it added too few (the rate was not held), the longer run alone."""
    short, s_bd, s_ratio = measure(qps, run_s)
    long, l_bd, l_ratio = measure(qps, 2 * run_s)
    added, dt = long.count - short.count, long.duration_s - short.duration_s
    if added < max(2.0, 0.5 * qps * run_s) or dt <= 0:
        return CpuRun(label, long.actual_qps, l_bd, l_ratio)
    bd = steady_breakdown(s_bd, short.count, l_bd, long.count)
    return CpuRun(label, added / dt, bd, (s_ratio + l_ratio) / 2)


#: low-rate runs are skipped at sizes where they would exceed this share of the max rate
LOW_RATE_MAX_SHARE = 0.5


def _measure_carried(
    proto: str, plan: Plan, bed: OneHop, be: Backends, ticker: _Clocked
) -> list[SizeResult]:
    """A tcp-mode sidecar in front of the app's ``proto`` server, driven by ``proto``'s client:
    probe windows and CPU runs at the plan's carried sizes (no un-probed latency runs: the
    closure compares with the overhead of the same probed windows, as for the modes)."""
    load_mode = Mode(proto)
    ticker.next("setup", Mode.TCP, protocol=proto)
    return _measure_sizes(
        lambda: bed.start_sidecar(Mode.TCP, name=f"tcp-{proto}", app=load_mode),
        Mode.TCP,
        load_mode,
        plan.carried_sizes(),
        plan,
        bed,
        be,
        ticker,
        protocol=proto,
    )


def _measure_mode(
    mode: Mode,
    plan: Plan,
    bed: OneHop,
    be: Backends,
    ticker: _Clocked,
    earlier: Mapping[int, list[ProbedPairs]] | None = None,
) -> list[SizeResult]:
    """``earlier``: the early rounds' windows by size (this the last round); None: a retry."""
    return _measure_sizes(
        lambda: bed.start_sidecar(mode), mode, mode, plan.sizes, plan, bed, be, ticker, earlier
    )


def _measure_sizes(
    start: Callable[[], Proxy],
    mode: Mode,
    load_mode: Mode,
    sizes: Sequence[int],
    plan: Plan,
    bed: OneHop,
    be: Backends,
    ticker: _Clocked,
    earlier: Mapping[int, list[ProbedPairs]] | None = None,
    *,
    protocol: str = "",
) -> list[SizeResult]:
    """Per size, through a ``mode`` sidecar (``start`` starts one) driven by ``load_mode``'s
    client: the paired un-probed overhead (not for a carried ``protocol``), the probe windows
    (over ``Plan.probe_instances`` sidecars) and the CPU runs (through the last); the sidecar
    is stopped at the end."""
    envoy = Sidecar(start)
    meshed, direct = bed.meshed_target, bed.direct_target(load_mode)
    out: list[SizeResult] = []
    idle: float | None = None
    try:
        if not protocol and plan.idle_s > 0:
            ticker.next("idle", mode)
            bed.load(meshed, load_mode, sizes[0], n=plan.warmup_n)  # past start-up work
            idle = idle_cpu_us_per_s(envoy.pid, plan.idle_s, be)
        for size in sizes:
            ticker.next("probe" if protocol else "latency", mode, size, protocol=protocol)
            # warm both paths (connection set-up, allocator, caches) before anything counts
            bed.load(direct, load_mode, size, n=plan.warmup_n)
            bed.load(meshed, load_mode, size, n=plan.warmup_n)
            po = None
            if not protocol:
                po = measure_overhead(
                    bed,
                    mode,
                    size,
                    run_s=plan.latency_run_s,
                    rel_halfwidth=plan.latency_rel_halfwidth,
                    min_runs=plan.latency_min_runs,
                    max_runs=plan.latency_max_runs,
                    budget_s=plan.latency_budget_s,
                    clock=be.clock,
                )
                ticker.next("probe", mode, size)
            pr = probe_instances(
                bed,
                load_mode,
                size,
                envoy,
                instances=1 if protocol else plan.probe_instances,
                windows=window_policy(plan, carried=bool(protocol)).share(
                    plan.probe_rounds if earlier else 1
                ),
                earlier=(earlier or {}).get(size, ()),
                warm=functools.partial(bed.load, meshed, load_mode, size, n=plan.warmup_n),
                probe_app=plan.probe_app,
                probe=be.probe,
                meter=be.meter,
                rt_priority=plan.probe_rt_priority,
            )
            r = SizeResult(size, po, pr, idle_cpu_us_per_s=idle)
            r.max_qps, r.cpu = _cpu_runs(
                bed,
                load_mode,
                size,
                envoy.pid,
                plan,
                be,
                ticker,
                fractions=plan.carried_rate_fractions if protocol else plan.rate_fractions,
                step_mode=mode,
                protocol=protocol,
            )
            out.append(r)
    finally:
        envoy.stop()
    return out
