"""Profile assembly: one-hop measurements per size → points → fitted models, closure checked,
notes and the raw record kept (:func:`build_profile`)."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from meshtax._version import __version__
from meshtax.model.capacity import Capacity
from meshtax.model.components import IPC, NOTIFICATION, READ, WRITE, Component
from meshtax.model.profile import ModeProfile, Platform, Profile, Provenance
from meshtax.model.proxy import ProxyChoice
from meshtax.model.sidecar import Architecture, Mode
from meshtax.model.speed import Speed, busy_host_note, typical
from meshtax.model.stats import Estimate, estimate, median
from meshtax.profile.architecture import ROLE_NOTES, InternodeResult, role_hash, with_internode
from meshtax.profile.decompose import Breakdown, assemble, per_crossing
from meshtax.profile.fit import SizePoint, fit_carried, fit_mode
from meshtax.profile.onehop import PairedOverhead
from meshtax.profile.plan import Plan
from meshtax.profile.probed import ProbeResult
from meshtax.testbed.envoy.config import config_hash
from meshtax.testbed.host import this_host
from meshtax.testbed.interference import Interference
from meshtax.testbed.proxy import family_keys

__all__ = [
    "ClosureWarning",
    "CpuRun",
    "ProfileSink",
    "SizeResult",
    "build_profile",
    "family_hash",
    "physical",
    "points",
]


class ClosureWarning(UserWarning):
    """A measured profile whose components do not add up to the measured overhead."""


class ProfileSink(Protocol):
    def save(self, profile: Profile, *, replace: bool = False) -> None: ...


@dataclass(frozen=True)
class CpuRun:
    """One CPU run: ``label`` ("max", "f0.25" of the max rate, "r100" requests/s), the rate
    achieved, per-crossing CPU and perf/schedstat."""

    label: str
    rate: float
    bd: Breakdown
    ratio: float
    # what else ran meanwhile, and how many times the run was taken (low-rate runs are taken
    # again when other work disturbed them)
    noise: Interference | None = None
    tries: int = 1
    # a low rate measured as several differenced pairs (``Plan.low_rate_repeats``): every
    # pair's per-crossing breakdown in the order taken; ``bd`` is the median pair's
    repeats: tuple[Breakdown, ...] = ()

    @property
    def spread(self) -> float:
        """The largest pair's total CPU over the kept (median) pair's (1: one pair)."""
        if len(self.repeats) < 2 or self.bd.total() <= 0:
            return 1.0
        return max(b.total() for b in self.repeats) / self.bd.total()


#: a repeated low-rate point whose largest pair is this many times the median is recorded in
#: the profile's interference (quality) by name
LOW_RATE_OUTLIER = 1.5


def median_run(runs: Sequence[CpuRun]) -> CpuRun:
    """Several differenced pairs of one low rate → the pair of median total CPU per crossing
    (the lower middle for an even count), with every pair's breakdown and all their tries.
    The whole pair is kept (not a median per component), so its components add up to its
    total as measured; one pair that carried a one-off burst of CPU cannot move it."""
    if not runs:
        raise ValueError("median_run needs at least one run")
    if len(runs) == 1:
        return runs[0]
    order = sorted(range(len(runs)), key=lambda i: runs[i].bd.total())
    kept = runs[order[(len(runs) - 1) // 2]]
    return replace(kept, tries=sum(r.tries for r in runs), repeats=tuple(r.bd for r in runs))


@dataclass
class SizeResult:
    size: int
    unprobed: PairedOverhead | None  # None: only probed windows (carried protocols)
    probed: ProbeResult
    max_qps: float = 0.0
    cpu: list[CpuRun] = field(default_factory=list)
    # CPU-µs per second of the idle sidecar (no traffic; None: not measured): a cost per
    # sidecar and second, which every CPU run also contains (1/(2·rate) of it per crossing)
    idle_cpu_us_per_s: float | None = None

    @property
    def overhead(self) -> Estimate:
        """Per-request overhead without probes (the profile's measured overhead; the probed
        one when no un-probed runs were made)."""
        return self.probed.overhead if self.unprobed is None else self.unprobed.estimate

    @property
    def perturbation_us(self) -> float:
        """Per-request overhead with probes minus without (both paired, same run)."""
        return self.probed.overhead.median - self.overhead.median

    @property
    def app_user_us(self) -> float:
        """The app's user-space CPU change per crossing (meshed − direct, µs; from the probe
        windows): parsing what the sidecar adds (headers, HTTP/2 control frames). Its kernel-side
        change is not counted: it depends on where client and app run (direct, the app's write
        wakes the client on the other CPU; meshed, the sidecar on its own)."""
        return self.probed.latency.user - self.probed.sidecar_only.user

    def cpu_bd(self, run: CpuRun) -> Breakdown:
        """A CPU run's per-crossing breakdown: the sidecar's (perf split, schedstat total)
        plus the app's user-space change (:attr:`app_user_us`), as the latency counts it, plus
        the client's CPU change (:meth:`ProbeResult.client_cpu_us`: read, write, user), plus
        the kernel CPU change of the other proxies on the path (a node bed's) — less the idle
        sidecar's share of the run (:attr:`idle_cpu_us_per_s` ÷ 2·rate, from its user time:
        timers and stats are user-space work), which the profile keeps apart as a cost per
        sidecar and second.

        A waypoint's bed also records the echo's whole change (:attr:`ProbeResult.chain_app_cpu_us`)
        without counting it: counted again for the caller (338837d), it priced the apps' rise
        per waypoint call at 2× what a fresh validation measured (BENCHMARKS.md, issue #18,
        eighth sitting), so it was taken back out."""
        c = self.probed.client_cpu_us()
        idle = (
            self.idle_cpu_us_per_s / (2.0 * run.rate)
            if self.idle_cpu_us_per_s and run.rate > 0
            else 0.0
        )
        return replace(
            run.bd,
            read=run.bd.read + c["read"],
            write=run.bd.write + c["write"],
            user=run.bd.user + self.app_user_us + c["user"] - idle,
            # the other proxies' kernel work on the path (a waypoint's node proxies)
            kernel_other=run.bd.kernel_other + self.probed.path_kernel_cpu_us,
        )

    def cpu_like(self, run: CpuRun) -> CpuRun | None:
        """The run of the same label, else the one nearest in rate (the TCP baseline of an
        HTTP/gRPC run)."""
        same = [c for c in self.cpu if c.label == run.label]
        if same:
            return same[0]
        if not self.cpu or run.rate <= 0:
            return self.cpu[-1] if self.cpu else None
        return min(self.cpu, key=lambda c: abs(math.log(max(c.rate, 1e-9) / run.rate)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": self.size,
            **({} if self.unprobed is None else self.unprobed.to_dict()),
            "probe": {**self.probed.to_dict(), "perturbation_us_per_request": self.perturbation_us},
            "latency_breakdown_us": self.probed.latency.to_dict(),
            "max_qps": self.max_qps,
            **(
                {}
                if self.idle_cpu_us_per_s is None
                else {"idle_cpu_us_per_s": self.idle_cpu_us_per_s}
            ),
            "cpu": [
                {
                    "run": c.label,
                    "rate": c.rate,
                    "breakdown_us": c.bd.to_dict(),
                    "perf_over_schedstat": c.ratio,
                    **({} if c.noise is None else {"interference": c.noise.to_dict()}),
                    **({} if c.tries == 1 else {"tries": c.tries}),
                    **(
                        {"pairs_us": [b.to_dict() for b in c.repeats], "spread": c.spread}
                        if c.repeats
                        else {}
                    ),
                }
                for c in self.cpu
            ],
        }


def family_hash(proxy: ProxyChoice = ProxyChoice()) -> str:
    """One hash for the sidecar configs of all modes the proxy has (a profile's platform key
    must not depend on which modes a run chose); the IPC/write variant changes it."""
    return config_hash(family_keys(proxy))


def _platform(proxy: ProxyChoice, version: str, architecture: Architecture) -> Platform:
    """This machine with the measured proxy, its version, config key and variant (and its
    role, when not a sidecar)."""
    if architecture is Architecture.SIDECAR:
        return replace(this_host(proxy.label, version, family_hash(proxy)), variant=proxy.variant)
    host = this_host(proxy.kind, version, role_hash(architecture))
    return replace(host, architecture=architecture.value)


# --- the profile -----------------------------------------------------------------------------


#: Breakdown field each probed component comes from (Parsing and Other: sidecar work)
_FIELD = {IPC: "ipc", READ: "read", WRITE: "write", NOTIFICATION: "notification"}


def physical(
    values: Mapping[Component, float], what: str, per_pair: Sequence[Breakdown] = ()
) -> tuple[dict[Component, float], list[str]]:
    """``values`` with every negative component set to 0 (a time or a CPU cost cannot be
    negative: a negative difference is noise, or a term the decomposition gets wrong), and a
    line for each one saying what was measured and, from the pairs, whether its interval
    reaches zero (not resolved) or lies below it (a systematic error)."""
    out = dict(values)
    said: list[str] = []
    for c, v in values.items():
        if v >= 0:
            continue
        out[c] = 0.0
        f = _FIELD.get(c)
        pairs = [getattr(b, f) for b in per_pair] if f and per_pair else []
        why = "not resolved from zero"
        if len(pairs) >= 2:
            e = estimate(pairs)
            why = f"pairs [{e.lo:.1f}, {e.hi:.1f}] µs: " + (
                "not resolved from zero" if e.hi >= 0 else "below zero beyond the pairs' spread"
            )
        said.append(f"{what} {c}: measured {v:.1f} µs, stored 0 ({why})")
    return out, said


def points(
    mode: Mode, rs: list[SizeResult], tcp: Mapping[int, SizeResult], said: list[str]
) -> list[SizePoint]:
    pts: list[SizePoint] = []
    for r in rs:
        base = tcp.get(r.size)
        lat, s1 = physical(
            assemble(mode, r.probed.latency, base.probed.latency if base else None),
            f"{mode.value} {r.size} B latency",
            r.probed.per_pair,
        )
        said += s1
        cpu: list[tuple[float, Mapping[Component, float]]] = []
        for run in r.cpu:
            like = base.cpu_like(run) if base else None
            raw = assemble(mode, r.cpu_bd(run), base.cpu_bd(like) if base and like else None)
            vals, s2 = physical(raw, f"{mode.value} {r.size} B CPU at {run.rate:.0f}/s")
            said += s2
            cpu.append((run.rate, vals))
        # closure against the overhead of the same (probed) windows: like with like
        o = r.probed.overhead
        pts.append(
            SizePoint(
                r.size,
                lat,
                per_crossing(o.median),
                per_crossing(o.lo),
                per_crossing(o.hi),
                tuple(cpu),
            )
        )
    return pts


def _unprobed_closure(rs: Sequence[SizeResult]) -> float:
    """Mean over sizes of the un-probed overhead per crossing (µs)."""
    return sum(per_crossing(r.overhead.median) for r in rs) / len(rs) if rs else 0.0


def build_profile(
    name: str,
    created: _dt.datetime,
    plan: Plan,
    results: Mapping[Mode, list[SizeResult]],
    versions: Mapping[str, str],
    wall_s: float,
    store: ProfileSink | None,
    replace: bool,
    *,
    carried: Mapping[str, list[SizeResult]] | None = None,
    speeds: Sequence[Speed] = (),
    attempts: Mapping[Mode, Sequence[Mapping[str, Any]]] | None = None,
    capacities: Mapping[Mode, Capacity] | None = None,
    proxy: ProxyChoice = ProxyChoice(),
    architecture: Architecture = Architecture.SIDECAR,
    internode: InternodeResult | None = None,
) -> Profile:
    """Fit every mode, check closure, and store (when ``store`` is given). ``speeds``: the
    reference workload's measurements during the run; ``attempts``: earlier measurements of a
    mode that did not close (kept in the record); ``capacities``: measured per mode;
    ``proxy``: the sidecar measured (its version is ``versions[proxy.kind]``);
    ``architecture``: its role; ``internode``: a node proxy's inter-node step."""
    tcp = {r.size: r for r in results.get(Mode.TCP, [])}
    carried = {p: rs for p, rs in (carried or {}).items() if rs}
    modes: list[ModeProfile] = []
    notes: list[str] = [
        "models are per message crossing one sidecar one way; measured per request through "
        "one inbound sidecar (request + response = 2 crossings), halved",
        "latency components = the sidecar's on-path time + the change of the app's own path "
        "(meshed − direct), from paired eBPF probe windows on sidecar and app (definitions: "
        "meshtax.profile.decompose); the closure compares them with the overhead measured in "
        "those same probed windows (mean latency with sidecar minus without)",
        "the un-probed overhead (paired runs, no probe) and the probe perturbation (probed − "
        "un-probed overhead) are in options.measurements and "
        "options.probe_perturbation_us_per_request",
        "CPU components = the sidecar's CPU (perf split scaled to schedstat) + the app's "
        "user-space CPU change (meshed − direct, from the probe windows: it parses what the "
        "sidecar adds) + the client's read, write and user CPU change (the interception runs in "
        "its send path; it parses what the sidecar sends), so Parsing counts all three; the "
        "app's kernel-side change is not counted (it depends on the placement of client and app)",
    ]
    notes += _proxy_notes(proxy, results) + list(ROLE_NOTES.get(architecture, ()))
    if Mode.TCP not in results:
        notes.append("no TCP mode measured: Parsing is not separated from Other")
    unresolved: list[str] = []
    for mode, rs in results.items():
        mp = fit_mode(
            mode,
            points(mode, rs, tcp, unresolved),
            candidates=plan.split_candidates,
            tolerance=plan.closure_tolerance,
        )
        if mode is Mode.TCP and carried:
            mp = fit_carried(
                mp,
                {p: points(Mode.TCP, crs, {}, unresolved) for p, crs in carried.items()},
                candidates=plan.split_candidates,
                tolerance=plan.closure_tolerance,
            )
            for p, cmp_ in sorted(mp.carried.items()):
                cc = cmp_.closure
                notes.append(
                    f"tcp carrying {p}: a tcp-mode sidecar in front of the app's {p} server, "
                    f"driven by fortio's {p} client; per crossing = per message direction of "
                    "one call; latency components from probe windows only (closure against "
                    "their own overhead"
                    + (
                        f": components {cc.components_us:.1f} µs vs {cc.measured_us:.1f} µs, "
                        f"{cc.error:+.0%})"
                        if cc is not None
                        else ")"
                    )
                )
        mp = dataclasses.replace(
            mp,
            capacity=(capacities or {}).get(mode),
            latency_sketches={
                r.size: r.unprobed.sketch for r in rs if r.unprobed and r.unprobed.sketch
            },
            idle_cpu_us_per_s=next(
                (r.idle_cpu_us_per_s for r in rs if r.idle_cpu_us_per_s is not None), None
            ),
        )
        modes.append(mp)
        c = mp.closure
        if c is not None and not c.closes:
            msg = (
                f"{mode.value}: components sum to {c.components_us:.1f} µs per message but the "
                f"measured overhead is {c.measured_us:.1f} µs [{c.measured_lo_us:.1f}, "
                f"{c.measured_hi_us:.1f}]: error {c.error:+.0%} exceeds ±{c.tolerance:.0%} "
                "— this profile does NOT close"
            )
            notes.append("NOT CLOSED: " + msg)
            warnings.warn(msg, ClosureWarning, stacklevel=2)
        un = _unprobed_closure(rs)
        if c is not None:
            notes.append(
                f"{mode.value}: un-probed overhead {un:.1f} µs per message; components "
                f"{c.components_us:.1f} µs are {c.components_us / un - 1:+.0%} of it"
                if un
                else f"{mode.value}: un-probed overhead 0"
            )
    if unresolved:
        notes.append(
            f"{len(unresolved)} component value(s) came out negative and are stored as 0 "
            "(options.unresolved lists them)"
        )
    interference = _interference(results, carried)
    if interference.get("rejected"):
        notes.append(
            f"{interference['rejected']} probe window pair(s) refused because other work ran "
            f"on the testbed's CPUs (thresholds {plan.interference.to_dict()}); they were "
            "measured again"
        )
    if interference.get("forced"):
        notes.append(
            f"{interference['forced']} probe window pair(s) kept although other work ran during "
            "them (every pair of their size was disturbed; the least disturbed kept): their "
            "components include that work's interference"
        )
    busy = busy_host_note(interference)
    if busy is not None:
        notes.append(busy)
    for o in interference.get("low_rate_outliers", ()):
        notes.append(
            f"low rate {o}: one pair at least {LOW_RATE_OUTLIER:g}× the median (a one-off CPU "
            "burst in a run; the median pair prices it)"
        )
    status = (
        "unclosed"
        if any(m.closure is not None and not m.closure.closes for m in modes)
        else "closed"
    )
    perturb = {m.value: {str(r.size): r.perturbation_us for r in rs} for m, rs in results.items()}
    options: dict[str, Any] = {
        **plan.to_dict(),
        "pinning_described": plan.pinning.describe(),
        **({"envoy_version": versions["envoy"]} if "envoy" in versions else {}),
        "proxy": {**proxy.to_dict(), "version": versions[proxy.kind]},
        "fortio_version": versions["fortio"],
        "config_hash": family_hash(proxy),
        "probe_perturbation_us_per_request": perturb,
        "wall_time_s": wall_s,
        "measurements": {m.value: [r.to_dict() for r in rs] for m, rs in results.items()},
        "carried_measurements": {p: [r.to_dict() for r in rs] for p, rs in carried.items()},
        "unresolved": unresolved,
        "speed_samples": [sp.to_dict() for sp in speeds],
        "closure_attempts": {m.value: list(a) for m, a in (attempts or {}).items()},
    }
    profile = Profile(
        name=name,
        platform=_platform(proxy, versions[proxy.kind], architecture),
        provenance=Provenance(
            source="measured",
            by="meshtax profile",
            created=created.isoformat(timespec="seconds"),
            tool_version=__version__,
            options=options,
            notes=tuple(notes),
        ),
        modes={m.mode: m for m in modes},
        speed=typical(speeds) if speeds else None,
        interference=interference,
        status=status,
    )
    if internode is not None:
        profile = with_internode(profile, internode)
    if store is not None:
        store.save(profile, replace=replace)
    return profile


