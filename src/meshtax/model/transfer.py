"""The profile's transfer to applications (pure): a per-mode factor measured on a calibration set.

A quick profile measures one sidecar in a one-hop bed. On multi-service applications of the
same machine, in the same sitting, its per-message costs come out off by a common factor per
mode: −17…−28 % in four suite runs of 2026-11-26 (BENCHMARKS.md, "Validation suite with a
hold-out"), while the spread of the cases around that bias is ±10 %. The factor moves from
profile to profile (per mode ±15–20 %: the quick profile's short low-rate runs) and from day to
day; within a sitting it is common to the applications. So the validation suite measures it on
its calibration set and the hold-out set is predicted with it:

``factor[mode] = median over the calibration cases of that mode of
(measured CPU − CPU the prediction does not scale) ÷ per-message CPU predicted``

The part not scaled is the idle sidecars' CPU (measured by the profile per second, not per
message). The per-message costs of every component of that mode (the sidecar's own mode: a
tcp-mode sidecar carrying gRPC takes the tcp factor) are multiplied by it, latency and CPU
alike (on shared CPUs a request's latency overhead is its CPU work). It is a measured
correction, not a physical model: it says how far this sitting's applications are from the
one-hop bed, and the suite shows that it transfers across applications (hold-out set, and
leaving out one calibration topology at a time).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshtax.model.sidecar import Mode
from meshtax.model.stats import estimate

__all__ = ["ModeTransfer", "Transfer", "TransferSample", "fit_transfer", "loto_errors"]


@dataclass(frozen=True)
class TransferSample:
    """One calibration case: its topology, the sidecars' mode, the measured CPU overhead per
    request, and the prediction split into the part the factor scales (``per_message``) and
    the part it does not (``fixed``: idle sidecars), all µs per request."""

    topology: str
    mode: Mode
    measured: float
    per_message: float
    fixed: float

    @property
    def ratio(self) -> float:
        return (self.measured - self.fixed) / self.per_message


@dataclass(frozen=True)
class ModeTransfer:
    """One mode's factor: the median ratio over its calibration cases, the order statistics'
    interval around it (``coverage``: that interval's confidence, below 95 % under 6 cases)."""

    factor: float
    lo: float
    hi: float
    cases: int
    coverage: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "factor": self.factor,
            "lo": self.lo,
            "hi": self.hi,
            "cases": self.cases,
            "coverage": self.coverage,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModeTransfer:
        return cls(
            float(d["factor"]),
            float(d["lo"]),
            float(d["hi"]),
            int(d["cases"]),
            float(d.get("coverage", 0.0)),
        )


@dataclass(frozen=True)
class Transfer:
    """Per mode, the factor a profile's per-message costs take on applications; ``source``:
    where it was measured (suite, set, date)."""

    modes: Mapping[Mode, ModeTransfer]
    source: str

    def factor(self, mode: Mode) -> float:
        """``mode``'s factor (1 for a mode the calibration set did not have)."""
        t = self.modes.get(mode)
        return 1.0 if t is None else t.factor

    def describe(self) -> str:
        per = ", ".join(
            f"{m.value} ×{t.factor:.2f} [{t.lo:.2f}, {t.hi:.2f}] ({t.cases} cases)"
            for m, t in self.modes.items()
        )
        return f"per-message costs scaled by the transfer measured on {self.source}: {per}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "modes": {m.value: t.to_dict() for m, t in self.modes.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Transfer:
        return cls(
            {Mode(k): ModeTransfer.from_dict(v) for k, v in d["modes"].items()}, str(d["source"])
        )


def fit_transfer(samples: Iterable[TransferSample], source: str) -> Transfer:
    """Per mode, the median of the samples' ratios and its interval. Samples whose
    prediction has no per-message part are skipped; a factor must come out positive."""
    by: dict[Mode, list[float]] = {}
    for s in samples:
        if s.per_message > 0:
            by.setdefault(s.mode, []).append(s.ratio)
    modes = {}
    for m, rs in by.items():
        e = estimate(rs)
        if e.median <= 0:
            raise ValueError(
                f"{m.value}: the calibration cases measured less CPU than the idle sidecars "
                f"alone (median ratio {e.median:.2f}): no transfer factor"
            )
        modes[m] = ModeTransfer(e.median, e.lo, e.hi, len(rs), e.coverage)
    if not modes:
        raise ValueError("no calibration case with a per-message prediction: no transfer factor")
    return Transfer(modes, source)


def loto_errors(samples: Sequence[TransferSample]) -> list[float]:
    """Leave one topology out: each sample's CPU error when its topology's cases are left out
    of the fit (a mode without other cases keeps the factor 1)."""
    errs = []
    for topo in dict.fromkeys(s.topology for s in samples):
        rest = [s for s in samples if s.topology != topo]
        ratios: dict[Mode, list[float]] = {}
        for s in rest:
            if s.per_message > 0:
                ratios.setdefault(s.mode, []).append(s.ratio)
        f = {m: statistics.median(rs) for m, rs in ratios.items()}
        for s in samples:
            if s.topology == topo and s.measured > 0:
                pred = f.get(s.mode, 1.0) * s.per_message + s.fixed
                errs.append(pred / s.measured - 1.0)
    return errs
