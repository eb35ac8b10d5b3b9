"""The measurement plan of one profiling run: modes, sizes, rates, durations, pinning.

A :class:`Plan` is pure data; :func:`quick_plan` and :func:`full_plan` are the two presets
(``meshtax profile --quick`` / ``meshtax profile``) and :meth:`Plan.steps` lists every
measurement step with its expected wall time, so a progress bar can show an honest ETA.
Everything in a plan is echoed into the profile's provenance (:meth:`Plan.to_dict`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from meshtax.model.sidecar import Mode
from meshtax.profile.capacity import CapacityPolicy
from meshtax.profile.onehop import WindowPolicy
from meshtax.testbed.interference import Thresholds
from meshtax.testbed.pinning import Pinning, default_pinning

__all__ = [
    "CARRIED_PROTOCOLS",
    "FULL_SIZES",
    "LOW_RATES",
    "QUICK_SIZES",
    "Plan",
    "Step",
    "full_plan",
    "quick_plan",
    "resolving",
    "window_policy",
]

QUICK_SIZES: tuple[int, ...] = (100, 4096, 65536)
FULL_SIZES: tuple[int, ...] = (100, 1024, 2048, 3072, 4096, 16384, 65536)
ALL_MODES: tuple[Mode, ...] = (Mode.TCP, Mode.HTTP, Mode.GRPC)
RATE_FRACTIONS: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
# absolute low rates (requests/s): per-message CPU roughly doubles between thousands/s and
# 100/s (fixed per-wake-up and timer costs are not amortised), and applications run there
# and 1 000/s: a multi-service app on shared CPUs at 100 requests/s loads each CPU like a
# one-hop at several hundred to a few thousand requests/s (predict.shared_cpu.shared_cpu_rates)
LOW_RATES: tuple[float, ...] = (100.0, 300.0, 1000.0)
#: application protocols a tcp-mode sidecar can be measured carrying (``ModeProfile.carried``)
CARRIED_PROTOCOLS: tuple[str, ...] = ("grpc", "http")
# 16 KB: Envoy's read slice, HTTP/2 default max frame and a TLS record; 64 KB: lo's MTU.
SPLIT_CANDIDATES: tuple[int, ...] = (16384, 65536)
# a fixed cost per step the durations do not cover (process start, perf script, probe attach)
# (measured: probe attach + detach ≈ 0.25 s, once per size now that windows are snapshots of
# one attached probe, which saves ≈ 0.05 s per window; fortio start ≈ 0.1 s; perf record +
# script ≈ 0.8 s)
STEP_OVERHEAD_S = {
    "setup": 2.0,
    "latency": 0.1,
    "probe": 0.30,
    "maxqps": 0.2,
    "cpu": 0.8,
    "warmup": 0.3,
    "idle": 0.3,
}


@dataclass(frozen=True)
class Step:
    """One measurement step (for progress and ETA); ``kind`` is setup/latency/probe/round (an
    early round's probe windows)/maxqps/cpu (a fraction of the max rate) or lowrate (an
    absolute ``rate``). ``protocol``: the
    application protocol a tcp-mode sidecar carries in this step ("" for the mode's own)."""

    kind: str
    mode: Mode
    size: int = 0
    rate_fraction: float = 0.0
    expected_s: float = 0.0
    rate: float = 0.0
    protocol: str = ""

    def describe(self) -> str:
        who = f"{self.mode.value}+{self.protocol}" if self.protocol else self.mode.value
        if self.kind == "setup":
            return f"{who}: start sidecar"
        if self.kind == "idle":
            return f"{who}: CPU of the idle sidecar"
        what = {
            "latency": "latency with/without sidecar",
            "probe": "probes attached",
            "round": "probes attached (an early round)",
            "maxqps": "max rate",
            "cpu": f"CPU at {self.rate_fraction:.0%} of max",
            "lowrate": f"CPU at {self.rate:g}/s",
            "capacity": "capacity (requests/s at saturation)",
        }[self.kind]
        return f"{who} {self.size} B: {what}"


@dataclass(frozen=True)
class Plan:
    """What one profiling run measures and for how long.

    Latency: paired closed-loop runs (one connection, one request in flight) without and with
    the sidecar, ``latency_run_s`` each, repeated until the median of the paired differences
    has a 95 % interval narrower than ``latency_rel_halfwidth`` or ``latency_max_runs`` /
    ``latency_budget_s`` end it. Probes: ``probe_pairs`` pairs of probe windows, one meshed and
    one direct closed-loop run of ``probe_run_s`` each (order alternating), the eBPF probe
    attached to the sidecar and (``probe_app``) the app, so components and the overhead they
    must add up to come from the same, equally perturbed windows (``probe_rt_priority``:
    run them at ``SCHED_FIFO``, off by default). CPU: the max-rate run
    (``maxqps_run_s``) and fixed-rate runs of ``cpu_run_s`` at the ``rate_fractions`` below 1
    of that maximum, all under ``perf record`` (fraction 1 is the max-rate run itself). Low
    rates: runs of ``low_rate_run_s`` and twice that at each absolute rate of ``low_rates``
    (requests/s, below the max), differenced so each run's one-off costs cancel, at the
    smallest ``low_rate_sizes`` sizes (None: every size).

    Carried (tcp mode only): for each protocol of ``carried``, a tcp-mode sidecar forwarding
    to the app's server of that protocol, driven by that protocol's client, at the smallest
    and largest size (``carried_all_sizes``: every size): ``carried_probe_pairs`` probe
    window pairs (latency components and the overhead they close against; no separate
    un-probed latency runs), then CPU at the max rate, ``carried_rate_fractions`` and the low
    rates → ``ModeProfile.carried[protocol]``.
    """

    modes: tuple[Mode, ...] = ALL_MODES
    sizes: tuple[int, ...] = QUICK_SIZES
    rate_fractions: tuple[float, ...] = RATE_FRACTIONS
    latency_run_s: float = 0.5
    latency_min_runs: int = 3
    latency_max_runs: int = 6
    latency_rel_halfwidth: float = 0.10
    latency_budget_s: float = 8.0
    probe_run_s: float = 0.5
    probe_pairs: int = 3  # at least; ``probe_max_pairs`` at most (None: exactly this many)
    probe_max_pairs: int | None = None
    probe_budget_s: float | None = None  # per size
    probe_rel_halfwidth: float = 0.15  # stop once components ≥ probe_floor_us are this tight
    probe_floor_us: float = 5.0
    probe_min_halfwidth_us: float = 1.0  # … or within this many µs
    # a probe window is contaminated above these shares of its CPUs (others' CPU, steal) or
    # of its wall time (the measured threads' run-queue wait); its pair is taken again, up to
    # ``probe_max_rejects`` times per size, then the size keeps what it has
    interference: Thresholds = field(default_factory=Thresholds)
    probe_max_rejects: int = 6
    # a mode whose components do not close is measured again this many times (the attempt
    # closest to closing is kept); still unclosed → the profile is marked so
    closure_retries: int = 1
    probe_app: bool = True
    # a size's probe windows in this many groups, each through a fresh sidecar (stopped and
    # started again between groups, its share of the pairs and budget): each instance holds its
    # own level, apart beyond its windows' noise (BENCHMARKS.md issue #14, run 16: 4 of 8
    # components, cv 3–8 %), so several average it. Carried protocols' single pair: one.
    probe_instances: int = 1
    # each mode's probe windows in this many rounds: rounds 1…N−1 of every mode first (each a
    # fresh sidecar, its share of the pairs and budget), then each mode's full measurement with
    # the last round's windows, all pooled; a mode's windows then span the whole run instead of
    # its own minutes. Why: medians of back-to-back profiles spread over ten minutes carried
    # across an hour (run 16) where instances inside one mode's minutes did not (run 17: a whole
    # mode's components moved together). Closure retries measure in one round.
    probe_rounds: int = 1
    # each early round on a bed of its own (testbed, pods, echo app and sidecar built afresh
    # and torn down after it; the last round on the profile's bed): what one bed holds for its
    # minutes — the pods' and the app's state as well as the sidecar's — is then sampled once
    # a round. Why: run 16's instances were whole profiles (their own pods) and their medians
    # carried across an hour; runs 17–19's instances and rounds renewed the sidecar only.
    round_beds: bool = False
    # probe windows with the client and app at SCHED_FIFO of this priority, the sidecar one
    # above (None: as the rest of the run, CFS at ``nice``): see probes.realtime. Off: it
    # removed the millisecond wake-up stalls but changed how sidecar and app share their CPU,
    # and closure and run-to-run agreement got worse (BENCHMARKS.md, issue #3)
    probe_rt_priority: int | None = None
    maxqps_run_s: float = 1.0
    cpu_run_s: float = 1.0
    low_rates: tuple[float, ...] = LOW_RATES
    # measured (2-core VM, tcp/gRPC/HTTP via a tcp-mode sidecar, 3 repeats): the spread of
    # CPU per message at 100/s and 300/s was 15–30 % at 0.5, 1 and 2 s alike — the machine's
    # state, not the request count, sets it — so runs need not be long
    low_rate_run_s: float = 1.0
    low_rate_sizes: int | None = None
    # a low rate at or below ``low_rate_repeat_max`` requests/s is measured as
    # ``low_rate_repeats`` independent differenced pairs of ``low_rate_repeat_run_s`` and twice
    # that, and the pair of median CPU per crossing is kept: a one-off burst of the proxy's
    # user-space CPU in one run (~10 ms, seen in quick node-l4 and sidecar profiles at 100/s:
    # 51 against 123 CPU-µs a crossing within one sitting, BENCHMARKS.md issue #18) is divided
    # by the fewest requests at the lowest rate, where one pair cannot tell it from the cost
    # per message (1: one pair of ``low_rate_run_s``). The quick preset takes three pairs of
    # the full length (+8 s a point; the full preset one): half-length pairs scattered more
    # than one pair (s7-nl4: 17.6 / 40.1 / −14.4 CPU-µs a crossing), full-length ones kept the
    # worst single pair's error off the validations (BENCHMARKS.md issue #18, ninth sitting)
    low_rate_repeats: int = 1
    low_rate_repeat_max: float = 150.0
    low_rate_repeat_run_s: float = 0.5
    # a low-rate run that other work disturbed (``low_rate_interference``) is taken again,
    # this many times at most; the least disturbed is kept. Its own perf sampler (system-wide,
    # 4 999 Hz with call graphs) counts as others' CPU: 0.05–0.09 of the two CPUs on a quiet
    # machine (suite run 5), so the bar is 0.2, where co-tenants showed 0.27–0.56
    low_rate_tries: int = 3
    low_rate_interference: Thresholds = field(default_factory=lambda: Thresholds(others=0.2))
    carried: tuple[str, ...] = ("grpc",)
    carried_all_sizes: bool = True
    carried_probe_pairs: int = 2
    carried_rate_fractions: tuple[float, ...] = RATE_FRACTIONS
    warmup_n: int = 200
    split_candidates: tuple[int, ...] = SPLIT_CANDIDATES
    closure_tolerance: float = 0.15
    pinning: Pinning = field(default_factory=default_pinning)
    # nice value of every process of the run (inherited from the profiler): on a shared
    # machine other work would otherwise preempt the sidecar/app/client mid-request and land
    # in the measurement; on an idle machine it changes nothing. None: leave as is.
    nice: int | None = -20
    preset: str = "quick"
    # seconds of an idle window per mode (the sidecar up, no traffic): its timers and stats
    # flushes, a cost per second and per sidecar, not per message (0: not measured; the
    # presets measure it)
    idle_s: float = 0.0
    # per mode after the rest: requests/s at saturation (profile.capacity; --capacity)
    capacity: bool = False
    capacity_policy: CapacityPolicy = field(default_factory=CapacityPolicy)

    def __post_init__(self) -> None:
        object.__setattr__(self, "modes", tuple(Mode(m) for m in self.modes))
        if not self.modes or not self.sizes:
            raise ValueError("a plan needs at least one mode and one size")
        if len(set(self.modes)) != len(self.modes) or len(set(self.sizes)) != len(self.sizes):
            raise ValueError("modes and sizes must not repeat")
        if any(s <= 0 for s in self.sizes):
            raise ValueError(f"sizes must be positive byte counts, got {self.sizes}")
        if any(not 0 < f <= 1 for f in (*self.rate_fractions, *self.carried_rate_fractions)):
            raise ValueError(
                f"rate fractions must be in (0, 1], got {self.rate_fractions} / "
                f"{self.carried_rate_fractions}"
            )
        if any(r <= 0 for r in self.low_rates) or len(set(self.low_rates)) != len(self.low_rates):
            raise ValueError(
                f"low rates must be distinct positive requests/s, got {self.low_rates}"
            )
        if self.low_rate_repeats < 1 or self.low_rate_repeat_run_s <= 0:
            raise ValueError("low_rate_repeats: at least one pair, of a positive duration")
        if self.low_rate_tries < 1:
            raise ValueError("low_rate_tries: at least one run per low rate")
        if self.low_rate_sizes is not None and self.low_rate_sizes < 1:
            raise ValueError("low_rate_sizes: at least one size (None: every size)")
        bad = [p for p in self.carried if p not in CARRIED_PROTOCOLS]
        if bad or len(set(self.carried)) != len(self.carried):
            raise ValueError(
                f"carried protocols must be distinct, of {CARRIED_PROTOCOLS}; got {self.carried}"
            )
        if self.carried_probe_pairs < 1:
            raise ValueError("need at least one pair of carried probe windows")
        durations = (
            self.latency_run_s,
            self.probe_run_s,
            self.maxqps_run_s,
            self.cpu_run_s,
            self.low_rate_run_s,
        )
        if min(durations) <= 0:
            raise ValueError("run durations must be positive")
        if not 0 <= self.idle_s <= 60:
            raise ValueError(f"idle_s: 0 (off) to 60 seconds, got {self.idle_s}")
        if self.probe_max_pairs is not None and self.probe_max_pairs < self.probe_pairs:
            raise ValueError("probe_max_pairs must be at least probe_pairs")
        if self.probe_pairs < 1:
            raise ValueError("need at least one pair of probe windows")
        if not 1 <= self.probe_instances <= 16:
            raise ValueError(
                f"probe_instances: 1 to 16 sidecars a size, got {self.probe_instances}"
            )
        if not 1 <= self.probe_rounds <= 8:
            raise ValueError(f"probe_rounds: 1 to 8 rounds a mode, got {self.probe_rounds}")
        if self.round_beds and self.probe_rounds < 2:
            raise ValueError("round_beds (--round-beds) needs early rounds (--rounds 2 or more)")
        if self.probe_rt_priority is not None and not 1 <= self.probe_rt_priority <= 98:
            raise ValueError(
                f"SCHED_FIFO priority must be 1..98 (the sidecar gets one more), got {self.probe_rt_priority}"
            )
        # the order the run uses: TCP first, so HTTP/gRPC parsing can subtract it
        object.__setattr__(self, "modes", tuple(m for m in ALL_MODES if m in self.modes))
        object.__setattr__(self, "sizes", tuple(sorted(self.sizes)))
        object.__setattr__(self, "low_rates", tuple(sorted(float(r) for r in self.low_rates)))

    def with_duration(self, seconds: float) -> Plan:
        """Every load run scaled to a base of ``seconds`` (``--duration``): latency runs take
        it once per side, each probe window once, each CPU rate once."""
        if seconds <= 0:
            raise ValueError("duration must be positive")
        return replace(
            self,
            latency_run_s=seconds,
            probe_run_s=seconds,
            cpu_run_s=seconds,
            maxqps_run_s=max(seconds, 0.5),
            low_rate_run_s=max(seconds, 0.5),
            low_rate_repeat_run_s=max(seconds, 0.5),
            latency_budget_s=max(self.latency_budget_s, 2 * seconds * self.latency_min_runs),
        )

    def latency_expected_s(self) -> float:
        # the order-statistic interval reaches 95 % only from 6 runs on, so expect the max
        per_pair = 2 * self.latency_run_s + 2 * STEP_OVERHEAD_S["latency"]
        return min(self.latency_max_runs * per_pair, self.latency_budget_s + per_pair)

    def steps(self) -> list[Step]:
        """Every step of the run, in order, with its expected duration (seconds)."""
        out: list[Step] = []
        o = STEP_OVERHEAD_S
        pair_s = 2 * (self.probe_run_s + o["probe"])
        probe_s = self.probe_pairs * pair_s
        cap = self.probe_max_pairs or self.probe_pairs
        if self.probe_budget_s and cap * pair_s > 2 * self.probe_budget_s:
            # the budget, not the pairs, ends a loop that asks this much (``resolving``)
            probe_s = max(probe_s, self.probe_budget_s)
        probe_s /= self.probe_rounds
        # each further instance: a sidecar stopped and started, then warmed
        inst_s = (self.probe_instances - 1) * o["setup"]
        for _ in range(self.probe_rounds - 1):  # early rounds: a fresh sidecar, warmed per size
            for i, m in enumerate(self.modes):  # (and a bed built afresh with round_beds)
                bed_s = o["setup"] if self.round_beds and not i else 0.0
                out.append(Step("setup", m, expected_s=o["setup"] + bed_s))
                out += [Step("round", m, s, expected_s=probe_s + o["probe"]) for s in self.sizes]
        for m in self.modes:
            out.append(Step("setup", m, expected_s=o["setup"]))
            if self.idle_s > 0:
                out.append(Step("idle", m, expected_s=self.idle_s + o["idle"]))
            for s in self.sizes:
                out.append(Step("latency", m, s, expected_s=self.latency_expected_s()))
                out.append(Step("probe", m, s, expected_s=probe_s + inst_s))
                max_s = (
                    self.maxqps_run_s
                    + o["maxqps"]
                    + (o["cpu"] if 1.0 in self.rate_fractions else 0.0)
                )
                out.append(Step("maxqps", m, s, expected_s=max_s))
                out += self._cpu_steps(m, s, self.cpu_fractions())
            if m is Mode.TCP:
                out += self.carried_steps()
        if self.capacity:
            cp = self.capacity_policy
            out += [
                Step("capacity", m, cp.size, expected_s=o["setup"] + cp.expected_s())
                for m in self.modes
            ]
        return out

    def _cpu_steps(
        self, m: Mode, s: int, fractions: tuple[float, ...], protocol: str = ""
    ) -> list[Step]:
        o = STEP_OVERHEAD_S
        out = [
            Step("cpu", m, s, f, expected_s=self.cpu_run_s + o["cpu"], protocol=protocol)
            for f in fractions
        ]
        if s in self.low_rate_size_list():
            out += [
                Step(
                    "lowrate",
                    m,
                    s,
                    expected_s=self.low_rate_expected_s(r),
                    rate=r,
                    protocol=protocol,
                )
                for r in self.low_rates
            ]
        return out

    def low_rate_pairs(self, rate: float) -> tuple[int, float]:
        """(pairs, seconds of a pair's shorter run) at a low ``rate``."""
        if self.low_rate_repeats > 1 and rate <= self.low_rate_repeat_max:
            return self.low_rate_repeats, self.low_rate_repeat_run_s
        return 1, self.low_rate_run_s

    def low_rate_expected_s(self, rate: float) -> float:
        n, run_s = self.low_rate_pairs(rate)
        return n * (3 * run_s + 2 * STEP_OVERHEAD_S["cpu"])  # runs of 1× and 2× a pair

    def carried_steps(self) -> list[Step]:
        """The carried-protocol steps (they follow tcp mode's own steps)."""
        o = STEP_OVERHEAD_S
        out: list[Step] = []
        if Mode.TCP not in self.modes:
            return out
        for p in self.carried:
            out.append(Step("setup", Mode.TCP, expected_s=o["setup"], protocol=p))
            for s in self.carried_sizes():
                probe_s = o["warmup"] + 2 * self.carried_probe_pairs * (
                    self.probe_run_s + o["probe"]
                )
                out.append(Step("probe", Mode.TCP, s, expected_s=probe_s, protocol=p))
                max_s = self.maxqps_run_s + o["maxqps"] + o["cpu"]
                out.append(Step("maxqps", Mode.TCP, s, expected_s=max_s, protocol=p))
                fr = tuple(f for f in self.carried_rate_fractions if f < 1.0)
                out += self._cpu_steps(Mode.TCP, s, fr, p)
        return out

    def cpu_fractions(self) -> tuple[float, ...]:
        """Rate fractions that need their own fixed-rate run (1.0 is the max-rate run)."""
        return tuple(f for f in self.rate_fractions if f < 1.0)

    def low_rate_size_list(self) -> tuple[int, ...]:
        """The sizes that get the low-rate runs (the smallest ``low_rate_sizes``)."""
        if not self.low_rates:
            return ()
        return self.sizes if self.low_rate_sizes is None else self.sizes[: self.low_rate_sizes]

    def carried_sizes(self) -> tuple[int, ...]:
        """Sizes of the carried-protocol runs: every size, or the smallest and the largest."""
        if self.carried_all_sizes:
            return self.sizes
        return tuple(sorted({self.sizes[0], self.sizes[-1]}))

    def expected_s(self) -> float:
        return sum(s.expected_s for s in self.steps())

    def to_dict(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "modes": [m.value for m in self.modes],
            "sizes": list(self.sizes),
            "rate_fractions": list(self.rate_fractions),
            "latency_run_s": self.latency_run_s,
            "latency_min_runs": self.latency_min_runs,
            "latency_max_runs": self.latency_max_runs,
            "latency_rel_halfwidth": self.latency_rel_halfwidth,
            "latency_budget_s": self.latency_budget_s,
            "probe_run_s": self.probe_run_s,
            "probe_pairs": self.probe_pairs,
            "probe_max_pairs": self.probe_max_pairs,
            "probe_budget_s": self.probe_budget_s,
            "probe_rel_halfwidth": self.probe_rel_halfwidth,
            "probe_floor_us": self.probe_floor_us,
            "probe_min_halfwidth_us": self.probe_min_halfwidth_us,
            "interference": self.interference.to_dict(),
            "probe_max_rejects": self.probe_max_rejects,
            "closure_retries": self.closure_retries,
            "probe_app": self.probe_app,
            "probe_instances": self.probe_instances,
            "probe_rounds": self.probe_rounds,
            "round_beds": self.round_beds,
            "probe_rt_priority": self.probe_rt_priority,
            "maxqps_run_s": self.maxqps_run_s,
            "cpu_run_s": self.cpu_run_s,
            "low_rates": list(self.low_rates),
            "low_rate_run_s": self.low_rate_run_s,
            "low_rate_sizes": list(self.low_rate_size_list()),
            "low_rate_tries": self.low_rate_tries,
            "low_rate_repeats": self.low_rate_repeats,
            "low_rate_repeat_max": self.low_rate_repeat_max,
            "low_rate_repeat_run_s": self.low_rate_repeat_run_s,
            "low_rate_interference": self.low_rate_interference.to_dict(),
            "carried": list(self.carried),
            "carried_sizes": list(self.carried_sizes())
            if Mode.TCP in self.modes and self.carried
            else [],
            "carried_probe_pairs": self.carried_probe_pairs,
            "carried_rate_fractions": list(self.carried_rate_fractions),
            "warmup_n": self.warmup_n,
            "idle_s": self.idle_s,
            "split_candidates": list(self.split_candidates),
            "closure_tolerance": self.closure_tolerance,
            "pinning": self.pinning.to_dict(),
            "nice": self.nice,
            **({"capacity": self.capacity_policy.to_dict()} if self.capacity else {}),
        }


def quick_plan(**changes: Any) -> Plan:
    """``--quick``: 100 B, 4 KB, 64 KB (a prediction warns beyond the largest size measured);
    short runs (aim: ≤ 3 min for tcp+http+grpc when nothing else runs). Probe windows: 4 pairs
    per size, up to 8 while a component above 5 µs is not yet within ±15 %, and pairs another
    process disturbed are taken again (10 s per size at most). Low rates at the smallest size
    only; gRPC carried through tcp mode at the smallest and largest size, one probe pair, CPU
    at the max rate and the low rates. The full plan's three low rates, 100/s, 300/s and
    1 000/s: shared-CPU apps at tens of requests/s price their sidecars at several hundred per
    second (``predict.shared_cpu``: Bookinfo at 40/s, 360/s), and with only 100/s and 1 000/s
    measured that interpolation hung on the 100/s run alone, which scatters ±50 % from
    profile to profile (BENCHMARKS.md, issue #14)."""
    base = Plan(
        latency_run_s=0.4,
        cpu_run_s=0.6,
        probe_pairs=4,
        probe_max_pairs=8,
        probe_budget_s=10.0,
        low_rates=(100.0, 300.0, 1000.0),
        low_rate_run_s=0.8,
        low_rate_repeats=3,
        low_rate_repeat_run_s=0.8,
        low_rate_sizes=1,
        carried_all_sizes=False,
        carried_probe_pairs=1,
        carried_rate_fractions=(1.0,),
        idle_s=2.0,
    )
    return replace(base, **changes)


def full_plan(**changes: Any) -> Plan:
    """Full: 100 B … 4 KB and 16/64 KB (so splits show); longer runs (aim: ≤ 20 min). Low
    rates at the two smallest sizes; gRPC carried through tcp mode at every size (one probe
    pair of 1.5 s windows, CPU at the max rate and the low rates)."""
    base = Plan(
        sizes=FULL_SIZES,
        latency_run_s=1.0,
        latency_max_runs=12,
        latency_rel_halfwidth=0.05,
        latency_budget_s=24.0,
        probe_run_s=1.5,
        probe_pairs=4,
        probe_max_pairs=10,
        probe_budget_s=40.0,
        maxqps_run_s=2.0,
        cpu_run_s=2.0,
        low_rate_run_s=1.0,  # longer low-rate runs do not narrow their spread (the machine's state sets it)
        low_rate_sizes=2,
        carried_probe_pairs=1,
        carried_rate_fractions=(1.0,),
        warmup_n=500,
        idle_s=3.0,
        preset="full",
    )
    return replace(base, **changes)


# What two profiles need to agree within 10 % (issue #14): each component known within
# ±5 %, also the ones that come out just under 5 µs per crossing in one profile and above it in
# the other (down to 2.5 µs: ±0.125 µs).
RESOLVE_REL_HALFWIDTH = 0.05
RESOLVE_FLOOR_US = 2.5


def resolving(plan: Plan, seconds: float) -> Plan:
    """``plan`` with probe windows taken, per size, until every component of at least
    :data:`RESOLVE_FLOOR_US` per crossing has a 95 % interval within ±5 % of its median, or
    ``seconds`` run out (``meshtax profile --resolve``): the quick preset's 4–8 pairs leave
    Notification and the 64 KB copies ±20–40 % apart from one profile to the next (their
    per-pair spread asks for 100–400 pairs). With 50 s a size (40–45 pairs) the components are
    known to ±1–2 %, and two such profiles an hour apart still differ 12–60 % on some: the
    machine moved (BENCHMARKS.md, issue #14, run 14)."""
    if seconds <= 0:
        raise ValueError(f"resolve: seconds per size must be positive, got {seconds}")
    return replace(
        plan,
        probe_max_pairs=max(plan.probe_max_pairs or plan.probe_pairs, 1000),
        probe_budget_s=seconds,
        probe_rel_halfwidth=RESOLVE_REL_HALFWIDTH,
        probe_floor_us=RESOLVE_FLOOR_US,
        probe_min_halfwidth_us=RESOLVE_REL_HALFWIDTH * RESOLVE_FLOOR_US,
    )


def window_policy(plan: Plan, carried: bool = False) -> WindowPolicy:
    """The probe windows of one size: a carried protocol's are a fixed number of pairs."""
    if carried:
        return WindowPolicy.fixed(plan.probe_run_s, plan.carried_probe_pairs)
    return WindowPolicy(
        plan.probe_run_s,
        plan.probe_pairs,
        plan.probe_max_pairs or plan.probe_pairs,
        plan.probe_budget_s,
        plan.probe_rel_halfwidth,
        plan.probe_floor_us,
        plan.interference,
        plan.probe_max_rejects,
        plan.probe_min_halfwidth_us,
    )
