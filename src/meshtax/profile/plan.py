"""The measurement plan of one profiling run: modes, sizes, rates, durations, pinning.

A :class:`Plan` is pure data; :func:`quick_plan` and :func:`full_plan` are the two presets
(``meshtax profile --quick`` / ``meshtax profile``) and :meth:`Plan.steps` lists every
measurement step with its expected wall time, so a progress bar can show an honest ETA.
Everything in a plan is echoed into the profile's provenance (:meth:`Plan.to_dict`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from meshtax.model.sidecar import Mode
from meshtax.profile.pinning import Pinning, available_cpus

__all__ = [
    "FULL_SIZES",
    "QUICK_SIZES",
    "Plan",
    "Step",
    "default_pinning",
    "full_plan",
    "quick_plan",
]

QUICK_SIZES: tuple[int, ...] = (100, 1024, 4096)
FULL_SIZES: tuple[int, ...] = (100, 1024, 2048, 3072, 4096, 16384, 65536)
ALL_MODES: tuple[Mode, ...] = (Mode.TCP, Mode.HTTP, Mode.GRPC)
RATE_FRACTIONS: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
# 16 KB: Envoy's read slice, HTTP/2 default max frame and a TLS record; 64 KB: lo's MTU.
SPLIT_CANDIDATES: tuple[int, ...] = (16384, 65536)
# a fixed cost per step the durations do not cover (process start, perf script, probe attach)
# (measured: probe attach + detach ≈ 0.25 s; fortio start ≈ 0.1 s; perf record + script ≈ 0.8 s)
STEP_OVERHEAD_S = {"setup": 2.0, "latency": 0.1, "probe": 0.35, "maxqps": 0.2, "cpu": 0.8}


def default_pinning(cpus: Sequence[int] | None = None) -> Pinning:
    """Client alone on one CPU; sidecar and app together on another (as in a pod).

    Measured here (benchmarks/profile_pinning.py): this placement gives the same number of
    cross-CPU wake-ups with and without the sidecar, so their difference is the sidecar's
    own work, and it had the smallest run-to-run spread. One CPU: everything shares it.
    """
    cs = tuple(cpus) if cpus is not None else available_cpus()
    if len(cs) < 2:
        return Pinning(client=cs or None, sidecars=cs or None, app=cs or None)
    return Pinning(client=(cs[0],), sidecars=(cs[1],), app=(cs[1],))


@dataclass(frozen=True)
class Step:
    """One measurement step (for progress and ETA); ``kind`` is setup/latency/probe/maxqps/cpu."""

    kind: str
    mode: Mode
    size: int = 0
    rate_fraction: float = 0.0
    expected_s: float = 0.0

    def describe(self) -> str:
        if self.kind == "setup":
            return f"{self.mode.value}: start sidecar"
        what = {"latency": "latency with/without sidecar", "probe": "probes attached",
                "maxqps": "max rate", "cpu": f"CPU at {self.rate_fraction:.0%} of max"}[self.kind]  # fmt: skip
        return f"{self.mode.value} {self.size} B: {what}"


@dataclass(frozen=True)
class Plan:
    """What one profiling run measures and for how long.

    Latency: paired closed-loop runs (one connection, one request in flight) without and with
    the sidecar, ``latency_run_s`` each, repeated until the median of the paired differences
    has a 95 % interval narrower than ``latency_rel_halfwidth`` or ``latency_max_runs`` /
    ``latency_budget_s`` end it. Probes: ``probe_pairs`` pairs of probe windows, one meshed and
    one direct closed-loop run of ``probe_run_s`` each (order alternating), the eBPF probe
    attached to the sidecar and (``probe_app``) the app, so components and the overhead they
    must add up to come from the same, equally perturbed windows. CPU: the max-rate run
    (``maxqps_run_s``) and fixed-rate runs of ``cpu_run_s`` at the ``rate_fractions`` below 1
    of that maximum, all under ``perf record`` (fraction 1 is the max-rate run itself).
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
    probe_pairs: int = 3
    probe_app: bool = True
    maxqps_run_s: float = 1.0
    cpu_run_s: float = 1.0
    warmup_n: int = 200
    split_candidates: tuple[int, ...] = SPLIT_CANDIDATES
    closure_tolerance: float = 0.15
    pinning: Pinning = field(default_factory=default_pinning)
    # nice value of every process of the run (inherited from the profiler): on a shared
    # machine other work would otherwise preempt the sidecar/app/client mid-request and land
    # in the measurement; on an idle machine it changes nothing. None: leave as is.
    nice: int | None = -20
    preset: str = "quick"

    def __post_init__(self) -> None:
        object.__setattr__(self, "modes", tuple(Mode(m) for m in self.modes))
        if not self.modes or not self.sizes:
            raise ValueError("a plan needs at least one mode and one size")
        if len(set(self.modes)) != len(self.modes) or len(set(self.sizes)) != len(self.sizes):
            raise ValueError("modes and sizes must not repeat")
        if any(s <= 0 for s in self.sizes):
            raise ValueError(f"sizes must be positive byte counts, got {self.sizes}")
        if any(not 0 < f <= 1 for f in self.rate_fractions):
            raise ValueError(f"rate fractions must be in (0, 1], got {self.rate_fractions}")
        durations = (self.latency_run_s, self.probe_run_s, self.maxqps_run_s, self.cpu_run_s)
        if min(durations) <= 0:
            raise ValueError("run durations must be positive")
        if self.probe_pairs < 1:
            raise ValueError("need at least one pair of probe windows")
        # the order the run uses: TCP first, so HTTP/gRPC parsing can subtract it
        object.__setattr__(self, "modes", tuple(m for m in ALL_MODES if m in self.modes))
        object.__setattr__(self, "sizes", tuple(sorted(self.sizes)))

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
        for m in self.modes:
            out.append(Step("setup", m, expected_s=o["setup"]))
            for s in self.sizes:
                out.append(Step("latency", m, s, expected_s=self.latency_expected_s()))
                probe_s = 2 * self.probe_pairs * (self.probe_run_s + o["probe"])
                out.append(Step("probe", m, s, expected_s=probe_s))
                max_s = self.maxqps_run_s + o["maxqps"] + (o["cpu"] if 1.0 in self.rate_fractions else 0.0)
                out.append(Step("maxqps", m, s, expected_s=max_s))
                for f in self.cpu_fractions():
                    out.append(Step("cpu", m, s, f, expected_s=self.cpu_run_s + o["cpu"]))
        return out

    def cpu_fractions(self) -> tuple[float, ...]:
        """Rate fractions that need their own fixed-rate run (1.0 is the max-rate run)."""
        return tuple(f for f in self.rate_fractions if f < 1.0)

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
            "probe_app": self.probe_app,
            "maxqps_run_s": self.maxqps_run_s,
            "cpu_run_s": self.cpu_run_s,
            "warmup_n": self.warmup_n,
            "split_candidates": list(self.split_candidates),
            "closure_tolerance": self.closure_tolerance,
            "pinning": self.pinning.to_dict(),
            "nice": self.nice,
        }


def quick_plan(**changes: Any) -> Plan:
    """``--quick``: 100 B, 1 KB, 4 KB; short runs (aim: ≤ 3 min for tcp+http+grpc; a real
    run measured 201 s with 0.5 s latency and 1 s CPU runs; 137 s with 0.4 s, 0.6 s and
    3 probe pairs, so a fourth pair fits)."""
    return replace(Plan(latency_run_s=0.4, cpu_run_s=0.6, probe_pairs=4), **changes)


def full_plan(**changes: Any) -> Plan:
    """Full: 100 B … 4 KB and 16/64 KB (so splits show); longer runs (aim: ≤ 20 min)."""
    base = Plan(
        sizes=FULL_SIZES,
        latency_run_s=1.0,
        latency_max_runs=12,
        latency_rel_halfwidth=0.05,
        latency_budget_s=24.0,
        probe_run_s=1.5,
        probe_pairs=4,
        maxqps_run_s=2.0,
        cpu_run_s=2.0,
        warmup_n=500,
        preset="full",
    )
    return replace(base, **changes)
