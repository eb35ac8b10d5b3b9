"""Co-location calibration (``meshtax calibrate``): how warm is a sidecar among many on shared CPUs?

The engine prices a message through a sidecar whose pod shares CPUs at
``r_own^(1−α) · r_eff^α`` (:func:`meshtax.predict.shared_cpu.priced_rates`): ``r_eff``, the
one-hop rate that loads the CPU alike, says how busy the CPU is; ``r_own``, the sidecar's
own rate (all its calls), how often its own code and data come back into the caches. ``α`` is measured
here per sidecar mode (a tcp proxy's working set is not an HTTP/2 codec's), on the validation
harness: chains of 1, 2, 4 and 8 services (``app/topologies/chain.yaml``, speaking what the
mode parses) deployed without and with sidecars on the profile's placement, at one request
rate. The fit takes the error ln(measured / predicted(α)) of every chain relative to the one-service
chain's (which shares the profile's setting, so a drift of the machine since the profile
cancels) and picks the ``α`` in [0, 1] that makes them smallest in least squares. Its 95 %
interval comes from resampling each chain's paired runs (bootstrap).

The chains are not the validation's applications (Bookinfo, Online Boutique, Hotel
Reservation): the exponent is a property of the platform, measured once with the profile.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from meshtax.model.profile import Colocation, ColocationPoint, Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.predict.engine import predict_batch, single_profile
from meshtax.testbed.pinning import pinning_of
from meshtax.testbed.runstate import owned_tempdir
from meshtax.testbed.system import System
from meshtax.traces import SpanOptions, load_traces
from meshtax.validate.result import CaseResult, ValidationResult, cpu_differences, overheads

__all__ = ["CHAINS", "GRID", "CalibrationError", "calibrate", "fit_alpha", "colocation_of"]

FloatArray = npt.NDArray[np.float64]

#: the chain queries of ``chain.yaml``, shortest first (the first is the reference)
CHAINS = ("one", "two", "four", "eight")
#: the exponents the fit considers
GRID = np.linspace(0.0, 1.0, 101)


class ProfileSink(Protocol):
    def save(self, profile: Profile, *, replace: bool = False) -> None: ...


class CalibrationError(ValueError):
    """The calibration's runs cannot give an exponent (a failed case, no overhead measured)."""


def fit_alpha(measured: Sequence[float], predicted: FloatArray, grid: FloatArray = GRID) -> float:
    """The exponent of ``grid`` whose predictions (``predicted[i, j]``: chain ``j`` at
    ``grid[i]``) best match ``measured`` (chain ``j``), relative to chain 0: least squares of
    ln(measured/predicted) − the same for chain 0."""
    m = np.asarray(measured, dtype=np.float64)
    if m.ndim != 1 or predicted.shape != (len(grid), len(m)) or len(m) < 2:
        raise CalibrationError(
            f"need predictions of ≥ 2 chains on the grid; got {predicted.shape} for {m.shape}"
        )
    if not np.isfinite(m).all() or (m <= 0).any() or (predicted <= 0).any():
        raise CalibrationError(
            f"a chain's overhead is not positive (measured {m.round(1).tolist()}): nothing to fit"
        )
    e = np.log(m)[None, :] - np.log(predicted)
    d = e[:, 1:] - e[:, :1]
    return float(grid[int(np.argmin((d**2).sum(axis=1)))])


def colocation_of(
    cases: Sequence[CaseResult],
    predict: Callable[[CaseResult, float], float],
    mode: Mode,
    rate: float,
    *,
    n_boot: int = 400,
    seed: int = 0,
) -> Colocation:
    """Fit the exponent to measured chain cases (shortest first); ``predict(case, alpha)`` is
    the CPU-µs per request the engine predicts for that case at ``alpha``."""
    bad = [f"{c.name} {c.mode}: {c.error}" for c in cases if c.error is not None or not c.pairs]
    if bad:
        raise CalibrationError("calibration case(s) failed: " + "; ".join(bad))
    samples = [np.asarray(cpu_differences(c.pairs)) for c in cases]
    cpu = [overheads(c.pairs)["cpu"] for c in cases]  # median and 95 % interval per chain
    predicted = np.array([[predict(c, float(a)) for c in cases] for a in GRID])
    measured = [float(e.median) for e in cpu]
    alpha = fit_alpha(measured, predicted)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        mb = [float(np.median(rng.choice(s, size=len(s)))) for s in samples]
        if min(mb) > 0:
            boots.append(fit_alpha(mb, predicted))
    lo, hi = (
        (float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5)))
        if boots
        else (alpha, alpha)
    )
    k = int(np.argmin(np.abs(GRID - alpha)))
    points = tuple(
        ColocationPoint(
            len(c.sidecar_modes),
            measured[j],
            float(cpu[j].lo),
            float(cpu[j].hi),
            float(predicted[k, j]),
        )
        for j, c in enumerate(cases)
    )
    note = (
        f"chains of {', '.join(str(p.services) for p in points)} services, {mode.value} mode, {rate:g} requests/s, "
        f"{min(len(s) for s in samples)}–{max(len(s) for s in samples)} paired runs each; {len(boots)} bootstrap fits"
    )
    return Colocation(alpha, lo, hi, mode.value, rate, points, note)


def calibrate(
    system: System,
    profile: Profile,
    sink: ProfileSink,
    *,
    mode: Mode = Mode.HTTP,
    rate: float = 100.0,
    duration_s: float = 3.0,
    quick: bool = False,
    chains: Sequence[str] = CHAINS,
    keep_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[Profile, ValidationResult]:
    """Measure the chains in ``mode``, fit that mode's exponent and store it in the profile
    (replacing the profile; other modes' exponents are kept); returns the updated profile and
    the chains' validation result (predicted with the old exponent). ``keep_dir``: keep the
    chains' validation document (``chains.json``) and their traces (``traces/``) there, to
    predict them again."""
    from meshtax.validate.run import ValidateOptions, run_validation

    if len(chains) < 2:
        raise CalibrationError(
            "the calibration needs at least two chains (the first is the reference)"
        )
    traces = Path(keep_dir) / "traces" if keep_dir is not None else owned_tempdir("calibrate")
    try:
        opts = ValidateOptions(
            "chain",
            queries=tuple(chains),
            modes=(mode,),
            rate=rate,
            duration_s=duration_s,
            profile_name=profile.name,
            quick=quick,
            traces_dir=str(traces),
        )
        res = run_validation(opts, system, profile, progress)
        if keep_dir is not None:
            doc = json.dumps(res.to_document(), indent=1, default=float)
            (Path(keep_dir) / "chains.json").write_text(doc)
        batches = {}
        for c in res.cases:
            f = traces / f"{c.topology}-{c.query}-{c.mode}.json"
            if c.error is None and f.exists():
                sc = {s: SidecarConfig(Mode(m)) for s, m in c.sidecar_modes.items()}
                batches[c.query] = load_traces(
                    f, "otlp", SpanOptions(rate=c.rate, sidecars=sc)
                ).batch
    finally:
        if keep_dir is None:
            shutil.rmtree(traces, ignore_errors=True)
    pod_cpus = pinning_of(profile).pod_cpus()
    look = single_profile(profile)

    def predict(case: CaseResult, alpha: float) -> float:
        bp = predict_batch(batches[case.query], look, pod_cpus=pod_cpus, alpha=alpha)
        return float(statistics.fmean(bp.cpu_vcpu)) / case.rate * 1e6

    col = colocation_of(res.cases, predict, mode, rate)
    updated = replace(profile, colocation={**profile.colocation, mode: col})
    sink.save(updated, replace=True)
    return updated, res
