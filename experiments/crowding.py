"""Crowding (issue #14, item 4): a sidecar's CPU per request alone on its CPU and with
neighbour sidecars on the same CPU, measured on the profiler's echo bed.

The question: the engine prices a message through a sidecar on shared CPUs at the one-hop rate
that loads the CPU alike (``predict.shared_cpu``). Would pricing it at the sidecar's own rate
times a measured "crowding" ratio (how much cheaper a message is when neighbours keep the CPU
busy) be better? Measured here 2026-11-23 (2 cores, load ~2.5; BENCHMARKS.md "Shared CPUs"):
neighbours at 100/s each bring the probed sidecar's CPU per request to 0.73–0.78 of alone at
sharing 4–8, in every mode; priced that way, the validation suite's cases were over-predicted
by +24 % / +49 % (calibration / hold-out) on latency, while the CPU-rate pricing came within
−6 % / −8 %. Requests in an app cross their sidecars back to back, so the CPU is warmer than
with independently timed neighbours: the engine keeps the CPU-rate pricing.

Run (root, under the measurement lock):
``flock /run/meshtax-measure.lock .venv/bin/python experiments/crowding.py --modes tcp,http,grpc``

Set-up: ``K`` neighbour pods, each meshed with a sidecar of the mode on the probed sidecar's
CPUs, forwarding to the bed's echo app (its app port, not intercepted). A window loads the
probed sidecar at ``rate`` requests/s (open loop, fortio ``-qps``) for ``run_s`` seconds, and in a
crowded window every one of ``K`` neighbours at the same rate, concurrently, from the client
pod. The probed sidecar's own CPU time (``/proc``, all its threads) over the window ÷ its
requests is the window's cost. Windows alone and crowded alternate in pairs
(:func:`~meshtax.testbed.paired.paired_runs`, one group per ``K``); each pair gives the ratio
crowded ÷ alone, which cancels the machine's drift between pairs. Each ``K`` gives one point at
sharing ``K + 1`` (the CPU carries ``K + 1`` times the sidecar's own traffic): the median ratio
over its pairs and its 95 % interval.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from meshtax.model.sidecar import Mode
from meshtax.model.stats import estimate
from meshtax.testbed import procfs
from meshtax.testbed.bed import (
    APP_PORTS,
    SERVICE_PORT,
    EchoBed,
    echo_testbed,
    mesh_pod,
    start_sidecar,
)
from meshtax.testbed.envoy.config import EnvoyConfig
from meshtax.testbed.envoy.process import EnvoyProcess
from meshtax.testbed.fortio import LoadResult, run_load
from meshtax.testbed.paired import Paired, PairPolicy, paired_runs
from meshtax.testbed.pinning import default_pinning
from meshtax.testbed.pods import Pod, Testbed
from meshtax.testbed.system import RealSystem


@dataclass(frozen=True)
class CrowdPoint:
    """CPU per request with neighbours ÷ alone at one sharing (neighbours + 1): median over
    the paired windows, its 95 % interval, and the number of pairs."""

    sharing: float
    ratio: float
    lo: float
    hi: float
    pairs: int


@dataclass(frozen=True)
class Crowding:
    mode: str
    rate: float
    size: int
    points: tuple[CrowdPoint, ...]
    note: str = ""


class CrowdError(RuntimeError):
    """A crowding window could not be measured (no request completed, no CPU time seen)."""


@dataclass(frozen=True)
class CrowdPolicy:
    """``neighbours``: the neighbour counts measured (each a group of paired windows);
    ``rate``: requests/s of the probed sidecar and of each neighbour; ``size``: message bytes;
    ``run_s``: seconds per window; pairs per group between ``min_pairs`` and ``max_pairs``,
    fewer once every ratio's interval is within ±``rel_halfwidth`` or ``budget_s`` is spent."""

    neighbours: tuple[int, ...] = (1, 3, 7)
    rate: float = 100.0
    size: int = 100
    run_s: float = 2.0
    min_pairs: int = 4
    max_pairs: int = 8
    rel_halfwidth: float = 0.05
    budget_s: float | None = 180.0

    def __post_init__(self) -> None:
        ks = self.neighbours
        if not ks or any(k < 1 for k in ks) or list(ks) != sorted(set(ks)):
            raise ValueError(f"neighbour counts must be increasing and ≥ 1, got {ks}")
        if self.rate <= 0 or self.run_s <= 0 or self.size < 1:
            raise ValueError("crowding rate, run_s and size must be positive")

    def expected_s(self) -> float:
        """Seconds the measurement should take (set-up, warm-up, the minimum of pairs)."""
        per_round = sum(2 * self.run_s + 0.3 for _ in self.neighbours)
        return 4.0 + 0.5 * (1 + max(self.neighbours)) + self.min_pairs * per_round

    def to_dict(self) -> dict[str, object]:
        return {
            "neighbours": list(self.neighbours),
            "rate": self.rate,
            "size": self.size,
            "run_s": self.run_s,
            "min_pairs": self.min_pairs,
            "max_pairs": self.max_pairs,
            "rel_halfwidth": self.rel_halfwidth,
            "budget_s": self.budget_s,
        }


