"""The paper's §6.2 what-if (Figures 13/14) on this machine, from measured profiles.

For each message size (a trace store imported at that size) and each variant (a profile of an
optimization measured on this machine — Unix-socket IPC, zero-copy writes, socket redirection):
the speedup of the variant over the baseline profile at that size
(:func:`~meshtax.predict.whatif.derive_speedup`, written as the speedup file ``predict`` and
``study`` take), the study of every call graph with the baseline and with that file applied
(:func:`~meshtax.study.run_study`), and the reductions of the mean latency and CPU overhead
with 95 % intervals, next to the paper's published numbers
(:func:`~meshtax.store.reference.published_whatif`).

Intervals: the delta method on the derived ratios — each component's latency and CPU ratio
has a 95 % interval from both profiles' fits (treated as independent) — through the study's
sensitivity to each ratio, taken by finite differences (every graph priced again with one
ratio moved). The call graphs are taken as given (no resampling).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import yaml

from meshtax.app.predict import load_speedup_file
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.whatif import (
    Z95,
    Derivation,
    Factor,
    Speedup,
    apply_speedup,
    derive_speedup,
    speedup_from_dict,
)
from meshtax.store.reference import published_whatif
from meshtax.store.resolve import resolve_profile
from meshtax.store.sqlite import ProfileStore
from meshtax.study import StudyConfig, predict_partition, run_study
from meshtax.testbed.host import this_host
from meshtax.traces.store import open_store, read_partition

__all__ = ["FORMAT", "WhatifStudyOptions", "published_for", "whatif_study"]

FORMAT = "meshtax-whatif-study/1"
METRICS = {"latency": "latency_overhead_us", "cpu": "cpu_vcpu"}
QUANTILES = np.linspace(0.0, 1.0, 201)
STEP = 0.05  # how far one ratio is moved to read the study's sensitivity to it
#: a variant label → its entry in the paper's §6.2 numbers
PUBLISHED_KEYS = {"uds": "unix_domain_sockets", "zerocopy": "zero_copy_write"}


@dataclass(frozen=True)
class WhatifStudyOptions:
    """``stores``: message size (bytes) → a trace store imported at that size; ``base``: the
    baseline profile; ``variants``: label → the profile of one optimization (``uds``,
    ``zerocopy`` and ``sockmap`` are compared with the paper where it has numbers);
    ``mode``: the sidecar mode every service gets; ``rate``: requests/s the derived CPU ratios
    are taken at (None: each model's highest profiled rate)."""

    stores: Mapping[float, str]
    base: str
    variants: Mapping[str, str]
    out_dir: str
    mode: Mode = Mode.TCP
    rate: float | None = None
    name: str = "whatif-study"
    accept_unclosed: bool = False
    notes: Sequence[str] = field(default=())


def published_for(label: str, size: float) -> dict[str, Any] | None:
    """The paper's numbers for a variant at a size (TCP proxy, Alibaba trace), as reductions
    in percent: its headline, and what its per-size figures give (None: not published)."""
    key = PUBLISHED_KEYS.get(label)
    if key is None:
        return None
    p = published_whatif()[key]
    out: dict[str, Any] = {"source": "Zhu et al., SoCC '23, §6.2 (Figures 13/14)"}
    if "latency_overhead_reduction_pct" in p:
        out["headline_latency_pct"] = float(p["latency_overhead_reduction_pct"])
        out["headline_cpu_pct"] = float(p["cpu_overhead_reduction_pct"])
    if "summary" in p:
        out["summary"] = " ".join(str(p["summary"]).split())
    at = p.get("msg_100B" if size <= 100 else "msg_4KB" if size <= 4096 else "")
    if at:
        if "latency_saving_ms_mean" in at:
            out["latency_pct"] = (
                100 * at["latency_saving_ms_mean"] / at["latency_overhead_ms_before"]
            )
        out["cpu_pct"] = 100 * (1 - at["cpu_overhead_vcpu_after"] / at["cpu_overhead_vcpu_before"])
        out["size_label"] = "100 B" if size <= 100 else "4 KB"
    return out


def _summary(x: np.ndarray[Any, Any]) -> dict[str, Any]:
    x = x[np.isfinite(x)]
    if not x.size:
        return {"n": 0}
    return {
        "n": int(x.size),
        "mean": float(x.mean()),
        "p50": float(np.quantile(x, 0.5)),
        "p90": float(np.quantile(x, 0.9)),
        "p99": float(np.quantile(x, 0.99)),
        "quantiles": [float(v) for v in np.quantile(x, QUANTILES)],
    }


def _columns(out: Path, names: Sequence[str]) -> dict[str, np.ndarray[Any, Any]]:
    parts = sorted((out / "graphs").glob("part-*.parquet"))
    cols: dict[str, list[np.ndarray[Any, Any]]] = {n: [] for n in names}
    for p in parts:
        t = pq.read_table(p, columns=list(names))
        for n in names:
            cols[n].append(t.column(n).to_numpy().astype(np.float64))
    return {n: np.concatenate(v) if v else np.zeros(0) for n, v in cols.items()}


class _Pricer:
    """Every graph of a store, priced again in memory with another 'after' profile (the
    sensitivity runs: no files written)."""

    def __init__(self, store_dir: str, cfg: StudyConfig, base: Profile) -> None:
        st = open_store(store_dir)
        self.batches = [
            read_partition(st.dir, p.stem, st.specs, with_names=False) for p in st.partitions
        ]
        self.cfg, self.base = cfg, base

    def means(self, after: Profile) -> dict[str, float]:
        sums = dict.fromkeys(METRICS, 0.0)
        n = 0
        for b in self.batches:
            cols = predict_partition(b, [self.cfg], self.base, after)
            for k, col in METRICS.items():
                sums[k] += float(np.nansum(cols[f"{self.cfg.name}.after.{col}"]))
            n += b.n_graphs
        return {k: v / max(n, 1) for k, v in sums.items()}


def _ratio_se(d: Derivation, mode: Mode, key: str, metric: str, size: float) -> float | None:
    """The standard error of one derived ratio (from its 95 % interval's upper side: the
    lower one may be clipped at 0)."""
    for r in d.ratios:
        if (r.mode, r.component.key, r.metric, r.size) == (mode, key, metric, size):
            if r.ratio is None or r.hi is None:
                return None
            return (r.hi - r.ratio) / Z95
    return None


def _interval(
    sp: Speedup,
    d: Derivation,
    mode: Mode,
    size: float,
    point: Mapping[str, float],
    before: Mapping[str, float],
    means: Callable[[Speedup], Mapping[str, float]],
) -> tuple[dict[str, dict[str, float | None]], list[str]]:
    """Reductions of the mean overhead (%) with delta-method 95 % intervals, and notes on
    ratios that have no interval."""
    var = dict.fromkeys(METRICS, 0.0)
    notes: list[str] = []
    factors = dict(sp.for_mode(mode))
    for key, f in factors.items():
        moved = {**factors, key: Factor(f.latency + STEP, f.cpu + STEP)}
        m = means(Speedup(sp.name, {}, {}, {mode: moved}))
        for metric in METRICS:
            se = _ratio_se(d, mode, key, metric, size)
            if se is None:
                notes.append(f"{key} {metric} ratio has no interval (a model without samples)")
                continue
            var[metric] += ((m[metric] - point[metric]) / STEP * se) ** 2
    out: dict[str, dict[str, float | None]] = {}
    for metric in METRICS:
        b = before[metric]
        if not b > 0:
            out[metric] = {"value": None, "lo": None, "hi": None, "se": None}
            continue
        value = 100.0 * (1.0 - point[metric] / b)
        se = 100.0 * float(np.sqrt(var[metric])) / b
        out[metric] = {"value": value, "lo": value - Z95 * se, "hi": value + Z95 * se, "se": se}
    return out, notes


def _variant(
    label: str,
    base: Profile,
    variant: Profile,
    size: float,
    store_dir: str,
    opts: WhatifStudyOptions,
    out: Path,
) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
    """One variant at one size: its derived speedup file, the study with it, the reductions."""
    d = derive_speedup(base, variant, (size,), opts.rate)
    path = out / f"speedup-{label}-{size:g}B.yaml"
    path.write_text(yaml.safe_dump(d.document(name=f"{label}-{size:g}B"), sort_keys=False))
    written = load_speedup_file(str(path))
    # the file, as study reads it; a variant equal to its base at every component changes nothing
    changes = written.get("modes") or written.get("scale")
    sp = speedup_from_dict(written, str(path)) if changes else Speedup(f"{label}-{size:g}B")
    after, warns = apply_speedup(base, sp)
    cfg = StudyConfig(opts.mode.value, SidecarConfig(opts.mode))
    study_out = out / f"study-{label}-{size:g}B"
    summ = run_study(store_dir, [cfg], base, study_out, speedup_profile=after, progress=False)
    names = [f"{cfg.name}{s}.{c}" for s in ("", ".after") for c in METRICS.values()]
    cols = _columns(study_out, names)
    before = {k: float(np.nanmean(cols[f"{cfg.name}.{c}"])) for k, c in METRICS.items()}
    point = {k: float(np.nanmean(cols[f"{cfg.name}.after.{c}"])) for k, c in METRICS.items()}
    pricer = _Pricer(store_dir, cfg, base)

    def means(s: Speedup) -> Mapping[str, float]:
        return pricer.means(apply_speedup(base, s)[0])

    reduction, notes = _interval(sp, d, opts.mode, size, point, before, means)
    doc = {
        "label": label,
        "profile": variant.name,
        "platform": variant.platform.describe(),
        "speedup_file": str(path),
        "study_dir": str(study_out),
        "factors": {
            k: {"latency": f.latency, "cpu": f.cpu} for k, f in sp.for_mode(opts.mode).items()
        },
        "ratios": [r.to_dict() for r in d.ratios],
        **{c: _summary(cols[f"{cfg.name}.after.{c}"]) for c in METRICS.values()},
        "reduction_pct": reduction,
        "per_graph_reduction_pct_p50": {
            k: summ.whatif[cfg.name].get(f"{c}.reduction_pct_p50") for k, c in METRICS.items()
        },
        "published": published_for(label, size),
        "warnings": list(warns),
        "notes": list(dict.fromkeys([*d.notes, *notes])),
    }
    return doc, {c: cols[f"{cfg.name}.{c}"] for c in METRICS.values()}


def whatif_study(
    opts: WhatifStudyOptions, store: ProfileStore, say: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run the what-if study (see the module docstring); writes the speedup files, one study
    directory per size and variant, and ``whatif-study.json`` (returned) in ``out_dir``."""
    host = this_host()
    base = resolve_profile(store, opts.base, host, accept_unclosed=opts.accept_unclosed)
    variants = {
        k: resolve_profile(store, v, host, accept_unclosed=opts.accept_unclosed)
        for k, v in opts.variants.items()
    }
    out = Path(opts.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sizes = []
    for size, store_dir in sorted(opts.stores.items()):
        st = open_store(store_dir)
        entry: dict[str, Any] = {
            "size": float(size),
            "store": str(store_dir),
            "graphs": st.n_graphs,
            "calls": st.n_rows,
            "variants": [],
        }
        for label, v in variants.items():
            if say:
                say(f"{label} at {size:g} B")
            doc, before = _variant(
                label, base.profile, v.profile, float(size), store_dir, opts, out
            )
            entry.setdefault("baseline", {c: _summary(x) for c, x in before.items()})
            entry["variants"].append(doc)
        sizes.append(entry)
    doc = {
        "format": FORMAT,
        "name": opts.name,
        "base_profile": base.profile.name,
        "platform": base.profile.platform.describe(),
        "mode": opts.mode.value,
        "rate": opts.rate,
        "interval": (
            "95 %, delta method on the derived per-component ratios (independent), through "
            f"the study's finite-difference sensitivity to each ratio (step {STEP}); graphs "
            "taken as given"
        ),
        "warnings": list(
            dict.fromkeys([*base.warnings, *(w for v in variants.values() for w in v.warnings)])
        ),
        "notes": list(opts.notes),
        "sizes": sizes,
    }
    (out / "whatif-study.json").write_text(json.dumps(doc, indent=1))
    return doc
