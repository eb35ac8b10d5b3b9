"""What a profile knows about a sidecar under load: its capacity (requests/s at saturation) and
the distribution of the latency it adds per request (a quantile sketch), per mode.

Both are optional parts of a :class:`~meshtax.model.profile.ModeProfile` (``capacity``,
``latency_sketches``); profiles without them load unchanged. Measured by
:mod:`meshtax.profile.capacity`; used by :mod:`meshtax.predict.tail`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LIMITS",
    "SKETCH_PROBS",
    "Capacity",
    "CapacityPoint",
    "LatencySketch",
    "sketches_from_list",
]

#: the quantiles a latency sketch keeps: the extremes, the deciles and the tail
SKETCH_PROBS: tuple[float, ...] = (
    0.0,
    0.01,
    0.05,
    0.1,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.7,
    0.8,
    0.9,
    0.95,
    0.99,
    0.999,
    1.0,
)


@dataclass(frozen=True)
class LatencySketch:
    """Per-request latency quantiles (µs) at ``probs`` of one message size's paired closed-loop
    runs (one request in flight), through the sidecar (``meshed_us``) and without it
    (``direct_us``), over ``requests`` requests on each side."""

    size: int
    probs: tuple[float, ...]
    meshed_us: tuple[float, ...]
    direct_us: tuple[float, ...]
    requests: int = 0

    def __post_init__(self) -> None:
        if not len(self.probs) == len(self.meshed_us) == len(self.direct_us) >= 2:
            raise ValueError("a latency sketch needs one meshed and one direct value per quantile")

    def overhead_us(self) -> tuple[float, ...]:
        """Meshed − direct at each quantile: the overhead's quantiles if a request slow on one
        side is slow on the other (the sketch keeps both sides, so another coupling can be
        derived)."""
        return tuple(m - d for m, d in zip(self.meshed_us, self.direct_us))

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "probs": list(self.probs),
            "meshed_us": list(self.meshed_us),
            "direct_us": list(self.direct_us),
            "requests": self.requests,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LatencySketch:
        return cls(
            int(d["size"]),
            tuple(float(x) for x in d["probs"]),
            tuple(float(x) for x in d["meshed_us"]),
            tuple(float(x) for x in d["direct_us"]),
            int(d.get("requests", 0)),
        )


@dataclass(frozen=True)
class CapacityPoint:
    """One load run of a capacity measurement: ``target`` requests/s (0: as fast as the client
    goes), what was achieved, CPU-s/s of the sidecar and of every process on its CPUs, the
    client's p50/p99 (µs) and, when kept, its latency quantiles at :data:`SKETCH_PROBS`."""

    target: float
    achieved: float
    sidecar_cpu: float
    shared_cpu: float
    p50_us: float = 0.0
    p99_us: float = 0.0
    meshed: bool = True
    quantiles_us: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "achieved": self.achieved,
            "sidecar_cpu": self.sidecar_cpu,
            "shared_cpu": self.shared_cpu,
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
            "meshed": self.meshed,
            **({"quantiles_us": list(self.quantiles_us)} if self.quantiles_us else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CapacityPoint:
        return cls(
            float(d["target"]),
            float(d["achieved"]),
            float(d["sidecar_cpu"]),
            float(d["shared_cpu"]),
            float(d.get("p50_us", 0.0)),
            float(d.get("p99_us", 0.0)),
            bool(d.get("meshed", True)),
            tuple(float(x) for x in d.get("quantiles_us", ())),
        )


#: what bounded the rate of a capacity measurement
LIMITS = ("sidecar", "shared-cpu", "client")


@dataclass(frozen=True)
class Capacity:
    """A sidecar under as much load as ``connections`` concurrent clients give it.

    ``requests_per_s``: the highest rate sustained through the sidecar (``size_bytes`` each
    way); ``sidecar_cpu_us``: the sidecar's CPU-µs per request there (both crossings);
    ``workers``: its worker threads; ``cpus``: the CPUs the sidecar and the app share;
    ``limited_by``: ``sidecar`` (its workers were busy ≥ the measurement's threshold),
    ``shared-cpu`` (sidecar and app together filled their CPUs) or ``client`` (neither: the
    load generator or the network set the rate); ``direct_requests_per_s``: the same client
    without the sidecar; ``points``: every run (of the closed loop's, the median run per
    side); ``closed_loop``: the rates of every closed-loop run, (without, through) the sidecar;
    ``repeats``: the ramp's top fixed-rate runs measured again (each a run without the sidecar
    then one through it at the same target as the ramp's, in rounds before and after the
    ramp), not in ``points`` — more draws of the queue there (issue #20, set 19; older
    profiles have none).
    """

    requests_per_s: float
    size_bytes: int
    connections: int
    workers: int
    sidecar_cpu_us: float
    limited_by: str
    direct_requests_per_s: float = 0.0
    cpus: int = 1
    points: tuple[CapacityPoint, ...] = ()
    closed_loop: tuple[tuple[float, float], ...] = ()
    repeats: tuple[CapacityPoint, ...] = ()

    def __post_init__(self) -> None:
        if self.limited_by not in LIMITS:
            raise ValueError(f"limited_by {self.limited_by!r}: expected one of {LIMITS}")

    def cpu_samples(self) -> tuple[tuple[float, float], ...]:
        """(requests/s, CPU-µs per request the mesh adds on the pods' CPUs) of every run through
        the sidecar, ascending in rate: the sidecar's CPU, plus how the app's changed where a
        run without the sidecar at the same fixed rate measured it (each point's ``shared_cpu``
        is the sidecar's and the app's; a direct point's, the app's alone)."""
        direct = {p.target: p for p in self.points if not p.meshed and p.target > 0}
        out = []
        for p in self.points:
            if not p.meshed or p.achieved <= 0:
                continue
            us = p.sidecar_cpu / p.achieved * 1e6
            d = direct.get(p.target) if p.target > 0 else None
            if d is not None and d.achieved > 0:
                app_mesh = (p.shared_cpu - p.sidecar_cpu) / p.achieved
                us += (app_mesh - d.shared_cpu / d.achieved) * 1e6
            out.append((p.achieved, us))
        return tuple(sorted(out))

    @property
    def worker_requests_per_s(self) -> float:
        """What the workers could serve with a CPU each and nothing else on it (from the CPU
        per request at saturation): the sidecar-bound capacity."""
        return 1e6 * self.workers / self.sidecar_cpu_us if self.sidecar_cpu_us > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests_per_s": self.requests_per_s,
            "size_bytes": self.size_bytes,
            "connections": self.connections,
            "workers": self.workers,
            "sidecar_cpu_us": self.sidecar_cpu_us,
            "limited_by": self.limited_by,
            "direct_requests_per_s": self.direct_requests_per_s,
            "cpus": self.cpus,
            "points": [p.to_dict() for p in self.points],
            **({"closed_loop": [list(x) for x in self.closed_loop]} if self.closed_loop else {}),
            **({"repeats": [p.to_dict() for p in self.repeats]} if self.repeats else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Capacity:
        return cls(
            float(d["requests_per_s"]),
            int(d["size_bytes"]),
            int(d["connections"]),
            int(d["workers"]),
            float(d["sidecar_cpu_us"]),
            str(d["limited_by"]),
            float(d.get("direct_requests_per_s", 0.0)),
            int(d.get("cpus", 1)),
            tuple(CapacityPoint.from_dict(p) for p in d.get("points", ())),
            tuple((float(a), float(b)) for a, b in d.get("closed_loop", ())),
            tuple(CapacityPoint.from_dict(p) for p in d.get("repeats", ())),
        )


def sketches_from_list(d: Sequence[Mapping[str, Any]] | None) -> dict[int, LatencySketch]:
    """``{size: sketch}`` from a document's list of sketches (absent: none)."""
    out: dict[int, LatencySketch] = {}
    for x in d or ():
        s = LatencySketch.from_dict(x)
        out[s.size] = s
    return out
