"""Cost models in message size and rate: ``y(s, r) = a + b·s + u·extra_units(s) + d·ln(r_hi / r)``.

``a`` and ``b`` are the paper's ``L + s·l`` (latency, µs per message) or ``C + s·c`` (CPU,
CPU-µs per message; CPU at rate r is ``r·y(s, r)·1e-6`` vCPU). Above ``split_bytes`` a message
is carried as several units (TLS records, HTTP/2 DATA frames, socket buffer writes …); each
extra unit costs ``u``, so the model does not underestimate large messages the way a single
line through small sizes does.

Rate: a sidecar that handles few messages per second spends more CPU on each (every message
wakes an idle thread on a cold cache, nothing is batched per ``epoll_wait``; measured here:
~2× per request between 200/s and 3 000/s). When the samples span several rates, ``d`` is
fitted per e-fold of rate *below the highest profiled rate* ``r_hi``, so ``a`` stays the cost
at that rate (the saturated regime the paper's tables report). Predictions clamp ``r`` into the
profiled range ``[r_lo, r_hi]``: the model never extrapolates in rate.

Fit/predict as in scikit-learn: parameters at construction, fitted attributes after ``fit``.
Every fitted model keeps its fit statistics and the samples it was fitted on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

#: the model's parameters, in the order of ``FitStats.stderr`` and ``FitStats.cov``
PARAMS = "abud"


def extra_units(sizes: npt.ArrayLike, split_bytes: int | None) -> FloatArray:
    """Units beyond the first a message of ``sizes`` bytes is split into (0 without a split)."""
    s = np.asarray(sizes, dtype=np.float64)
    if not split_bytes:
        return np.zeros_like(s)
    return np.maximum(0.0, np.ceil(s / split_bytes) - 1.0)


@dataclass(frozen=True)
class FitStats:
    """How well a model fits the samples it was fitted on."""

    n: int
    r2: float | None
    residuals: tuple[float, ...]
    # standard errors of (a, b, u, d); None where not identifiable from the samples
    stderr: tuple[float | None, ...]
    # covariance of (a, b, u, d) (3×3 in documents written before the rate term: (a, b, u))
    cov: tuple[tuple[float, ...], ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "r2": self.r2,
            "residuals": list(self.residuals),
            "stderr": list(self.stderr),
            "cov": None if self.cov is None else [list(r) for r in self.cov],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FitStats:
        se = tuple(d.get("stderr") or ())
        cov = d.get("cov")
        return cls(
            n=int(d["n"]),
            r2=d.get("r2"),
            residuals=tuple(float(x) for x in d.get("residuals", ())),
            stderr=(*se, *(None,) * (len(PARAMS) - len(se)))[: len(PARAMS)],
            cov=None if cov is None else tuple(tuple(float(x) for x in r) for r in cov),
        )


@dataclass(frozen=True)
class Samples:
    """Raw observations a model was fitted on (sizes in bytes, rates in requests/s)."""

    sizes: tuple[float, ...]
    values: tuple[float, ...]
    rates: tuple[float, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "sizes": list(self.sizes),
            "values": list(self.values),
            "rates": None if self.rates is None else list(self.rates),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Samples:
        r = d.get("rates")
        return cls(tuple(d["sizes"]), tuple(d["values"]), None if r is None else tuple(r))


@dataclass(frozen=True)
class CostModel:
    """``y(s, r) = intercept + slope·s + per_unit·extra_units(s) + rate_coef·ln(rate_hi / r)``;
    see the module docstring.

    ``note`` says where unfitted parameters come from (e.g. "published; slope not published").
    ``rate_lo``/``rate_hi``: the profiled rate range (requests/s), set only with a rate term.
    """

    intercept: float = 0.0
    slope: float = 0.0
    split_bytes: int | None = None
    per_unit: float = 0.0
    rate_coef: float = 0.0
    rate_lo: float | None = None
    rate_hi: float | None = None
    stats: FitStats | None = None
    samples: Samples | None = None
    note: str = ""

    # ---- fit/predict -------------------------------------------------------------------
    @classmethod
    def fit(
        cls,
        sizes: npt.ArrayLike,
        values: npt.ArrayLike,
        *,
        split_bytes: int | None = None,
        rates: npt.ArrayLike | None = None,
        note: str = "",
    ) -> CostModel:
        """Least-squares fit; with one distinct size only the intercept is fitted (slope 0);
        with ``rates`` spanning at least two distinct positive values, also the rate term.

        The size terms (``slope``, ``per_unit``) are physical: a message does not get cheaper
        per byte. One that fits below zero is noise between sizes, and extrapolated it turns the
        cost negative a few MB on (a quick profile at load average 10: −1.1e7 µs at 1 GiB); it
        is held at 0 and the rest refitted (least squares under the constraint), said in
        ``note``."""
        s = np.asarray(sizes, dtype=np.float64)
        y = np.asarray(values, dtype=np.float64)
        if s.shape != y.shape or s.ndim != 1 or s.size == 0:
            raise ValueError(f"need equal-length 1-D sizes and values, got {s.shape} and {y.shape}")
        if not np.all(np.isfinite(y)):
            raise ValueError("values contain NaN or infinity")
        r = None if rates is None else np.asarray(rates, dtype=np.float64)
        if r is not None and r.shape != s.shape:
            raise ValueError(f"need one rate per sample, got {r.shape} for {s.shape}")
        if r is not None and not np.all(np.isfinite(r) & (r > 0)):
            raise ValueError("rates must be positive and finite")
        cols = [np.ones_like(s)]
        names = ["a"]
        if np.unique(s).size >= 2:
            cols.append(s)
            names.append("b")
        xu = extra_units(s, split_bytes)
        if split_bytes and np.unique(xu).size >= 2 and np.unique(s).size >= 3:
            cols.append(xu)
            names.append("u")
        r_lo = r_hi = None
        if r is not None and np.unique(r).size >= 2:
            xr = np.log(r.max() / r)
            # wherever the samples identify it (independent of the size terms), even with no
            # residual left: a profile's two rates at one size say how much more a message
            # costs at the lower one, and dropping that priced a tcp sidecar carrying gRPC at
            # the mean of 87 and 323 CPU-µs at every rate (BENCHMARKS.md, issue #14)
            if np.linalg.matrix_rank(np.column_stack([*cols, xr])) == len(cols) + 1:
                r_lo, r_hi = float(r.min()), float(r.max())
                cols.append(xr)
                names.append("d")
        held: list[str] = []
        floor = bool(np.all(y >= 0))  # costs measured ≥ 0 make a model ≥ 0 wherever it prices
        span = math.log(r_hi / r_lo) if r_lo and r_hi else 0.0
        while True:
            X = np.column_stack(cols)
            beta, *_ = np.linalg.lstsq(X, y, rcond=None)
            neg = [j for j, k in enumerate(names) if k in "bu" and beta[j] < 0]
            if neg:
                j = min(neg, key=lambda i: beta[i] * (np.abs(cols[i]).max() or 1.0))
                held.append(f"{'slope' if names[j] == 'b' else 'per-unit'} {beta[j]:.3g}")
                del cols[j], names[j]
                continue
            # with the size terms ≥ 0 the lowest value is at size 0 and an end of the rate
            # range: the intercept (at the highest rate) or intercept + rate term (the lowest).
            # A steep rate term from one costly low-rate run can carry the intercept below 0
            # (a quick profile's carried gRPC: −1.6 CPU-µs at 100 B and its highest rate)
            p = dict(zip(names, beta))
            a, d = p.get("a", 0.0), p.get("d", 0.0)
            if floor and "a" in names and a < 0:
                held.append(f"intercept {a:.3g}")
                j = names.index("a")
            elif floor and "d" in names and a + d * span < 0:
                held.append(f"rate term {d:.3g}")
                j = names.index("d")
            else:
                break
            del cols[j], names[j]
        if "d" not in names:
            r_lo = r_hi = None
        if held:
            note = (note + "; term(s) fitted below 0 held at 0: " + ", ".join(held)).lstrip("; ")
        fitted = X @ beta
        resid = y - fitted
        n, p = X.shape
        ss_tot = float(np.sum((y - y.mean()) ** 2))
        ss_res = float(np.sum(resid**2))
        r2 = None if ss_tot == 0.0 else 1.0 - ss_res / ss_tot
        se: list[float | None] = [None] * len(PARAMS)
        cov_full: tuple[tuple[float, ...], ...] | None = None
        if n > p:
            sigma2 = ss_res / (n - p)
            cov = sigma2 * np.linalg.pinv(X.T @ X)
            full = np.zeros((len(PARAMS), len(PARAMS)))
            idx = [PARAMS.index(k) for k in names]
            full[np.ix_(idx, idx)] = cov
            cov_full = tuple(tuple(float(x) for x in row) for row in full)
            for j, k in enumerate(names):
                se[PARAMS.index(k)] = math.sqrt(max(float(cov[j, j]), 0.0))
        params = dict(zip(names, (float(v) for v in beta)))
        return cls(
            intercept=params.get("a", 0.0),
            slope=params.get("b", 0.0),
            split_bytes=split_bytes,
            per_unit=params.get("u", 0.0),
            rate_coef=params.get("d", 0.0),
            rate_lo=r_lo,
            rate_hi=r_hi,
            stats=FitStats(
                n=n, r2=r2, residuals=tuple(float(x) for x in resid), stderr=tuple(se), cov=cov_full
            ),
            samples=Samples(
                tuple(float(x) for x in s),
                tuple(float(x) for x in y),
                None if r is None else tuple(float(x) for x in r),
            ),
            note=note,
        )

    def _rate_x(self, rates: npt.ArrayLike | None, shape: tuple[int, ...]) -> FloatArray:
        """``ln(r_hi / r)`` with ``r`` clamped into the profiled range (0 without a rate term)."""
        if rates is None or self.rate_lo is None or self.rate_hi is None:
            return np.zeros(shape)
        r = np.clip(
            np.broadcast_to(np.asarray(rates, dtype=np.float64), shape), self.rate_lo, self.rate_hi
        )
        return np.asarray(np.log(self.rate_hi / r), dtype=np.float64)

    def predict(self, sizes: npt.ArrayLike, rates: npt.ArrayLike | None = None) -> FloatArray:
        """Cost at ``sizes`` (bytes) and ``rates`` (requests/s; None: the highest profiled rate)."""
        s = np.asarray(sizes, dtype=np.float64)
        y = self.intercept + self.slope * s + self.per_unit * extra_units(s, self.split_bytes)
        if self.rate_coef:
            y = y + self.rate_coef * self._rate_x(rates, s.shape)
        return np.asarray(y, dtype=np.float64)

    def stderr_at(self, sizes: npt.ArrayLike, rates: npt.ArrayLike | None = None) -> FloatArray:
        """Standard error of the fitted mean at ``sizes`` and ``rates`` (zeros when the fit has none)."""
        s = np.asarray(sizes, dtype=np.float64)
        if self.stats is None or self.stats.cov is None:
            return np.zeros_like(s)
        c = np.asarray(self.stats.cov)
        X = np.stack(
            [np.ones_like(s), s, extra_units(s, self.split_bytes), self._rate_x(rates, s.shape)],
            axis=-1,
        )
        X = X[..., : c.shape[0]]  # documents from before the rate term carry a 3×3 covariance
        var = np.einsum("...i,ij,...j->...", X, c, X)
        return np.asarray(np.sqrt(np.maximum(var, 0.0)), dtype=np.float64)

    # ---- transformations ---------------------------------------------------------------
    def scaled(self, factor: float) -> CostModel:
        """Every parameter times ``factor`` (a what-if speedup); fit stats are dropped."""
        return replace(
            self,
            intercept=self.intercept * factor,
            slope=self.slope * factor,
            per_unit=self.per_unit * factor,
            rate_coef=self.rate_coef * factor,
            stats=None,
            note=(self.note + f"; scaled ×{factor:g}").lstrip("; "),
        )

    # ---- serialization -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "intercept": self.intercept,
            "slope": self.slope,
            "split_bytes": self.split_bytes,
            "per_unit": self.per_unit,
            "rate_coef": self.rate_coef,
            "rate_lo": self.rate_lo,
            "rate_hi": self.rate_hi,
            "stats": None if self.stats is None else self.stats.to_dict(),
            "samples": None if self.samples is None else self.samples.to_dict(),
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CostModel:
        return cls(
            intercept=float(d.get("intercept", 0.0)),
            slope=float(d.get("slope", 0.0)),
            split_bytes=d.get("split_bytes"),
            per_unit=float(d.get("per_unit", 0.0)),
            rate_coef=float(d.get("rate_coef", 0.0)),
            rate_lo=None if d.get("rate_lo") is None else float(d["rate_lo"]),
            rate_hi=None if d.get("rate_hi") is None else float(d["rate_hi"]),
            stats=None if d.get("stats") is None else FitStats.from_dict(d["stats"]),
            samples=None if d.get("samples") is None else Samples.from_dict(d["samples"]),
            note=str(d.get("note", "")),
        )


ZERO = CostModel(note="zero")


@dataclass(frozen=True)
class ComponentModel:
    """Latency (µs per message) and CPU (CPU-µs per message) of one component."""

    latency: CostModel = field(default_factory=CostModel)
    cpu: CostModel = field(default_factory=CostModel)

    def scaled(self, factor: float) -> ComponentModel:
        return ComponentModel(self.latency.scaled(factor), self.cpu.scaled(factor))

    def to_dict(self) -> dict[str, Any]:
        return {"latency": self.latency.to_dict(), "cpu": self.cpu.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ComponentModel:
        return cls(CostModel.from_dict(d["latency"]), CostModel.from_dict(d["cpu"]))
