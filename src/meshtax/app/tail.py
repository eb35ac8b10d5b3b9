"""Tail latency under load for ``meshtax predict --percentiles … [--sweep-rate LO:HI:N]``:
options in, the ``tail``/``tail_sweep`` parts of the prediction document out (its validation:
:mod:`meshtax.app.tail_validate`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from meshtax.errors import UsageError

if TYPE_CHECKING:
    from meshtax.model.ecg import EcgBatch
    from meshtax.model.speed import Speed
    from meshtax.predict.engine import ProfileLookup
    from meshtax.predict.tail import TailPrediction

__all__ = [
    "DEFAULT_PERCENTILES",
    "MAX_SAMPLES",
    "TailRequest",
    "parse_percentiles",
    "parse_sweep",
    "tail_parts",
]

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0, 99.9)
#: points of an automatic sweep, and its top as a share of the first saturation rate (ρ = 1)
AUTO_POINTS = 12
AUTO_TOP = 0.98
#: bounds of what a request may ask: draws per graph, sweep points, requests/s
MAX_SAMPLES = 1_000_000
MAX_POINTS = 200
MAX_RATE = 1e9


@dataclass(frozen=True)
class TailRequest:
    """What ``--percentiles``/``--sweep-rate`` and their companions ask for.

    ``sweep``: (LO, HI, N) requests/s entering the graphs (every call's rate scaled alike),
    or None; (0, 0, N) is automatic: up to just below the first saturation.
    """

    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    sweep: tuple[float, float, int] | None = None
    samples: int = 4000
    threshold: float = 0.8
    arrivals: float = 1.0
    workers: int | None = None
    app_cpu_us: float = 0.0
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_percentiles(text: str) -> tuple[float, ...]:
    """``50,90,99`` → (50.0, 90.0, 99.0)."""
    try:
        ps = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--percentiles {text!r}: expected numbers like 50,90,99,99.9") from None
    if not ps or not all(0 < p < 100 for p in ps):
        raise UsageError(f"--percentiles {text!r}: each must be within (0, 100)")
    return tuple(sorted(set(ps)))


def parse_sweep(text: str) -> tuple[float, float, int]:
    """``LO:HI:N`` (requests/s, points) or ``auto`` → (LO, HI, N); auto is (0, 0, 12)."""
    if text.strip().lower() == "auto":
        return (0.0, 0.0, AUTO_POINTS)
    parts = text.split(":")
    try:
        lo, hi, n = float(parts[0]), float(parts[1]), int(parts[2])
        if len(parts) != 3:
            raise ValueError
    except (ValueError, IndexError):
        raise UsageError(f"--sweep-rate {text!r}: expected LO:HI:N, e.g. 1000:20000:10") from None
    if not (0 < lo < hi <= MAX_RATE and 2 <= n <= MAX_POINTS):
        raise UsageError(
            f"--sweep-rate {text!r}: need 0 < LO < HI ≤ {MAX_RATE:g} and 2 ≤ N ≤ {MAX_POINTS}"
        )
    return (lo, hi, n)


def tail_parts(
    batch: EcgBatch,
    profiles: ProfileLookup,
    req: TailRequest,
    *,
    pod_cpus: int | None,
    speed: Speed | None,
    load: Literal["graphs", "pairs"],
) -> dict[str, Any]:
    """``{"tail": …}`` at the graphs' rates, and ``"tail_sweep"`` when a sweep is asked."""
    # the model imported when asked for: the options above are read by every `predict`
    import numpy as np

    from meshtax.predict.ramp_price import priced_from_ramp
    from meshtax.predict.tail import TailOptions, predict_tail, request_rate
    from meshtax.report.tail import sweep_block, tail_block

    try:
        # a topology, priced as the validation's are (shared CPUs and a ramp: the ramp's price)
        opts = TailOptions(
            percentiles=req.percentiles,
            samples=req.samples,
            seed=req.seed,
            threshold=req.threshold,
            arrivals=req.arrivals,
            workers=req.workers,
            pod_cpus=pod_cpus,
            app_cpu_us=req.app_cpu_us,
            load=load,
            speed=speed,
        )
        opts = priced_from_ramp(opts)
    except ValueError as e:
        raise UsageError(str(e)) from None
    echo = {**req.to_dict(), "pod_cpus": pod_cpus, "load": load}
    here = predict_tail(batch, profiles, opts)
    out: dict[str, Any] = {"tail": tail_block(here, batch.graph_names, echo)}
    if req.sweep is None:
        return out
    rate = request_rate(batch, load)
    if rate <= 0:
        raise UsageError("--sweep-rate: the graphs' calls have no rate to scale")
    first = here.first_to_saturate
    lo, hi, n = req.sweep
    if hi == 0:  # automatic: up to just below where the first station saturates
        if first is None or not math.isfinite(first.full_factor):
            raise UsageError("--sweep-rate auto: no sidecar ever saturates; give LO:HI:N")
        full = first.full_factor * rate
        lo, hi = full * AUTO_TOP / n, full * AUTO_TOP
    points: list[tuple[float, TailPrediction]] = []
    for r in np.linspace(lo, hi, n):
        scaled = replace(batch, rate=batch.rate * (float(r) / rate))
        points.append((float(r), predict_tail(scaled, profiles, opts)))
    full_rate = first.full_factor * rate if first is not None else math.inf
    knee = (None if first is None else first.name, here.saturation_rate, full_rate)
    out["tail_sweep"] = sweep_block(points, knee, {**echo, "threshold": req.threshold})
    return out
