"""Per-size measurements → cost models and closure (pure).

For every component of a mode, latency is fitted over sizes (one value per size, from the
probe window) and CPU over sizes and rates (one value per size and rate). A split size is
chosen among candidates only when it explains the samples clearly better than a straight
line (:func:`choose_split`). Closure compares, averaged over the measured sizes, the sum of
component latencies with the directly measured overhead (with sidecar − without).
:func:`fit_carried` fits a mode's models measured with an application protocol on the wire
(``ModeProfile.carried``) the same way. Low-rate CPU runs are ordinary CPU points with their
rates; :meth:`CostModel.fit` decides what the rates explain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from meshtax.model.components import BASE_COMPONENTS, Component
from meshtax.model.costmodel import ComponentModel, CostModel, extra_units
from meshtax.model.profile import Closure, ModeProfile
from meshtax.model.sidecar import Mode

__all__ = [
    "MIN_SPLIT_GAIN",
    "SizePoint",
    "choose_split",
    "closure",
    "fit_carried",
    "fit_mode",
    "fit_model",
]

#: a split must remove at least this share of the straight line's squared residuals
MIN_SPLIT_GAIN = 0.5


@dataclass(frozen=True)
class SizePoint:
    """Everything measured for one mode at one size, per crossing.

    ``latency``: µs per component (probe window). ``cpu``: (rate in requests/s, CPU-µs per
    component) per fixed-rate run. ``overhead_*``: measured latency overhead and its 95 %
    interval.
    """

    size: int
    latency: Mapping[Component, float]
    overhead_us: float
    overhead_lo_us: float
    overhead_hi_us: float
    cpu: tuple[tuple[float, Mapping[Component, float]], ...] = field(default=())

    @property
    def components_us(self) -> float:
        return float(sum(self.latency.values()))


def _ssr(model: CostModel) -> float:
    assert model.stats is not None
    return float(sum(r * r for r in model.stats.residuals))


def choose_split(
    sizes: Sequence[float],
    values: Sequence[float],
    candidates: Sequence[int],
    min_gain: float = MIN_SPLIT_GAIN,
) -> int | None:
    """The candidate split size whose model fits best, if it cuts the straight line's squared
    residuals by at least ``min_gain``; else None.

    A candidate is considered only if the samples can identify it: at least three distinct
    sizes, at least two distinct unit counts, and more samples than parameters.
    """
    s = np.asarray(sizes, dtype=np.float64)
    line = CostModel.fit(s, values)
    base = _ssr(line)
    if base == 0.0:
        return None
    best: tuple[float, int] | None = None
    for c in sorted(set(candidates)):
        xu = extra_units(s, c)
        if np.unique(s).size < 3 or np.unique(xu).size < 2 or s.size <= 3:
            continue
        ssr = _ssr(CostModel.fit(s, values, split_bytes=c))
        if ssr <= (1.0 - min_gain) * base and (best is None or ssr < best[0]):
            best = (ssr, c)
    return None if best is None else best[1]


def fit_model(
    sizes: Sequence[float],
    values: Sequence[float],
    *,
    rates: Sequence[float] | None = None,
    candidates: Sequence[int] = (),
    note: str = "",
) -> CostModel:
    """:meth:`CostModel.fit` with the split chosen by :func:`choose_split`."""
    split = choose_split(sizes, values, candidates) if candidates else None
    return CostModel.fit(sizes, values, split_bytes=split, rates=rates, note=note)


def closure(points: Sequence[SizePoint], tolerance: float) -> Closure:
    """Mean over sizes of measured overhead (with its interval) vs mean component sum."""
    if not points:
        raise ValueError("closure of no points")
    n = len(points)
    return Closure(
        measured_us=sum(p.overhead_us for p in points) / n,
        measured_lo_us=sum(p.overhead_lo_us for p in points) / n,
        measured_hi_us=sum(p.overhead_hi_us for p in points) / n,
        components_us=sum(p.components_us for p in points) / n,
        tolerance=tolerance,
    )


def fit_mode(
    mode: Mode,
    points: Sequence[SizePoint],
    *,
    candidates: Sequence[int] = (),
    tolerance: float = 0.15,
) -> ModeProfile:
    """Latency and CPU models of every component seen in ``points``, and the closure."""
    if not points:
        raise ValueError(f"{mode.value}: no measurements to fit")
    comps: set[Component] = set(BASE_COMPONENTS)
    for p in points:
        comps.update(p.latency)
        for _, c in p.cpu:
            comps.update(c)
    models: dict[Component, ComponentModel] = {}
    for comp in sorted(comps):
        lat_s = [float(p.size) for p in points]
        lat_v = [float(p.latency.get(comp, 0.0)) for p in points]
        latency = fit_model(
            lat_s, lat_v, candidates=candidates, note="µs per message, probe window"
        )
        cpu_s = [float(p.size) for p in points for _ in p.cpu]
        cpu_r = [float(r) for p in points for r, _ in p.cpu]
        cpu_v = [float(c.get(comp, 0.0)) for p in points for _, c in p.cpu]
        if cpu_v:
            cpu = fit_model(
                cpu_s,
                cpu_v,
                rates=cpu_r,
                candidates=candidates,
                note="CPU-µs per message, perf cpu-clock",
            )
        else:
            cpu = CostModel(note="CPU not measured")
        models[comp] = ComponentModel(latency=latency, cpu=cpu)
    return ModeProfile(mode=mode, components=models, closure=closure(points, tolerance))


def fit_carried(
    base: ModeProfile,
    carried: Mapping[str, Sequence[SizePoint]],
    *,
    candidates: Sequence[int] = (),
    tolerance: float = 0.15,
) -> ModeProfile:
    """``base`` with ``carried[protocol]`` fitted (:func:`fit_mode`, same mode, components and
    units) from each protocol's points; protocols without points are left out, models
    ``base`` already carries for other protocols are kept."""
    fitted = {
        p: fit_mode(base.mode, pts, candidates=candidates, tolerance=tolerance)
        for p, pts in carried.items()
        if pts
    }
    return replace(base, carried={**base.carried, **fitted})
