"""One-hop sweeps (the paper's Figures 10 and 11): message size 100 B → 64 KB at a fixed rate,
or rate 25 → 100 % of the no-mesh maximum, measured on the one-hop echo bed
(:func:`~meshtax.testbed.bed.echo_testbed`: the same echo app reached directly and through the
sidecar) and predicted from the profile.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.testbed import procfs
from meshtax.testbed.bed import echo_testbed
from meshtax.testbed.paired import PairPolicy
from meshtax.testbed.pinning import Pinning
from meshtax.testbed.pods import Testbed
from meshtax.validate.pairing import measure_pairs
from meshtax.validate.prediction import one_hop
from meshtax.validate.result import CaseResult, Predicted, RunSample, ValidationResult

__all__ = ["SweepPoint", "SweepResult", "run_sweep"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep: x (bytes or fraction of the no-mesh max) and its paired runs."""

    x: float
    size_bytes: int
    rate: float
    pairs: tuple[tuple[RunSample, RunSample], ...]
    predicted: Predicted


@dataclass(frozen=True)
class SweepResult:
    """A one-hop sweep: client (no mesh) → echo server with a sidecar in ``mode``."""

    kind: Literal["size", "rate"]
    mode: str
    points: tuple[SweepPoint, ...]
    profile: str
    max_qps_no_mesh: float = 0.0
    machine: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    def cases(self) -> list[CaseResult]:
        out = []
        for p in self.points:
            label = (
                f"{p.size_bytes} B" if self.kind == "size" else f"{p.x:.0%} of max ({p.rate:.0f}/s)"
            )
            out.append(
                CaseResult(f"one-hop {self.kind}", label, self.mode, p.rate, p.pairs, p.predicted)
            )
        return out

    def to_document(self) -> dict[str, Any]:
        v = ValidationResult(
            f"sweep-{self.kind}-{self.mode}",
            tuple(self.cases()),
            self.profile,
            self.machine,
            self.options,
        )
        doc = v.to_document()
        doc["sweep"] = {
            "kind": self.kind,
            "mode": self.mode,
            "x": [p.x for p in self.points],
            "max_qps_no_mesh": self.max_qps_no_mesh,
        }
        return doc


def run_sweep(
    kind: Literal["size", "rate"],
    tb: Testbed,
    profile: Profile,
    pinning: Pinning,
    machine: Mapping[str, Any],
    *,
    mode: Mode = Mode.HTTP,
    sizes: Sequence[int] = (100, 1024, 4096, 16384, 65536),
    fractions: Sequence[float] = (0.25, 0.5, 0.75, 1.0),
    rate: float = 200.0,
    size_bytes: int = 100,
    duration_s: float = 2.0,
    policy: PairPolicy = PairPolicy(6, 8),
    progress: Progress | None = None,
) -> SweepResult:
    """One hop in the open testbed ``tb``: fortio client → the echo app directly (no mesh) and
    through a sidecar in ``mode``. ``size``: request = response = each of ``sizes`` at
    ``rate``; ``rate``: ``size_bytes`` at each of ``fractions`` of the no-mesh maximum."""
    say = progress or (lambda _m: None)
    mode = Mode(mode)
    points: list[SweepPoint] = []
    max_qps = 0.0
    with echo_testbed(tb, pinning) as bed:
        envoy = bed.start_sidecar(mode)
        targets = {"no_mesh": bed.direct_target(mode), "mesh": bed.meshed_target}
        pids = {"no_mesh": [bed.app_pid], "mesh": [bed.app_pid, envoy.pid]}

        def measure(size: int, qps: float) -> list[tuple[RunSample, RunSample]]:
            for t in targets.values():
                bed.load(t, mode, size, qps, n=200)

            def one(side: str) -> RunSample:
                before = procfs.cpu_ns(pids[side])
                r = bed.load(targets[side], mode, size, qps, duration_s=duration_s)
                after = procfs.cpu_ns(pids[side])
                app = after[bed.app_pid] - before[bed.app_pid]
                sc = after[envoy.pid] - before[envoy.pid] if side == "mesh" else 0
                lat = (r.p50_us, r.p90_us, r.avg_us)
                return RunSample(*lat, r.count, r.actual_qps, r.duration_s, {"echo": app + sc}, sc)

            return measure_pairs(one, policy)[0]

        def predicted(size: int, actual: float) -> Predicted:
            return one_hop(profile, SidecarConfig(mode), size, actual, pod_cpus=pinning.pod_cpus())

        if kind == "size":
            for s in sizes:
                say(f"sweep size {s} B")
                pairs = measure(s, rate)
                actual = _median_rate(pairs)
                points.append(SweepPoint(float(s), s, actual, tuple(pairs), predicted(s, actual)))
        else:
            for t in targets.values():
                bed.load(t, mode, size_bytes, 0.0, n=500)
            max_qps = bed.load(
                targets["no_mesh"], mode, size_bytes, duration_s=duration_s
            ).actual_qps
            for f in fractions:
                say(f"sweep rate {f:.0%} of {max_qps:.0f}/s")
                pairs = measure(size_bytes, f * max_qps)
                actual = _median_rate(pairs)
                points.append(
                    SweepPoint(f, size_bytes, actual, tuple(pairs), predicted(size_bytes, actual))
                )
        envoy.stop()
    opts = {
        "kind": kind,
        "mode": mode.value,
        "sizes": list(sizes),
        "fractions": list(fractions),
        "rate": rate,
        "size_bytes": size_bytes,
        "duration_s": duration_s,
        "pinning": pinning.describe(),
    }
    return SweepResult(kind, mode.value, tuple(points), profile.name, max_qps, dict(machine), opts)


def _median_rate(pairs: Sequence[tuple[RunSample, RunSample]]) -> float:
    """The rate both sides achieved (the mesh side may fall short near the maximum)."""
    return statistics.median(min(b.actual_qps, m.actual_qps) for b, m in pairs)
