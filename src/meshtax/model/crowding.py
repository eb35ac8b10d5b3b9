"""How a sidecar's per-message cost changes when other sidecars share its CPU (pure).

A sidecar alone on a CPU at a low rate wakes cold for every message: its code, data and the
kernel's paths were evicted since the last one. Neighbours on the same CPU running the same
proxy binary and the same kernel paths keep part of that warm; other work evicts it. Which
wins is a property of the platform, measured by the profiler (:mod:`meshtax.profile.crowding`):
the probed sidecar at ``rate`` requests/s alone and with neighbour pods (a sidecar each, same
CPU, same rate), paired windows, the probed sidecar's own CPU time per request in each.

``sharing`` is how many times more traffic the CPU carries than the sidecar itself
(``r_cpu / r_own`` in one-hop terms: 1 alone, ``K + 1`` with ``K`` equally loaded neighbours);
:meth:`Crowding.factor` is the measured cost ratio at a sharing, interpolated in ``ln sharing``
between the measured points (1 at sharing 1, held constant beyond the largest measured).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["CrowdPoint", "Crowding"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class CrowdPoint:
    """The probed sidecar's CPU per request with neighbours ÷ alone, at one sharing: median
    over paired windows and its 95 % interval."""

    sharing: float
    ratio: float
    lo: float
    hi: float
    pairs: int

    def __post_init__(self) -> None:
        if not (self.sharing > 1.0 and np.isfinite(self.sharing)):
            raise ValueError(f"crowding sharing must be > 1, got {self.sharing!r}")
        for name in ("ratio", "lo", "hi"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 < v < 1e3):
                raise ValueError(f"crowding {name} must be a positive ratio, got {v!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "sharing": self.sharing,
            "ratio": self.ratio,
            "lo": self.lo,
            "hi": self.hi,
            "pairs": self.pairs,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CrowdPoint:
        return cls(
            float(d["sharing"]), float(d["ratio"]), float(d["lo"]), float(d["hi"]), int(d["pairs"])
        )


@dataclass(frozen=True)
class Crowding:
    """Measured crowding of one mode: points at increasing sharing, the own rate and message
    size they were measured at, and how."""

    mode: str
    rate: float
    size: int
    points: tuple[CrowdPoint, ...]
    note: str = ""

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("crowding needs at least one measured point")
        s = [p.sharing for p in self.points]
        if s != sorted(s) or len(set(s)) != len(s):
            raise ValueError(f"crowding points must have increasing sharing, got {s}")

    def factor(self, sharing: FloatArray) -> FloatArray:
        """The cost multiplier at each ``sharing`` (≤ 1: no neighbours, factor 1)."""
        x = np.log(np.concatenate(([1.0], [p.sharing for p in self.points])))
        y = np.log(np.concatenate(([1.0], [p.ratio for p in self.points])))
        s = np.log(np.maximum(np.asarray(sharing, dtype=np.float64), 1.0))
        return np.asarray(np.exp(np.interp(s, x, y)), dtype=np.float64)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "rate": self.rate,
            "size": self.size,
            "points": [p.to_dict() for p in self.points],
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Crowding:
        return cls(
            str(d["mode"]),
            float(d["rate"]),
            int(d["size"]),
            tuple(CrowdPoint.from_dict(p) for p in d["points"]),
            str(d.get("note", "")),
        )
