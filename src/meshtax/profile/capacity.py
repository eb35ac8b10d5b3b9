"""A sidecar under load, on the one-hop echo bed: its capacity (requests/s at saturation) and
the latency distribution of one request through it (a quantile sketch per size).

Capacity (:func:`measure_capacity`), one mode at a time with its sidecar running:

1. warm-up, then the closed-loop maximum (``-qps 0``) of ``connections`` concurrent clients
   without the sidecar and through it, the sidecar's and every pod process's CPU read from
   ``/proc`` around each run — ``closed_runs`` runs per side, alternating, the median run's
   kept (as the tail validation measures its saturation: issue #20, set 7, one 2 s closed
   loop through the sidecar came out 14.8 % below the validation's median of three 25 min
   later, its sidecar at 42.1 CPU-µs a request where sets 3–6 measured 33–38, while the
   profile's fixed-rate run at the validation's 75 % rate cost what the validation measured
   there: the closed loop's batching state, one draw of it per run);
2. a ramp of fixed rates at ``ramp`` fractions of the meshed maximum (2 % to 90 %), calls spread evenly
   over the connections (fortio ``-uniform``), each without the sidecar and then through it:
   whether the rate was sustained (achieved ≥ ``shortfall`` × target), how busy the sidecar
   was, how the app's CPU changed with the sidecar at the same rate, and the client's latency
   quantiles on both sides (the overhead's distribution under load);
   then the ramp's top fractions (``repeat``) again, ``repeats`` more rounds of them (the
   first round before the ramp, the rest after it, so a fraction's draws lie 15–50 s
   apart), kept apart from the ramp's runs (``Capacity.repeats``): near saturation one 2 s
   run is a noisy draw of the queue (issue #20, sets 10–18: the 0.9 run's p90 queue 16–54
   requests' worth between profiles; set 19: three draws within a minute 3–55), where the
   tail model's queue bound reads it (the model reads the pooled table; the repeats are an
   experiment's, ``TailOptions.ramp_repeats``, not held on set 19);
3. the capacity is the highest rate achieved through the sidecar; what limited it is the
   sidecar (its workers busy ≥ ``busy`` of their CPUs), the CPUs sidecar and app share (both
   together ≥ ``busy`` of them) or else the client; the sidecar's CPU per request there is
   what a worker alone on a CPU would be bound by.

Latency sketches (:func:`latency_sketch`): the paired closed-loop runs the profiler already
makes for the overhead (one request in flight), their fortio histograms pooled per side →
quantiles at :data:`~meshtax.model.capacity.SKETCH_PROBS` with and without the sidecar.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from meshtax.model.capacity import SKETCH_PROBS, Capacity, CapacityPoint, LatencySketch
from meshtax.model.sidecar import Mode
from meshtax.testbed import procfs
from meshtax.testbed.fortio import FortioError, LoadResult, histogram_quantiles

__all__ = ["CapacityBed", "CapacityPolicy", "latency_sketch", "measure_capacity"]


@dataclass(frozen=True)
class CapacityPolicy:
    """How a capacity is measured: ``size`` bytes each way, ``connections`` concurrent
    clients, runs of ``run_s``; the ramp's ``fractions`` of the meshed maximum; a rate is
    sustained when ``shortfall`` × target was achieved; CPUs are full at ``busy``."""

    size: int = 100
    connections: int = 32
    run_s: float = 2.0
    #: the low levels (2–10 %: a few hundred requests/s) are the rates one sidecar of a
    #: topology sees; the tail model's load factor is measured there instead of assumed
    ramp: tuple[float, ...] = (0.02, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9)
    shortfall: float = 0.97
    busy: float = 0.95
    warmup_n: int = 500
    #: closed-loop runs per side (alternating), the median run's kept
    closed_runs: int = 3
    #: the ramp's fractions measured again (those the ramp has), ``repeats`` more rounds
    #: (issue #20, set 19)
    repeat: tuple[float, ...] = (0.25, 0.5, 0.75, 0.9)
    repeats: int = 2

    def __post_init__(self) -> None:
        if self.size <= 0 or self.connections < 1 or self.run_s <= 0 or self.closed_runs < 1:
            raise ValueError("capacity: size > 0, at least one connection and run, run_s > 0")
        if any(not 0 < f <= 2 for f in self.ramp) or not 0 < self.shortfall <= 1:
            raise ValueError("capacity: ramp fractions within (0, 2], shortfall within (0, 1]")
        if self.repeats < 0:
            raise ValueError(f"capacity: repeats must be ≥ 0, got {self.repeats}")

    def repeated(self) -> tuple[float, ...]:
        """The ramp's fractions a repeated round runs (``repeat``'s that the ramp has)."""
        return tuple(f for f in self.ramp if f in self.repeat) if self.repeats else ()

    def expected_s(self) -> float:
        rounds = 2 * len(self.repeated()) * self.repeats
        return (2 * self.closed_runs + 2 * len(self.ramp) + rounds) * (self.run_s + 0.2) + 0.5

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "connections": self.connections,
            "run_s": self.run_s,
            "ramp": list(self.ramp),
            "shortfall": self.shortfall,
            "busy": self.busy,
            "warmup_n": self.warmup_n,
            "closed_runs": self.closed_runs,
            "repeat": list(self.repeat),
            "repeats": self.repeats,
        }


class CapacityBed(Protocol):
    """What a capacity measurement needs of the echo bed (:class:`~meshtax.testbed.bed.EchoBed`)."""

    @property
    def meshed_target(self) -> str: ...

    @property
    def app_pid(self) -> int: ...

    def direct_target(self, mode: Mode) -> str: ...

    def load(
        self,
        target: str,
        mode: Mode,
        size: int,
        qps: float = 0.0,
        *,
        duration_s: float | None = None,
        n: int | None = None,
        connections: int = 1,
        extra_args: tuple[str, ...] = (),
    ) -> LoadResult: ...


def measure_capacity(
    bed: CapacityBed,
    mode: Mode,
    sidecar_pid: int,
    policy: CapacityPolicy = CapacityPolicy(),
    *,
    workers: int = 1,
    cpus: int = 1,
    cpu_ns: Callable[[Sequence[int]], Mapping[int, int]] = procfs.cpu_ns,
) -> Capacity:
    """The capacity of the running sidecar ``sidecar_pid`` in ``mode`` (see the module
    docstring); ``workers``: its worker threads; ``cpus``: how many CPUs it shares with the app."""
    p = policy
    meshed, direct = bed.meshed_target, bed.direct_target(mode)
    pids = [sidecar_pid, bed.app_pid]
    points: list[CapacityPoint] = []
    repeats: list[CapacityPoint] = []

    def run(
        target: str, qps: float, extra: tuple[str, ...] = (), keep: bool = True
    ) -> CapacityPoint:
        before = cpu_ns(pids)
        r = bed.load(
            target,
            mode,
            p.size,
            qps,
            duration_s=p.run_s,
            connections=p.connections,
            extra_args=extra,
        )
        after = cpu_ns(pids)
        secs = r.duration_s or p.run_s
        used = {q: (after.get(q, 0) - before.get(q, 0)) * 1e-9 / secs for q in pids}
        try:
            qs = tuple(histogram_quantiles([r], SKETCH_PROBS))
        except FortioError:
            qs = ()
        pt = CapacityPoint(
            qps,
            r.actual_qps,
            used[sidecar_pid] if target == meshed else 0.0,
            sum(used.values()),
            r.percentiles_us.get(50.0, r.avg_us),
            r.percentiles_us.get(99.0, r.max_us),
            target == meshed,
            qs,
        )
        if keep:
            points.append(pt)
        return pt

    for t in (direct, meshed):
        bed.load(t, mode, p.size, n=p.warmup_n, connections=p.connections)
    closed: dict[str, list[CapacityPoint]] = {direct: [], meshed: []}
    for i in range(p.closed_runs):
        for t in (direct, meshed) if i % 2 == 0 else (meshed, direct):
            closed[t].append(run(t, 0.0, keep=False))
    base, top = (_median_run(closed[t]) for t in (direct, meshed))
    points += [base, top]

    def again() -> None:  # one round of the repeated fractions, kept apart from the ramp
        for f in p.repeated():
            for t in (direct, meshed):
                repeats.append(run(t, f * top.achieved, ("-uniform",), keep=False))

    rounds = p.repeats if p.repeated() else 0
    if rounds:
        again()
    for f in p.ramp:
        for t in (direct, meshed):
            run(t, f * top.achieved, ("-uniform",))
    for _ in range(rounds - 1):
        again()
    through = [x for x in points if x.meshed and x.achieved > 0]
    best = max(through, key=lambda x: x.achieved)
    if best.sidecar_cpu >= p.busy * workers:
        limit = "sidecar"
    elif best.shared_cpu >= p.busy * cpus:
        limit = "shared-cpu"
    else:
        limit = "client"
    return Capacity(
        requests_per_s=best.achieved,
        size_bytes=p.size,
        connections=p.connections,
        workers=workers,
        sidecar_cpu_us=best.sidecar_cpu / best.achieved * 1e6,
        limited_by=limit,
        direct_requests_per_s=base.achieved,
        cpus=cpus,
        points=tuple(points),
        closed_loop=tuple(
            (d.achieved, m.achieved) for d, m in zip(closed[direct], closed[meshed], strict=True)
        ),
        repeats=tuple(repeats),
    )


def _median_run(runs: Sequence[CapacityPoint]) -> CapacityPoint:
    """The run of median rate (of an even number, the lower middle one)."""
    return sorted(runs, key=lambda x: x.achieved)[(len(runs) - 1) // 2]


def latency_sketch(
    size: int,
    meshed: Sequence[LoadResult],
    direct: Sequence[LoadResult],
    probs: Sequence[float] = SKETCH_PROBS,
) -> LatencySketch | None:
    """The sketch of one size from its paired runs' histograms (None: a side has none)."""
    if not meshed or not direct:
        return None
    try:
        m = histogram_quantiles(meshed, probs)
        d = histogram_quantiles(direct, probs)
    except FortioError:
        return None
    return LatencySketch(
        size,
        tuple(probs),
        tuple(m),
        tuple(d),
        min(sum(r.count for r in meshed), sum(r.count for r in direct)),
    )
