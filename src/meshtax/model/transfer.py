"""The profile's transfer to applications (pure): a factor per cost model, measured on a
calibration set.

A quick profile measures one sidecar in a one-hop bed. On multi-service applications of the
same machine, in the same sitting, its per-message costs come out off by a factor common to
the applications but not to the profile's models: −17…−28 % overall in suite runs 4 and 5 of
2026-11-26 (BENCHMARKS.md, "Validation suite with a hold-out"), while the cases scatter ±10 %
around it; each model's low-rate runs scatter on their own (three quick profiles within an hour:
±15–20 % per mode). So the validation suite measures the factor on its calibration set and
predicts the hold-out set with it. One factor per *cost model* the engine prices a message with
(:func:`key`): the mode's own (``tcp``, ``http``, ``grpc``), or, for a tcp-mode sidecar carrying
an application protocol it has a model of, that model (``tcp+grpc``, ``tcp+http``): they come
from separate runs of the profile.

A case's per-message CPU predicted is a sum over models, ``Σ_k parts[k]``, plus what the factor
does not scale (``fixed``: the idle sidecars' CPU, measured per second, not per message). A
model's factor is the median over the calibration cases it dominates (≥ half of the case's
per-message CPU) of ``(measured − fixed − Σ_{j≠k} f_j · parts[j]) ÷ parts[k]`` — the other
models at their own factors, iterated to a fixed point. A model that dominates no case takes
its mode's factor (``tcp+grpc`` → ``tcp``), or 1. The engine multiplies every per-message cost
of a message priced by model ``k`` by ``f_k``. It is a measured correction, not a physical
model: the suite shows whether it transfers (hold-out set; leaving out one calibration topology
at a time).

Latency may have factors of its own (``Transfer.latency``), fitted the same way on the
calibration cases' latency overheads: the CPU factor applied to latency too raised hold-out
latency the profile alone had right in suite run 9 (20.3 vs 12.9 % median absolute error,
BENCHMARKS.md) — what a message costs in CPU and what it adds to a request's latency on a
shared CPU need not move alike from the one-hop bed to an application. The engine then prices a
request's latency (its crossings and the shared-CPU bound's work) with the latency factors and
its CPU with the CPU factors. Without latency factors both take the CPU factors.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshtax.model.sidecar import Mode
from meshtax.model.stats import estimate

__all__ = [
    "KeyTransfer",
    "Transfer",
    "TransferSample",
    "fit_factors",
    "fit_transfer",
    "key",
    "loto_errors",
]

#: a model dominates a case when it carries at least this share of its per-message CPU
DOMINANT = 0.5
_ROUNDS = 20


def key(mode: Mode, carried: str = "") -> str:
    """The cost model a message is priced with: ``mode``'s own, or the tcp mode's model of the
    application protocol ``carried`` on the wire (when the profile has one)."""
    return f"{mode.value}+{carried}" if carried and mode is Mode.TCP else mode.value


@dataclass(frozen=True)
class TransferSample:
    """One calibration case: its topology, the measured CPU overhead per request, the
    per-message CPU predicted per cost model (:func:`key`) and the CPU predicted that no factor
    scales (``fixed``: idle sidecars), all µs per request — or the same of its latency
    overhead (p50), for latency's own factors."""

    topology: str
    measured: float
    parts: Mapping[str, float]
    fixed: float = 0.0

    @property
    def per_message(self) -> float:
        return sum(self.parts.values())

    def dominant(self) -> str | None:
        """The model carrying at least :data:`DOMINANT` of the per-message CPU, if any."""
        total = self.per_message
        if total <= 0:
            return None
        k, v = max(self.parts.items(), key=lambda kv: kv[1])
        return k if v >= DOMINANT * total else None

    def predicted(self, factors: Mapping[str, float]) -> float:
        return self.fixed + sum(factor(factors, k) * v for k, v in self.parts.items())


def factor(factors: Mapping[str, float], k: str) -> float:
    """``k``'s factor, else its mode's (``tcp+grpc`` → ``tcp``), else 1."""
    if k in factors:
        return factors[k]
    return factors.get(k.split("+", 1)[0], 1.0)