@dataclass
class Neighbours:
    """Neighbour pods of a bed, made once and reused by every mode (their sidecars are per mode)."""

    bed: EchoBed
    pods: list[Pod] = field(default_factory=list)

    def ensure(self, k: int) -> list[Pod]:
        while len(self.pods) < k:
            pod = self.bed.testbed.add_pod(f"crowd{len(self.pods)}")
            self.pods.append(pod)
        return self.pods[:k]

    def start(self, mode: Mode, k: int) -> list[EnvoyProcess]:
        """A sidecar of ``mode`` in each of ``k`` neighbour pods, on the sidecars' CPUs,
        forwarding to the bed's echo app; meshed the first time a pod is used."""
        bed = self.bed
        cfg = EnvoyConfig(mode=mode, inbound_upstream=(bed.server.ip, APP_PORTS[mode]))
        out = []
        for i, pod in enumerate(self.ensure(k)):
            work = bed.workdir / f"crowd{i}-{mode.value}"
            start = start_sidecar if pod.name in bed.testbed.meshed else mesh_pod
            out.append(
                start(bed.testbed, pod, cfg, work, cpus=bed.pinning.sidecars, binary=bed.envoy_bin)
            )
        return out


@dataclass(frozen=True)
class CrowdWindow:
    """One window: the probed sidecar's requests and CPU-ns, and the neighbours' requests."""

    requests: int
    cpu_ns: int
    neighbour_requests: int

    @property
    def cpu_us_per_request(self) -> float:
        return self.cpu_ns / 1000.0 / self.requests


def _ratios(paired: Paired[CrowdWindow], k: int) -> list[float]:
    return [c.cpu_us_per_request / a.cpu_us_per_request for a, c in paired.pairs("alone", f"k{k}")]


def crowd_points(paired: Paired[CrowdWindow], neighbours: Sequence[int]) -> tuple[CrowdPoint, ...]:
    """One point per neighbour count: the ratio crowded ÷ alone of each pair, median and
    95 % interval (the order statistics' interval; it reaches 95 % from 6 pairs on)."""
    points = []
    for k in neighbours:
        ratios = _ratios(paired, k)
        if ratios:
            e = estimate(ratios)
            points.append(CrowdPoint(float(k + 1), e.median, e.lo, e.hi, len(ratios)))
    return tuple(points)


def _narrow(paired: Paired[CrowdWindow], policy: CrowdPolicy) -> bool:
    """Every ratio's 95 % interval within ±``rel_halfwidth`` of its median."""
    for k in policy.neighbours:
        e = estimate(_ratios(paired, k) or [1.0])
        if e.coverage < 0.95 or (e.hi - e.lo) / 2 > policy.rel_halfwidth * e.median:
            return False
    return True


