"""Large messages: the base sidecar at sizes up to 1 MiB. A straight line through the small sizes
underestimates large messages, so the split size (:func:`meshtax.profile.fit.choose_split`)
and the cost of each extra unit are fitted and added to the mode's ``other`` component (its
intercept and slope stay as profiled).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from meshtax.model.components import OTHER
from meshtax.model.costmodel import ComponentModel, CostModel, extra_units
from meshtax.model.profile import ModeProfile
from meshtax.model.sidecar import Mode
from meshtax.model.stats import median
from meshtax.profile.backends import Backends
from meshtax.profile.filters import FilterRunOptions
from meshtax.profile.fit import choose_split
from meshtax.profile.loopback import variant_envoy
from meshtax.testbed.envoy.variants import BASE, Variant, variant
from meshtax.testbed.paired import PairPolicy, paired_runs
from meshtax.testbed.pods import Testbed

__all__ = [
    "LARGE_CHECK",
    "LARGE_SIZES",
    "LargeFit",
    "LargeResult",
    "add_large",
    "fit_large",
    "measure_large",
    "n_for",
]

LARGE_SIZES = (100, 1024, 4096, 16384, 65536, 262144, 1048576)
LARGE_CHECK = (16384, 65536, 262144, 1048576)
SPLIT_CANDIDATES = (16384, 32768, 65536, 131072)
SMALL_MAX = 4096  # sizes that fit one unit whatever the split: the "paper's line" is fitted on them


def n_for(size: int, n: int) -> int:
    # about 50 MB per run at most: 1 MiB echoes take milliseconds each
    return max(20, min(n, (50 << 20) // max(size, 1)))


@dataclass(frozen=True)
class LargeResult:
    """Per request through the base sidecar (µs): worker CPU and mean latency, rounds per size."""

    mode: Mode
    cpu_us: Mapping[int, tuple[float, ...]]
    latency_us: Mapping[int, tuple[float, ...]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "cpu_us_per_request": {str(s): list(v) for s, v in self.cpu_us.items()},
            "latency_us_per_request": {str(s): list(v) for s, v in self.latency_us.items()},
        }


def measure_large(
    tb: Testbed, be: Backends, mode: Mode, sizes: Sequence[int], opts: FilterRunOptions
) -> LargeResult:
    """Per-request worker CPU and latency of the base sidecar at each size; the sizes of a
    round run in one group, its order alternating round by round."""
    cpu: dict[int, list[float]] = {s: [] for s in sizes}
    lat: dict[int, list[float]] = {s: [] for s in sizes}

    def build(ports: Sequence[int], echo: tuple[str, int], _out: Any) -> list[Variant]:
        return [variant(BASE, mode, ports[0], echo)]

    with variant_envoy(tb, be, mode, build, 1, label=f"large-{mode.value}", stdclient=True) as ve:
        for s in sizes:
            ve.load(ve.target(BASE), mode, s, max(n_for(s, opts.n) // 4, 10))
        paired = paired_runs(
            [tuple(str(s) for s in sizes)],
            lambda s: ve.run(BASE, int(s), n_for(int(s), opts.n)),
            PairPolicy.fixed(opts.rounds),
        )
    for s in sizes:
        for c, lt in paired.runs_of(str(s)):
            cpu[s].append(c)
            lat[s].append(lt)
    return LargeResult(
        mode, {s: tuple(x) for s, x in cpu.items()}, {s: tuple(x) for s, x in lat.items()}
    )


@dataclass(frozen=True)
class LargeFit:
    """The small-size line (the paper's model), the split model, and both against measurement."""

    metric: str
    line: CostModel
    split: CostModel
    measured: Mapping[int, float]  # per crossing (per request halved), medians

    def rows(self, sizes: Sequence[int] = LARGE_CHECK) -> list[dict[str, float]]:
        out = []
        for s in sizes:
            if s not in self.measured:
                continue
            m = self.measured[s]
            lp, sp = float(self.line.predict([s])[0]), float(self.split.predict([s])[0])
            out.append(
                {
                    "size": s,
                    "measured": m,
                    "line": lp,
                    "line_error": (lp - m) / m if m else float("nan"),
                    "split_model": sp,
                    "split_error": (sp - m) / m if m else float("nan"),
                }
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "line": self.line.to_dict(),
            "split": self.split.to_dict(),
            "measured_per_crossing": {str(s): v for s, v in self.measured.items()},
            "check": self.rows(),
        }


def fit_large(sizes_values: Mapping[int, Sequence[float]], metric: str) -> LargeFit:
    """Per crossing (values halved): the line through sizes ≤ 4 KiB, and the best split model
    over all sizes (``choose_split`` over 16/32/64/128 KiB; a line if no split helps)."""
    s: list[float] = []
    y: list[float] = []
    for size, vs in sorted(sizes_values.items()):
        s += [float(size)] * len(vs)
        y += [v / 2 for v in vs]
    small = [(a, b) for a, b in zip(s, y) if a <= SMALL_MAX]
    line = CostModel.fit(
        [a for a, _ in small],
        [b for _, b in small],
        note=f"{metric}: line through sizes <= {SMALL_MAX} B",
    )
    split = choose_split(s, y, SPLIT_CANDIDATES)
    model = CostModel.fit(s, y, split_bytes=split, note=f"{metric}: all sizes, split {split}")
    med = {size: median(vs) / 2 for size, vs in sizes_values.items()}
    return LargeFit(metric, line, model, med)


def add_large(mp: ModeProfile, cpu: LargeFit, lat: LargeFit) -> ModeProfile:
    """``mp`` with the large-message cost (split size and per extra unit, fitted on what the
    small-size line misses) added to its ``other`` component; everything else unchanged."""
    comps = dict(mp.components)
    base = comps.get(OTHER, ComponentModel())

    def extra(model: CostModel, fit: LargeFit) -> CostModel:
        if fit.split.split_bytes is None:
            return model
        # what the small-size line misses, per extra unit: fitted through the origin
        xs = np.asarray(fit.split.samples.sizes if fit.split.samples else (), dtype=np.float64)
        ys = np.asarray(fit.split.samples.values if fit.split.samples else (), dtype=np.float64)
        xu = extra_units(xs, fit.split.split_bytes)
        resid = ys - fit.line.predict(xs)
        u = float(xu @ resid / (xu @ xu)) if float(xu @ xu) > 0 else 0.0
        note = (
            model.note
            + f"; + {u:.3g} per extra {fit.split.split_bytes}-byte unit (large-message fit)"
        ).lstrip("; ")
        return dataclasses.replace(
            model, split_bytes=fit.split.split_bytes, per_unit=model.per_unit + u, note=note
        )

    comps[OTHER] = ComponentModel(extra(base.latency, lat), extra(base.cpu, cpu))
    return dataclasses.replace(mp, components=comps)