def _ratios(
    samples: Sequence[TransferSample], factors: Mapping[str, float]
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for s in samples:
        k = s.dominant()
        if k is None:
            continue
        rest = sum(factor(factors, j) * v for j, v in s.parts.items() if j != k)
        out.setdefault(k, []).append((s.measured - s.fixed - rest) / s.parts[k])
    return out


def fit_factors(samples: Sequence[TransferSample]) -> dict[str, list[float]]:
    """Per model that dominates a sample: the ratios its factor is the median of, at the fixed
    point of the other models' factors (see the module docstring)."""
    factors: dict[str, float] = {}
    ratios = _ratios(samples, factors)
    for _ in range(_ROUNDS):
        new = {k: statistics.median(rs) for k, rs in ratios.items()}
        if all(abs(new[k] - factors.get(k, 0.0)) < 1e-9 for k in new):
            break
        factors = new
        ratios = _ratios(samples, factors)
    return ratios


@dataclass(frozen=True)
class KeyTransfer:
    """One model's factor: the median ratio over the calibration cases it dominates, the order
    statistics' interval around it (``coverage``: its confidence, below 95 % under 6 cases)."""

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
    def from_dict(cls, d: Mapping[str, Any]) -> KeyTransfer:
        return cls(
            float(d["factor"]),
            float(d["lo"]),
            float(d["hi"]),
            int(d["cases"]),
            float(d.get("coverage", 0.0)),
        )


@dataclass(frozen=True)
class Transfer:
    """Per cost model (:func:`key`), the factor the profile's per-message costs take on
    applications; ``source``: where it was measured (suite, set, dates)."""

    factors: Mapping[str, KeyTransfer] = field(default_factory=dict)
    source: str = ""
    #: latency's own factors (see the module docstring); empty: latency takes ``factors``
    latency: Mapping[str, KeyTransfer] = field(default_factory=dict)

    def factor(self, k: str) -> float:
        """``k``'s factor, else its mode's, else 1 (a model the calibration did not measure)."""
        return _lookup(self.factors, k)

    def latency_factor(self, k: str) -> float:
        """``k``'s latency factor (as :meth:`factor`), or its CPU factor without latency ones."""
        return _lookup(self.latency, k) if self.latency else self.factor(k)

    def describe(self) -> str:
        out = f"per-message costs scaled by the transfer measured on {self.source}: "
        if not self.latency:
            return out + _describe(self.factors)
        return out + f"CPU {_describe(self.factors)}; latency {_describe(self.latency)}"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "source": self.source,
            "factors": {k: t.to_dict() for k, t in self.factors.items()},
        }
        if self.latency:
            d["latency_factors"] = {k: t.to_dict() for k, t in self.latency.items()}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Transfer:
        # the first transfers (one factor per mode) wrote them under "modes": a mode is a key
        per = d["factors"] if "factors" in d else d["modes"]
        lat = d.get("latency_factors") or {}
        return cls(
            {str(k): KeyTransfer.from_dict(v) for k, v in per.items()},
            str(d["source"]),
            {str(k): KeyTransfer.from_dict(v) for k, v in lat.items()},
        )


def _lookup(factors: Mapping[str, KeyTransfer], k: str) -> float:
    t = factors.get(k) or factors.get(k.split("+", 1)[0])
    return 1.0 if t is None else t.factor


def _describe(factors: Mapping[str, KeyTransfer]) -> str:
    return ", ".join(
        f"{k} ×{t.factor:.2f} [{t.lo:.2f}, {t.hi:.2f}] ({t.cases} cases)"
        for k, t in factors.items()
    )


def fit_transfer(
    samples: Iterable[TransferSample],
    source: str,
    latency: Iterable[TransferSample] | None = None,
) -> Transfer:
    """The transfer of ``samples`` (CPU; see the module docstring), each factor with its
    interval, and with ``latency`` samples (the same cases' latency overheads) latency's own
    factors. A CPU factor must come out positive; when a latency factor does not, latency
    keeps the CPU factors and ``source`` says why."""
    out = _fit(samples, "CPU")
    lat: dict[str, KeyTransfer] = {}
    if latency is not None:
        try:
            lat = _fit(latency, "latency")
        except ValueError as e:
            source = f"{source}; latency at the CPU factors ({e})"
    return Transfer(out, source, lat)


def _fit(samples: Iterable[TransferSample], what: str) -> dict[str, KeyTransfer]:
    ratios = fit_factors([s for s in samples if s.per_message > 0])
    out = {}
    for k, rs in sorted(ratios.items()):
        e = estimate(rs)
        if e.median <= 0:
            raise ValueError(
                f"{k}: the calibration cases measured less {what} than the rest of their "
                f"prediction (median ratio {e.median:.2f}): no transfer factor"
            )
        out[k] = KeyTransfer(e.median, e.lo, e.hi, len(rs), e.coverage)
    if not out:
        raise ValueError(
            f"no calibration case with a per-message {what} prediction: no transfer factor"
        )
    return out


def loto_errors(samples: Sequence[TransferSample]) -> list[float]:
    """Leave one topology out: each sample's CPU error when its topology's cases are left out
    of the fit (a model without other cases keeps its mode's factor, or 1)."""
    errs = []
    for topo in dict.fromkeys(s.topology for s in samples):
        rest = [s for s in samples if s.topology != topo and s.per_message > 0]
        f = {k: statistics.median(rs) for k, rs in fit_factors(rest).items()}
        errs += [
            s.predicted(f) / s.measured - 1.0
            for s in samples
            if s.topology == topo and s.measured > 0
        ]
    return errs