def _proxy_notes(proxy: ProxyChoice, results: Mapping[Mode, Sequence[SizeResult]]) -> list[str]:
    """What the profile must say about its proxy: which one, and whether socket-to-socket
    delivery (Unix sockets, sockmap) could be told apart from Write on this kernel."""
    out = [f"sidecar: {proxy.describe()}"] if proxy != ProxyChoice() else []
    methods = {
        str(w.get("sock_method", ""))
        for rs in results.values()
        for r in rs
        for w in r.probed.windows
        if w.get("meshed")
    }
    if proxy.ipc != "tcp" and "unavailable" in methods:
        out.append(
            "this kernel has no sk_data_ready/sock_send_length tracepoints: socket-to-socket "
            f"delivery ({proxy.ipc}) stays inside Write (IPC holds only what crosses lo); "
            "compare IPC + Write with a loopback-TCP profile"
        )
    return out


def _interference(
    results: Mapping[Mode, Sequence[SizeResult]], carried: Mapping[str, Sequence[SizeResult]]
) -> dict[str, Any]:
    """The profile's interference: the worst median share over its sizes, the windows
    refused, and each size's summary."""
    per: dict[str, Any] = {}
    outliers: list[str] = []
    for label, rs in [
        *((m.value, r) for m, r in results.items()),
        *((f"tcp+{p}", r) for p, r in carried.items()),
    ]:
        for r in rs:
            if r.probed.interference:
                per[f"{label} {r.size}"] = r.probed.interference
            outliers += [
                f"{label} {r.size} B {c.label}: pairs "
                + " / ".join(f"{b.total():.1f}" for b in c.repeats)
                + f" CPU-µs a crossing, median {c.bd.total():.1f} kept"
                for c in r.cpu
                if c.spread >= LOW_RATE_OUTLIER
            ]
    low = {"low_rate_outliers": outliers} if outliers else {}
    if not per:
        return low
    out: dict[str, Any] = {
        k: sum(int(v.get(k, 0)) for v in per.values()) for k in ("rejected", "windows", "forced")
    }
    out.update(low)
    for k in ("others", "steal", "wait", "stalls"):
        vals = [float(v[f"{k}_median"]) for v in per.values() if f"{k}_median" in v]
        if vals:
            out[f"{k}_median_max"] = max(vals)
            if k == "stalls":  # the host's regime: one noisy size does not make it
                out["stalls_median"] = median(vals)
    out["by_size"] = per
    return out