def measure_crowding(
    bed: EchoBed,
    neighbours: Neighbours,
    mode: Mode,
    policy: CrowdPolicy,
    *,
    cpu_of: Callable[[Sequence[int]], Mapping[int, int]] = procfs.cpu_ns,
    load: Callable[[str, Mode, int, float, float], LoadResult] | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[Crowding, Paired[CrowdWindow]]:
    """Measure ``mode``'s crowding (see the module docstring); the probed sidecar and the
    neighbours' sidecars are started here and stopped before returning."""
    client = bed.client.place(cpus=bed.pinning.client)

    def one_load(target: str, m: Mode, size: int, qps: float, seconds: float) -> LoadResult:
        return run_load(
            target, m, size, qps, duration_s=seconds, system=bed.testbed.system, place=client,
            binary=bed.fortio_bin,
        )  # fmt: skip

    run = load or one_load
    probed = bed.start_sidecar(mode, name=f"crowd-{mode.value}")
    crowd = neighbours.start(mode, max(policy.neighbours))
    try:
        pid = probed.pid
        targets = [f"{p.ip}:{SERVICE_PORT}" for p in neighbours.pods]
        # warm every path once (connections, Envoy's first-request work)
        for t in (bed.meshed_target, *targets[: max(policy.neighbours)]):
            run(t, mode, policy.size, policy.rate, 0.5)

        def window(name: str) -> CrowdWindow:
            k = 0 if name == "alone" else int(name[1:])
            jobs = [bed.meshed_target, *targets[:k]]
            before = sum(cpu_of([pid]).values())
            with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
                res = list(
                    pool.map(lambda t: run(t, mode, policy.size, policy.rate, policy.run_s), jobs)
                )
            after = sum(cpu_of([pid]).values())
            if res[0].count <= 0 or after <= before:
                raise CrowdError(
                    f"{mode.value} crowding window {name}: {res[0].count} requests, "
                    f"{after - before} ns of sidecar CPU"
                )
            return CrowdWindow(res[0].count, after - before, sum(r.count for r in res[1:]))

        paired = paired_runs(
            [("alone", f"k{k}") for k in policy.neighbours],
            window,
            PairPolicy(policy.min_pairs, policy.max_pairs, policy.budget_s),
            narrow=lambda p: _narrow(p, policy),
            progress=progress,
        )
    finally:
        for e in (probed, *crowd):
            e.stop()
    points = crowd_points(paired, policy.neighbours)
    if not points:
        raise CrowdError(f"{mode.value}: no crowding pair completed")
    note = (
        f"{len(paired.groups)} paired windows of {policy.run_s:g} s at {policy.rate:g} "
        f"requests/s, {policy.size} B, neighbours {', '.join(map(str, policy.neighbours))}; "
        f"stopped: {paired.stop}"
    )
    return Crowding(mode.value, policy.rate, policy.size, points, note), paired


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--modes", default="tcp,http,grpc")
    ap.add_argument("--neighbours", default="1,3,7")
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--run-s", type=float, default=2.0)
    a = ap.parse_args()
    policy = CrowdPolicy(tuple(int(k) for k in a.neighbours.split(",")), rate=a.rate, run_s=a.run_s)
    system = RealSystem()
    with Testbed(system) as tb, echo_testbed(tb, default_pinning()) as bed:
        crowd = Neighbours(bed)
        for m in a.modes.split(","):
            got, _ = measure_crowding(bed, crowd, Mode(m), policy, progress=print)
            print(got.note)
            for p in got.points:
                print(
                    f"{m}: sharing {p.sharing:g}: ratio {p.ratio:.3f} "
                    f"[{p.lo:.3f}, {p.hi:.3f}] ({p.pairs} pairs)"
                )


if __name__ == "__main__":
    main()
